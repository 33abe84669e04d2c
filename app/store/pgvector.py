"""Vector search in SQL where the database has pgvector (issue 28): exact for small indexes,
HNSW for large ones; elsewhere `app/store/vectors.py` scores every candidate in numpy.

Where the `vector` extension exists, migration 3b8f0c6d2e51 gives `store_vectors` a stored
generated `embedding_vec` (the float32 bytes as a `vector`). A search then asks Postgres for
the nearest vectors of its scope, `ORDER BY distance LIMIT n`, and scores only those in numpy
(`vectors.scores`, so a score is the exact path's value, to the bit): the items are the
first n distinct ones by their best vector.

- Fewer than `store_hnsw_min_vectors` vectors in the tenant's index (20,000): the ordering
  expression is one no index serves, so Postgres scans the scope's vectors exactly (a few ms
  at 10,000, docs/PERFORMANCE.md), with no recall lost.
- From that size, the HNSW index of (index name, dimension, metric), a partial expression
  index `((embedding_vec::vector(d)) vector_*_ops) WHERE index_name = ... AND dims = d`,
  serves the same statement in its indexable form, with pgvector 0.8's iterative scan
  (`hnsw.iterative_scan = strict_order`, and `enable_sort` off so that statistics older
  than a bulk load cannot turn it into an exact sort: set for the statement's transaction
  only), so a filter, a prefix, another tenant's vectors, expired items and tombstones
  removed after the index scan do not leave the answer short. If it still comes back short
  (the scan's `hnsw.max_scan_tuples`, a deep offset), the exact statement answers instead.
- The index does not exist until a search of that size needs it: it is then built
  concurrently by a task of the server process (`CREATE INDEX CONCURRENTLY`, minutes at
  100,000 vectors), and searches stay exact until it is valid. A metric nobody searches
  costs no index, and no write ever waits for a build. An index left invalid (a server
  stopped mid-build) is dropped and built again.

Vectors of more than 2,000 dimensions (HNSW's limit for `vector`) are always scanned
exactly. Cosine with a zero vector: pgvector's distance is NaN; the exact statement ranks it
at similarity 0, as numpy scores it, but HNSW does not index it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg  # type: ignore[import-untyped]  # no stubs
import numpy as np

from app.core.settings import Settings
from app.db.listener import connect_arguments, session_url
from app.store.repository import PGVECTOR_COLUMN, Scope, StoreRepository

HNSW_MAX_DIMS = 2000
# pgvector's operator and operator class for each of the API's metrics.
OPERATORS = {"cosine": ("<=>", "vector_cosine_ops"), "inner_product": ("<#>", "vector_ip_ops"),
             "l2": ("<->", "vector_l2_ops")}
# The most candidates an HNSW scan keeps (pgvector's limit for `hnsw.ef_search`). The setting
# `store_hnsw_ef_search` is 200 by default: pgvector's own default of 40 had recall 0.58 at
# 10,000 Gaussian 128-d vectors, and 200 had 0.94 (bench/store_hnsw.py).
MAX_EF_SEARCH = 1000
# pgvector's build parameters where an index's `reloptions` does not name them.
DEFAULT_OPTIONS = {"m": 16, "ef_construction": 64}
REBUILD = "_new"  # the suffix of an index `agentstate reindex` is building
PROGRESS_S = 5.0  # how often `agentstate reindex` reports a build's progress

log = logging.getLogger(__name__)
# Per engine: the builds under way in this process.
_builds: weakref.WeakKeyDictionary[Any, dict[str, asyncio.Task[None]]] = \
    weakref.WeakKeyDictionary()
# Per engine: the indexes built with other parameters than the settings' already logged.
_told: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def index_name(index: str, dims: int, metric: str) -> str:
    """The HNSW index's name: index names are any 1-255 characters, identifiers at most 63."""
    digest = hashlib.sha256(f"{index}\x00{dims}\x00{metric}".encode()).hexdigest()[:24]
    return f"ix_store_vectors_hnsw_{digest}"


def build_options(settings: Settings) -> dict[str, int]:
    """The parameters an HNSW index is built with (`WITH (...)`), by their pgvector names."""
    return {"m": settings.store_hnsw_m, "ef_construction": settings.store_hnsw_ef_construction}


def built_options(reloptions: list[str] | None) -> dict[str, int]:
    """An index's parameters from `pg_class.reloptions`; pgvector's defaults where unset
    (an index built before they were settings)."""
    options = dict(DEFAULT_OPTIONS)
    for option in reloptions or ():
        name, _, value = option.partition("=")
        if name in options:
            options[name] = int(value)
    return options


def describe(options: dict[str, int]) -> str:
    return ", ".join(f"{name} {value}" for name, value in options.items())


