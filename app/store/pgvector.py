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
import contextlib
import hashlib
import logging
import weakref
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from sqlalchemy import Float, and_, bindparam, cast, func, literal, literal_column, select, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.types import UserDefinedType

from app.store.repository import Scope, StoreRepository, prefix_condition, si, sv

log = logging.getLogger(__name__)

HNSW_MAX_DIMS = 2000
# pgvector's operator and operator class for each of the API's metrics.
OPERATORS = {"cosine": ("<=>", "vector_cosine_ops"), "inner_product": ("<#>", "vector_ip_ops"),
             "l2": ("<->", "vector_l2_ops")}
# The candidates an HNSW scan keeps (pgvector's default is 40: recall 0.58 at 10,000 Gaussian
# 128-d vectors, 0.94 at 200; bench/store_hnsw.py). At most 1,000.
EF_SEARCH = 200
MAX_EF_SEARCH = 1000

# Per engine: whether its database has `embedding_vec`, and the builds under way.
_capable: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
_builds: weakref.WeakKeyDictionary[Any, dict[str, asyncio.Task[None]]] = \
    weakref.WeakKeyDictionary()


class Vector(UserDefinedType[Any]):
    cache_ok = True

    def __init__(self, dims: int) -> None:
        self.dims = dims

    def get_col_spec(self, **_kw: Any) -> str:
        return f"vector({self.dims})"


def index_name(index: str, dims: int, metric: str) -> str:
    """The HNSW index's name: index names are any 1-255 characters, identifiers at most 63."""
    digest = hashlib.sha256(f"{index}\x00{dims}\x00{metric}".encode()).hexdigest()[:24]
    return f"ix_store_vectors_hnsw_{digest}"


async def available(connection: AsyncConnection) -> bool:
    """Whether the database has the pgvector column: asked once per engine (a server started
    before the migration added it searches exactly until it restarts)."""
    if connection.dialect.name != "postgresql":
        return False
    key = connection.engine.sync_engine
    if key not in _capable:
        _capable[key] = bool(await connection.scalar(text(
            "SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('store_vectors') "
            "AND attname = 'embedding_vec' AND NOT attisdropped")))
    return _capable[key]


def _named(value: Any, type_: Any) -> Any:
    """A constant rendered into the statement, so the planner can prove a partial index's
    predicate (a parameter would leave a generic plan unable to)."""
    return bindparam(None, value, type_=type_, literal_execute=True)


