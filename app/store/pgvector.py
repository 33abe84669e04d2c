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
  (`hnsw.iterative_scan = strict_order`, set for the statement's transaction only), so a
  filter, a prefix, another tenant's vectors, expired items and tombstones removed after
  the index scan do not leave the answer short. If it still comes back short (the scan's
  `hnsw.max_scan_tuples`, a deep offset), the exact statement answers instead.
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
import hashlib
import logging
import weakref
from typing import Any

import asyncpg  # type: ignore[import-untyped]  # no stubs
import numpy as np

from app.db.listener import connect_arguments
from app.store.repository import Scope, StoreRepository

HNSW_MAX_DIMS = 2000
# pgvector's operator and operator class for each of the API's metrics.
OPERATORS = {"cosine": ("<=>", "vector_cosine_ops"), "inner_product": ("<#>", "vector_ip_ops"),
             "l2": ("<->", "vector_l2_ops")}
# The most candidates an HNSW scan keeps (pgvector's limit for `hnsw.ef_search`). The setting
# `store_hnsw_ef_search` is 200 by default: pgvector's own default of 40 had recall 0.58 at
# 10,000 Gaussian 128-d vectors, and 200 had 0.94 (bench/store_hnsw.py).
MAX_EF_SEARCH = 1000

log = logging.getLogger(__name__)
# Per engine: the builds under way in this process.
_builds: weakref.WeakKeyDictionary[Any, dict[str, asyncio.Task[None]]] = \
    weakref.WeakKeyDictionary()


def index_name(index: str, dims: int, metric: str) -> str:
    """The HNSW index's name: index names are any 1-255 characters, identifiers at most 63."""
    digest = hashlib.sha256(f"{index}\x00{dims}\x00{metric}".encode()).hexdigest()[:24]
    return f"ix_store_vectors_hnsw_{digest}"


class NearestVectors:
    """The nearest vectors of one search, as `StoreRepository.vectors` yields all of them:
    (item ids, their embeddings end to end)."""

    def __init__(self, repo: StoreRepository, scope: Scope, index: str, dims: int,
                 metric: str, embedding: list[float], min_vectors: int, ef_search: int,
                 build_url: str | None) -> None:
        self.repo = repo
        self.build_url = build_url
        self.scope = scope
        self.index, self.dims, self.metric = index, dims, metric
        self.embedding = _literal(embedding)
        self.min_vectors, self.ef_search = min_vectors, ef_search
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
        count, valid = await self.repo.hnsw_state(self.index, self.dims, self.min_vectors,
                                                  self.name)
        if count < self.min_vectors:
            return False
        if not valid:
            self._build()
            return False
        return True

    def _build(self) -> None:
        """Start building the index in this process, unless it is under way here (or,
        with no URL to build on, was refused here already)."""
        builds = _builds.setdefault(self.repo.connection.engine.sync_engine, {})
        if self.name in builds and (self.build_url is None or not builds[self.name].done()):
            return
        builds[self.name] = asyncio.create_task(
            build_hnsw(self.build_url, self.name, self.index, self.dims,
                       OPERATORS[self.metric][1]))


async def build_hnsw(url: str | None, name: str, index: str, dims: int, opclass: str) -> None:
    """Build the HNSW index `name` of (index, dims) with `opclass`, a partial expression
    index, on a connection of its own to `url` (`session_url`: the session's advisory lock
    and settings must hold), outside the pool: no statement timeout, no transaction
    (CONCURRENTLY cannot run in one), writes go on meanwhile. One build at a time across
    processes (the advisory lock); an invalid index, left by a build that was stopped, is
    dropped first (one being built holds the lock, so it is not seen)."""
    if url is None:
        log.warning("store: HNSW index %s not built: AGENTSTATE_DATABASE_URL goes through a "
                    "transaction pooler; set AGENTSTATE_DIRECT_DATABASE_URL to Postgres "
                    "itself (vector searches stay exact meanwhile)", name)
        return
    quoted = "'" + index.replace("'", "''") + "'"
    ddl = (f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON store_vectors "
           f"USING hnsw ((embedding_vec::vector({int(dims)})) {opclass}) "
           f"WHERE index_name = {quoted} AND dims = {int(dims)}")
    try:
        connection = await asyncpg.connect(**connect_arguments(url))
        try:
            await connection.execute("SET statement_timeout = 0")
            # Two concurrent builds on one table deadlock (each waits for the other's
            # snapshot), and so would one waiting for a lock: they take turns, polling.
            while not await connection.fetchval(
                    "SELECT pg_try_advisory_lock(hashtext('agentstate.store_hnsw'))"):
                await asyncio.sleep(0.2)
            valid = await connection.fetchval(
                "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)", name)
            if valid:
                return
            if valid is False:
                await connection.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
            await connection.execute(ddl, timeout=None)
            log.info("store: built HNSW index %s", name)
        finally:
            await connection.close()
    except Exception:  # the search stays exact; the next one large enough tries again
        log.exception("store: building HNSW index %s failed", name)


def _literal(embedding: list[float]) -> str:
    """pgvector's text form, each component as its float32's exact repr."""
    return "[" + ",".join(repr(float(x)) for x in np.asarray(embedding, dtype=np.float32)) + "]"