class NearestVectors:
    """The nearest vectors of one search, as `StoreRepository.vectors` yields all of them:
    (item ids, their embeddings end to end)."""

    def __init__(self, repo: StoreRepository, scope: Scope, index: str, dims: int,
                 metric: str, embedding: list[float], settings: Settings) -> None:
        self.repo = repo
        self.build_url = session_url(settings)
        self.scope = scope
        self.index, self.dims, self.metric = index, dims, metric
        self.embedding = _literal(embedding)
        self.min_vectors, self.ef_search = (settings.store_hnsw_min_vectors,
                                            settings.store_hnsw_ef_search)
        self.options = build_options(settings)
        self.name = index_name(index, dims, metric)

    async def nearest(self, n: int) -> list[tuple[list[int], bytes]]:
        """The vectors of the first `n` distinct items by their best vector (all of them when
        the scope has fewer), nearest first."""
        # Deeper than an HNSW scan's candidates (ef_search at most 1,000): exact.
        approximate = n <= MAX_EF_SEARCH and await self._use_hnsw()
        limit = n
        while True:
            rows = await self.repo.nearest_vectors(
                self.scope, self.index, self.dims, OPERATORS[self.metric][0], self.embedding,
                limit, max(self.ef_search, min(limit, MAX_EF_SEARCH)) if approximate else None)
            if len(rows) < limit and approximate:
                # Short (the scan's hnsw.max_scan_tuples, or fewer candidates): the exact
                # statement knows which.
                log.debug("store: HNSW scan of %s short (%d of %d rows): exact", self.name,
                          len(rows), limit)
                approximate = False
                continue
            if len({item for item, _ in rows}) >= n or len(rows) < limit:
                return [([item for item, _ in rows], b"".join(blob for _, blob in rows))]
            limit *= 4  # items with several fields in the index: more vectors

    async def _use_hnsw(self) -> bool:
        if self.dims > HNSW_MAX_DIMS:
            return False
        # The index, or while `agentstate reindex` swaps it, its rebuilt one.
        count, valid, reloptions = await self.repo.hnsw_state(
            self.index, self.dims, self.min_vectors, (self.name, self.name + REBUILD))
        if count < self.min_vectors:
            return False
        if not valid:
            self._build()
            return False
        built = built_options(reloptions)
        told = _told.setdefault(self._engine(), set())
        if built != self.options and self.name not in told:
            told.add(self.name)
            log.warning("store: HNSW index %s (index %r, %d-d, %s) was built with %s, not the "
                        "settings' %s; searches use it as it is until `agentstate reindex` "
                        "rebuilds it", self.name, self.index, self.dims, self.metric,
                        describe(built), describe(self.options))
        return True

    def _engine(self) -> Any:
        return self.repo.connection.engine.sync_engine

    def _build(self) -> None:
        """Start building the index in this process, unless it is under way here (or,
        with no URL to build on, was refused here already)."""
        builds = _builds.setdefault(self._engine(), {})
        if self.name in builds and (self.build_url is None or not builds[self.name].done()):
            return
        builds[self.name] = asyncio.create_task(
            build_hnsw(self.build_url, self.name, self.index, self.dims, self.metric,
                       self.options))


def _ddl(name: str, index: str, dims: int, metric: str, options: dict[str, int]) -> str:
    quoted = "'" + index.replace("'", "''") + "'"
    return (f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON store_vectors "
            f"USING hnsw ((embedding_vec::vector({int(dims)})) {OPERATORS[metric][1]}) "
            f"WITH ({', '.join(f'{k} = {int(v)}' for k, v in options.items())}) "
            f"WHERE index_name = {quoted} AND dims = {int(dims)}")


@contextlib.asynccontextmanager
async def _connection(url: str) -> AsyncIterator[Any]:
    """A connection of its own to `url`, outside the pool, with no statement timeout."""
    connection = await asyncpg.connect(**connect_arguments(url))
    try:
        await connection.execute("SET statement_timeout = 0")
        yield connection
    finally:
        await connection.close()


@contextlib.asynccontextmanager
async def _builder(url: str, report: Callable[[str], None] | None = None
                   ) -> AsyncIterator[Any]:
    """`_connection(url)` holding the build lock: one build or rebuild at a time across
    processes (two concurrent builds on one table deadlock, each waiting for the other's
    snapshot, and so would one waiting for a lock: they take turns, polling). `report`
    is told once when it has to wait."""
    async with _connection(url) as connection:
        while not await connection.fetchval(
                "SELECT pg_try_advisory_lock(hashtext('agentstate.store_hnsw'))"):
            if report is not None:
                report("waiting for an HNSW build under way (a server's, or another "
                       "reindex) to finish ...")
                report = None
            await asyncio.sleep(0.2)
        yield connection


async def _validity(connection: Any, name: str) -> bool | None:
    return await connection.fetchval(  # type: ignore[no-any-return]
        "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)", name)