class NearestVectors:
    """The nearest vectors of one search, as `StoreRepository.vectors` yields all of them:
    (item ids, their embeddings end to end)."""

    def __init__(self, repo: StoreRepository, scope: Scope, index: str, dims: int,
                 metric: str, embedding: list[float], min_vectors: int) -> None:
        self.repo = repo
        self.connection: AsyncConnection = repo.connection
        self.scope = scope
        self.index, self.dims, self.metric = index, dims, metric
        self.embedding = embedding
        self.min_vectors = min_vectors
        self.name = index_name(index, dims, metric)

    async def nearest(self, n: int) -> list[tuple[list[int], bytes]]:
        """The vectors of the first `n` distinct items by their best vector (all of them when
        the scope has fewer), nearest first."""
        # Deeper than an HNSW scan's candidates (ef_search at most 1,000): exact.
        approximate = n <= MAX_EF_SEARCH and await self._use_hnsw()
        rows_wanted = n
        while True:
            rows = await self._fetch(rows_wanted, approximate)
            distinct = len({row[0] for row in rows})
            if len(rows) < rows_wanted and approximate:
                approximate = False  # short: the exact statement knows whether it is
                continue
            if distinct >= n or len(rows) < rows_wanted:
                return [([row[0] for row in rows], b"".join(bytes(row[1]) for row in rows))]
            rows_wanted *= 4  # items with several fields in the index: more vectors

    async def _use_hnsw(self) -> bool:
        if self.dims > HNSW_MAX_DIMS:
            return False
        count, valid = (await self.connection.execute(select(
            select(func.count()).select_from(
                select(literal(1)).where(sv.c.tenant_id == self.repo.tenant_id,
                                         sv.c.index_name == self.index, sv.c.dims == self.dims)
                .limit(self.min_vectors).subquery()).scalar_subquery(),
            select(literal_column("indisvalid")).select_from(text("pg_index"))
            .where(literal_column("indexrelid") == func.to_regclass(self.name))
            .scalar_subquery()))).one()
        if count < self.min_vectors:
            return False
        if not valid:
            self._build()
            return False
        return True

    def _distance(self, approximate: bool) -> Any:
        operator, _ = OPERATORS[self.metric]
        column = cast(literal_column("store_vectors.embedding_vec"), Vector(self.dims))
        query = cast(bindparam("pgvector_query", _literal(self.embedding)), Vector(self.dims))
        distance = column.op(operator, return_type=Float)(query)
        if approximate:
            return distance
        # Not an indexable form, so the scan is exact; a cosine NaN (a zero vector) is
        # similarity 0, as numpy scores it.
        return func.coalesce(func.nullif(distance, literal(float("nan"), Float)), 1.0) \
            if self.metric == "cosine" else distance + 0.0

    async def _fetch(self, limit: int, approximate: bool) -> list[Any]:
        joined = si.join(sv, and_(sv.c.tenant_id == si.c.tenant_id,
                                  sv.c.namespace == si.c.namespace, sv.c.key == si.c.key))
        where = [*self.scope.where, sv.c.tenant_id == self.repo.tenant_id,
                 sv.c.index_name == _named(self.index, sv.c.index_name.type),
                 sv.c.dims == _named(self.dims, sv.c.dims.type)]
        if self.scope.prefix is not None:
            where.append(prefix_condition(self.scope.prefix, sv.c.namespace))
        stmt = (select(si.c.id, sv.c.embedding).select_from(joined).where(*where)
                .order_by(self._distance(approximate)).limit(limit))
        if not approximate:
            return list((await self.connection.execute(stmt)).all())
        async with self._transaction():
            for setting, value in (("hnsw.iterative_scan", "strict_order"),
                                   ("hnsw.ef_search", str(max(EF_SEARCH, min(limit, MAX_EF_SEARCH))))):
                await self.connection.execute(
                    select(func.set_config(setting, value, True)))
            return list((await self.connection.execute(stmt)).all())

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[None]:
        """Settings local to a transaction: the request's own if it has one; a read in
        autocommit gets one of its own around the statement."""
        sync = self.connection.sync_connection
        if sync is None or sync.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
            yield
            return
        await self.connection.exec_driver_sql("BEGIN")
        try:
            yield
        except BaseException:
            await self.connection.exec_driver_sql("ROLLBACK")
            raise
        await self.connection.exec_driver_sql("COMMIT")

    def _build(self) -> None:
        """Start building the index in this process, unless it is under way here."""
        engine = self.connection.engine
        builds = _builds.setdefault(engine.sync_engine, {})
        if self.name in builds and not builds[self.name].done():
            return
        _, opclass = OPERATORS[self.metric]
        index = "'" + self.index.replace("'", "''") + "'"
        ddl = (f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {self.name} ON store_vectors "
               f"USING hnsw ((embedding_vec::vector({self.dims})) {opclass}) "
               f"WHERE index_name = {index} AND dims = {self.dims}")
        builds[self.name] = asyncio.create_task(_build(engine, self.name, ddl))


async def _build(engine: AsyncEngine, name: str, ddl: str) -> None:
    """On a connection of its own, outside the pool: no statement timeout, no transaction
    (CONCURRENTLY cannot run in one), writes go on meanwhile. One build at a time across
    processes (an advisory lock held by the session); an invalid index, left by a build that
    was stopped, is dropped first (one being built holds the lock, so it is not seen)."""
    import asyncpg  # type: ignore[import-untyped]  # no stubs

    url = engine.url.set(drivername="postgresql")
    try:
        connection = await asyncpg.connect(url.render_as_string(hide_password=False))
        try:
            await connection.execute("SET statement_timeout = 0")
            # Two concurrent builds on one table deadlock (each waits for the other's
            # snapshot), and so would one waiting for a lock: they take turns, polling.
            while not await connection.fetchval(
                    "SELECT pg_try_advisory_lock(hashtext('agentstate.store_hnsw'))"):
                await asyncio.sleep(1)
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
    """pgvector's text form, each component as its float32's shortest exact repr."""
    return "[" + ",".join(repr(float(x)) for x in np.asarray(embedding, dtype=np.float32)) + "]"