async def build_hnsw(url: str | None, name: str, index: str, dims: int, metric: str,
                     options: dict[str, int]) -> None:
    """Build the HNSW index `name` of (index, dims, metric) with `options`, a partial
    expression index, on a connection of its own to `url` (`session_url`: the session's
    advisory lock and settings must hold), outside the pool: no statement timeout, no
    transaction (CONCURRENTLY cannot run in one), writes go on meanwhile. An invalid
    index, left by a build that was stopped, is dropped first (one being built holds the
    lock, so it is not seen)."""
    if url is None:
        log.warning("store: HNSW index %s not built: AGENTSTATE_DATABASE_URL goes through a "
                    "transaction pooler; set AGENTSTATE_DIRECT_DATABASE_URL to Postgres "
                    "itself (vector searches stay exact meanwhile)", name)
        return
    try:
        async with _builder(url) as connection:
            valid = await _validity(connection, name)
            if valid:
                return
            if valid is False:
                await connection.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
            await connection.execute(_ddl(name, index, dims, metric, options), timeout=None)
            log.info("store: built HNSW index %s (%s)", name, describe(options))
    except Exception:  # the search stays exact; the next one large enough tries again
        log.exception("store: building HNSW index %s failed", name)


async def reindex(url: str, options: dict[str, int], *, dry_run: bool,
                  report: Callable[[str], None]) -> list[dict[str, Any]] | None:
    """Rebuild every HNSW index of the store built with other parameters than `options`
    (only find them with `dry_run`); each rebuilt under a name of its own, concurrently,
    then swapped in (DROP INDEX CONCURRENTLY, RENAME), so searches use the old index until
    the new one is valid. On a connection to `url` holding the build lock (a server's
    build waits meanwhile); `report(line)` tells each step and the build's progress.
    Answers what it found, one record per index; None where the database has no pgvector
    column (SQLite, no `vector` extension, no schema)."""
    async with (_connection(url) if dry_run else _builder(url, report)) as connection:
        if not await connection.fetchval(PGVECTOR_COLUMN):
            return None
        if not dry_run:
            await _finish_swaps(connection, report)
        families = {index_name(row["index_name"], row["dims"], metric):
                    (row["index_name"], row["dims"], metric)
                    for row in await connection.fetch(
                        "SELECT DISTINCT index_name, dims FROM store_vectors")
                    for metric in OPERATORS}
        found = []
        for row in await connection.fetch(
                "SELECT c.relname, c.reloptions FROM pg_index i "
                "JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indisvalid "
                rf"AND c.relname LIKE 'ix\_store\_vectors\_hnsw\_%' "
                f"AND c.relname NOT LIKE '%{REBUILD}' ORDER BY c.relname"):
            name, built = row["relname"], built_options(row["reloptions"])
            if built == options or name not in families:
                continue  # as asked, or of vectors no longer stored (it is empty)
            index, dims, metric = families[name]
            found.append({"name": name, "index": index, "dims": dims, "metric": metric,
                          "built_with": built, "rebuilt": False})
            if dry_run:
                continue
            report(f"rebuilding {name} (index {index!r}, {dims}-d, {metric}): "
                   f"{describe(built)} -> {describe(options)}")
            vectors = await connection.fetchval(
                "SELECT count(*) FROM store_vectors WHERE index_name = $1 AND dims = $2",
                index, dims)
            await _rebuild(connection, url, _ddl(name + REBUILD, index, dims, metric, options),
                           vectors, report)
            await _swap(connection, name)
            found[-1]["rebuilt"] = True
        return found


async def _rebuild(connection: Any, url: str, ddl: str, vectors: int,
                   report: Callable[[str], None]) -> None:
    """Run `ddl` on `connection`, an index of `vectors` vectors, reporting its progress
    (Postgres's `pg_stat_progress_create_index`, read on a second connection) every
    PROGRESS_S."""
    started = time.monotonic()
    build = asyncio.create_task(connection.execute(ddl, timeout=None))
    async with _connection(url) as watcher:
        pid = connection.get_server_pid()
        while not build.done():
            await asyncio.wait([build], timeout=PROGRESS_S)
            row = await watcher.fetchrow(
                "SELECT phase, tuples_done FROM pg_stat_progress_create_index WHERE pid = $1",
                pid)
            if row is not None and not build.done():
                done = (f": {row['tuples_done']:,} of {vectors:,} vectors"
                        if row["tuples_done"] else "")
                report(f"  {row['phase']}{done}, {time.monotonic() - started:.0f} s")
    await build
    report(f"  built in {time.monotonic() - started:.1f} s")


async def _swap(connection: Any, name: str) -> None:
    """Put the rebuilt `name` + REBUILD in the place of `name`."""
    await connection.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
    await connection.execute(f"ALTER INDEX {name}{REBUILD} RENAME TO {name}")


async def _finish_swaps(connection: Any, report: Callable[[str], None]) -> None:
    """What a stopped run left: a rebuilt index it had not swapped in yet is (valid, where
    the old one was dropped), else it is dropped."""
    for row in await connection.fetch(
            "SELECT c.relname, i.indisvalid FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid "
            rf"WHERE c.relname LIKE 'ix\_store\_vectors\_hnsw\_%{REBUILD}'"):
        name = row["relname"].removesuffix(REBUILD)
        if row["indisvalid"] and await _validity(connection, name) is None:
            report(f"swapping in {name}, rebuilt by a run that was stopped")
            await _swap(connection, name)
        else:
            await connection.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {row['relname']}")


def _literal(embedding: list[float]) -> str:
    """pgvector's text form, each component as its float32's exact repr."""
    return "[" + ",".join(repr(float(x)) for x in np.asarray(embedding, dtype=np.float32)) + "]"
