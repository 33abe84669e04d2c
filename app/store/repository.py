"""Store items and their vectors. Every statement is scoped by tenant; revisions change only
inside SQL (`app/db/revisioned.py`). An item whose `expires_at` has passed is read as a
tombstone by every statement here, whether or not the sweeper has blanked it yet."""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache, lru_cache
from typing import Any, Literal

from sqlalchemy import (
    Boolean,
    ColumnElement,
    Float,
    Integer,
    LargeBinary,
    Numeric,
    Text,
    and_,
    bindparam,
    case,
    cast,
    column,
    delete,
    exists,
    false,
    func,
    insert,
    literal,
    literal_column,
    or_,
    select,
    text,
    union_all,
    update,
)
from sqlalchemy import table as sql_table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TSVECTOR
from sqlalchemy.types import UserDefinedType

from app.core.jsonutil import dumps
from app.db import direct
from app.db.base import AnyRow, UTCDateTime, table
from app.db.dialect import dialect_name
from app.db.revisioned import Key, RevisionedRepository
from app.events.models import Event
from app.events.repository import written_by
from app.store.filters import Condition
from app.store.models import StoreItem, StoreVector

si = table(StoreItem)
sv = table(StoreVector)
e = table(Event)
# 1 where the migration gave the store its pgvector column (app/store/pgvector.py).
PGVECTOR_COLUMN = ("SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('store_vectors') "
                   "AND attname = 'embedding_vec' AND NOT attisdropped")
CONTENT = ("value", "index_fields", "search_text", "ttl_ms", "expires_at")
# What a live item must meet for a write's one statement to go ahead (else the write is
# judged the long way, app/core/revisions.py, which says why not): nothing (`none`: only an
# absent, deleted or expired item is written), anything (`any`), a revision outside the
# `revisions` parameter (`not_in`: If-None-Match's tags); or, never creating, a live item
# (`live`: If-Match: *) at a revision inside it (`in`: If-Match's tags).
Accept = Literal["none", "any", "not_in", "live", "in"]
_SIMPLE: Any = literal_column("'simple'::regconfig")
# Postgres: the stored tsvector of `search_text`, GIN indexed (ix_store_items_search_tsv_gin),
# a generated column only the migrations know (app/db/migrate.py `include_name`).
_TSVECTOR = literal_column("store_items.search_tsv", TSVECTOR)
# SQLite: the FTS5 table the migration keeps in step with `search_text` (its rowid is the id).
_FTS = sql_table("store_items_fts", column("rowid", Integer))
_FTS_MATCH = text("store_items_fts MATCH :fts_query")
VECTOR_CHUNK = 4096
log = logging.getLogger(__name__)


class _EngineFact:
    """Something an engine's database comes to have and never loses: a "yes" is kept for
    the engine's life, a "no" for a while (monotonic seconds) before it is asked again."""

    def __init__(self) -> None:
        self._known: weakref.WeakKeyDictionary[Any, bool | float] = weakref.WeakKeyDictionary()

    def known(self, engine: Any) -> bool | None:
        """True, False while a "no" holds, None when the database is to be asked."""
        known = self._known.get(engine)
        if known is None or known is True:
            return known
        return False if time.monotonic() < known else None

    def learn(self, engine: Any, found: bool, recheck: float) -> bool:
        self._known[engine] = True if found else time.monotonic() + recheck
        return found


# Whether the database has the pgvector column (app/store/pgvector.py).
_pgvector = _EngineFact()
PGVECTOR_RECHECK_S = 60.0
# Whether Postgres has planner statistics of the store's tables (`ensure_statistics`).
_statistics = _EngineFact()
STATISTICS_RECHECK_S = 10.0
# An item's columns by name, for statements over a subquery of items (working out a
# subquery's own columns is slow in SQLAlchemy).
_BY_NAME = tuple(literal_column(c.name, c.type) for c in si.c)
_BY_NAME_RECENT: tuple[Any, ...] = (literal_column("updated_at").desc(),
                                    literal_column("id").desc())
# Lexical search ranks at most this many of the most recently updated matches
# (`StoreRepository.lexical`).
LEXICAL_CANDIDATES = 1000


def _expired(now: Any) -> ColumnElement[bool]:
    """An item whose time to live has run out at `now` (a value or a parameter)."""
    return and_(si.c.expires_at.is_not(None), si.c.expires_at <= now)


def _under(prefix: str) -> tuple[str, str, str]:
    """The namespace `prefix` and the bounds of the namespaces below it: a range on the
    (C-ordered) column, since no encoded label holds `/` (0x2F) and `0` (0x30) follows it."""
    return prefix, prefix + "/", prefix + "0"


def _under_conditions(prefix: tuple[Any, Any, Any],
                      namespace: Any = si.c.namespace) -> tuple[Any, Any]:
    """The namespace itself, and those below it (`_under`'s three, or parameters)."""
    name, above, below = prefix
    return namespace == name, and_(namespace > above, namespace < below)


def prefix_condition(prefix: str, namespace: Any = si.c.namespace) -> ColumnElement[bool]:
    """Namespaces equal to `prefix` or below it."""
    return or_(*_under_conditions(_under(prefix), namespace))


@dataclass(frozen=True)
class Scope:
    """What a search reads: live, unexpired items of the tenant meeting `conditions`, under
    the namespace `prefix` (kept apart: some statements apply it their own way).

    The conditions' values are parameters (`params`), to be sent with every statement built
    from the scope: the conditions themselves are built once per `shape` (the filter's form,
    without its values) and shared, and so is `recent`'s statement of that shape. A scope
    with conditions of its own (`also`) has no shape: its statements are built each time."""

    prefix: str | None
    conditions: tuple[Any, ...]
    params: dict[str, Any]
    shape: tuple[Any, ...] | None

    @property
    def where(self) -> list[Any]:
        if self.prefix is None:
            return list(self.conditions)
        return [*self.conditions, prefix_condition(self.prefix)]

    @property
    def under(self) -> tuple[str, str, str] | None:
        """`_under` of the prefix (None without one)."""
        return None if self.prefix is None else _under(self.prefix)

    @property
    def under_params(self) -> dict[str, str]:
        """The values of `_PARAMETERS` for the prefix (none without one)."""
        under = self.under
        return {} if under is None else dict(zip(("s_prefix", "s_above", "s_below"), under,
                                                 strict=True))

    def also(self, *conditions: Any) -> Scope:
        return Scope(self.prefix, (*self.conditions, *conditions), self.params, None)


def _shape(postgres: bool, c: Condition) -> tuple[Any, ...]:
    """What a condition's SQL depends on besides its values."""
    operand = c.value
    if c.op == "object":
        return (c.op,)
    if c.op in ("$eq", "$ne"):
        if operand is None or isinstance(operand, (dict, list)):
            return c.op, type(operand).__name__
        if postgres:
            return c.op, "scalar"  # containment of the scalar at its path
        if isinstance(operand, bool):
            return c.op, "true" if operand else "false"
        return c.op, "number" if isinstance(operand, (int, float)) else "str"
    return c.op, "str" if isinstance(operand, str) else "number"


def _values(postgres: bool, n: int, c: Condition) -> dict[str, Any]:
    """The parameters of the condition `_conditions` builds as the `n`th."""
    operand = c.value
    if postgres and c.op in ("$eq", "$ne") and operand is not None \
            and not isinstance(operand, (dict, list)):
        nested: Any = operand
        for step in reversed(c.path):
            nested = {step: nested}
        return {f"s_doc{n}": dumps(nested)}
    path: Any = list(c.path) if postgres else "$" + "".join(f'."{step}"' for step in c.path)
    if c.op == "object" or operand is None or (not postgres and isinstance(operand, bool)):
        return {f"s_path{n}": path}
    return {f"s_path{n}": path,
            f"s_value{n}": dumps(operand) if isinstance(operand, (dict, list)) else operand}


# Filters come in as many shapes as clients make: the shapes' statements are kept for the
# most recently used of them (SQLAlchemy's own compiled cache keeps 500 statements).
SHAPES = 256


@lru_cache(maxsize=SHAPES)
def _conditions(postgres: bool, shape: tuple[Any, ...]) -> tuple[Any, ...]:
    """A search's conditions, of the form `shape` (the tenant, `now` and the filter's
    conditions' `_shape`s), with their values as parameters (`_values`)."""
    live = (si.c.tenant_id == bindparam("s_tenant", type_=si.c.tenant_id.type),
            si.c.deleted_at.is_(None),
            ~_expired(bindparam("s_now", type_=UTCDateTime())))
    build = _pg_condition if postgres else _sqlite_condition
    return (and_(*live), *(build(n, *form) for n, form in enumerate(shape)))


def _pg_condition(n: int, op: str, kind: str = "") -> ColumnElement[bool]:
    doc = cast(si.c.value, JSONB)
    if kind == "scalar":
        # Containment of the scalar at its path: served by the value's GIN index. The
        # document is rendered into the statement: with a parameter, a prepared
        # statement's generic plan cannot estimate it and scans every item.
        document = bindparam(f"s_doc{n}", type_=Text, literal_execute=True)
        contains = doc.op("@>", is_comparison=True)(cast(document, JSONB))
        return contains if op == "$eq" else ~contains
    at = doc.op("#>", return_type=JSONB)(cast(bindparam(f"s_path{n}", type_=ARRAY(Text)),
                                              ARRAY(Text)))
    typeof = func.jsonb_typeof(at)
    if op == "object":
        return typeof == "object"
    if op in ("$eq", "$ne"):
        if kind == "NoneType":
            equal = or_(at.is_(None), typeof == "null")
        else:  # an object or an array
            equal = and_(at.is_not(None),
                         at == cast(bindparam(f"s_value{n}", type_=Text), JSONB))
        return equal if op == "$eq" else ~equal
    comparison = {"$gt": "__gt__", "$gte": "__ge__", "$lt": "__lt__", "$lte": "__le__"}[op]
    if kind == "str":
        subject: Any = doc.op("#>>", return_type=Text)(
            cast(bindparam(f"s_path{n}", type_=ARRAY(Text)), ARRAY(Text))).collate("C")
        wanted, bound = "string", bindparam(f"s_value{n}", type_=Text)
    else:
        subject, wanted, bound = (cast(at, Numeric), "number",
                                  bindparam(f"s_value{n}", type_=Numeric))
    return case((typeof == wanted, getattr(subject, comparison)(bound)), else_=false())


def _sqlite_condition(n: int, op: str, kind: str = "") -> ColumnElement[bool]:
    path = bindparam(f"s_path{n}", type_=Text)
    typeof = func.json_type(si.c.value, path)
    at = func.json_extract(si.c.value, path)
    if op == "object":
        return typeof == "object"
    operand: Any = bindparam(f"s_value{n}")
    if op in ("$eq", "$ne"):
        if kind == "NoneType":
            equal = or_(typeof.is_(None), typeof == "null")
        elif kind in ("true", "false"):  # as json_type names JSON's true and false
            equal = func.coalesce(typeof == kind, False)
        elif kind == "number":
            equal = func.coalesce(and_(typeof.in_(("integer", "real")), at == operand), False)
        elif kind == "str":
            equal = func.coalesce(and_(typeof == "text", at == operand), False)
        else:
            equal = func.coalesce(and_(
                typeof == ("object" if kind == "dict" else "array"),
                func.agentstate_json_equal(at, bindparam(f"s_value{n}", type_=Text)) == 1),
                False)
        return cast(equal, Boolean) if op == "$eq" else ~cast(equal, Boolean)
    comparison = {"$gt": "__gt__", "$gte": "__ge__", "$lt": "__lt__", "$lte": "__le__"}[op]
    kinds = ("text",) if kind == "str" else ("integer", "real")
    return and_(typeof.in_(kinds), getattr(at, comparison)(operand))


_ORDER_RECENT = (si.c.updated_at.desc(), si.c.id.desc())


def _recent(postgres: bool, conditions: Sequence[Any], prefix: tuple[Any, Any, Any] | None,
            limit: Any, offset: Any, part: Any, extra: tuple[Any, ...] = ()) -> Any:
    """`StoreRepository.recent`'s statement, with `extra` columns: items meeting
    `conditions`, under `prefix` (the namespace, and the bounds of those below it, as
    `_under` gives them), most recently updated first. Its numbers (and the prefix) are
    values, or parameters in a statement built once (`_recent_shaped`); `part` is
    `limit + offset`.

    On Postgres a search under a namespace prefix is the union of the namespace itself and
    the namespaces below it, each in its own order: the namespace's part walks `(tenant_id,
    namespace, updated_at, id)` and stops at `offset + limit` matches. One statement over the
    OR of both could only walk the tenant's recency index, past every newer item of other
    namespaces (Postgres cannot know a namespace's items were written together: 54 ms for a
    1% filter on 10,000 items behind 100,000 newer ones)."""
    if prefix is None:
        return (select(si, *extra).where(*conditions).order_by(*_ORDER_RECENT)
                .limit(limit).offset(offset))
    if not postgres:
        return (select(si, *extra).where(*conditions, or_(*_under_conditions(prefix)))
                .order_by(*_ORDER_RECENT).limit(limit).offset(offset))
    # Each part in parentheses with its own order and limit (a SELECT with either is
    # grouped so in a union): no subquery around it, whose columns SQLAlchemy would work
    # out on every search. The union is ordered by name for the same reason.
    parts = [select(si, *extra).where(*conditions, condition).order_by(*_ORDER_RECENT)
             .limit(part) for condition in _under_conditions(prefix)]
    return union_all(*parts).order_by(*_BY_NAME_RECENT).limit(limit).offset(offset)


_PARAMETERS = (bindparam("s_prefix", type_=Text), bindparam("s_above", type_=Text),
               bindparam("s_below", type_=Text))


@lru_cache(maxsize=SHAPES)
def _recent_shaped(postgres: bool, shape: tuple[Any, ...], prefixed: bool) -> Any:
    """`_recent` for the scopes of one shape, built once: everything is a parameter
    (`s_prefix`, `s_above`, `s_below`, `s_limit`, `s_offset`, `s_part`, and the scope's)."""
    number = {name: bindparam(name, type_=Integer) for name in ("s_limit", "s_offset", "s_part")}
    return _recent(postgres, _conditions(postgres, shape), _PARAMETERS if prefixed else None,
                   number["s_limit"], number["s_offset"], number["s_part"])


def _lexical(postgres: bool, conditions: Sequence[Any], prefix: tuple[Any, Any, Any] | None,
             candidates: Any, limit: Any) -> Any:
    """`StoreRepository.lexical`'s statement (the query's words are the parameter
    `s_words`; on SQLite `fts_query`), its numbers values or parameters as `_recent`'s."""
    if postgres:
        # Rendered into the statement (tokens are letters and digits only): with a
        # parameter a prepared statement's generic plan cannot tell a rare word from a
        # common one, and the choice between the two indexes is exactly that.
        query = func.to_tsquery(_SIMPLE, bindparam("s_words", type_=Text, literal_execute=True))
        found = _recent(True, (*conditions, _TSVECTOR.op("@@")(query)), prefix, candidates, 0,
                        candidates, extra=(_TSVECTOR.label("search_tsv"),)).subquery("candidates")
        rank: Any = func.ts_rank(literal_column("search_tsv", TSVECTOR), query)
        return (select(*_BY_NAME, rank.label("score")).select_from(found)
                .order_by(rank.desc(), *_BY_NAME_RECENT).limit(limit))
    under = () if prefix is None else (or_(*_under_conditions(prefix)),)
    matching = (select(si.c.id).select_from(si.join(_FTS, _FTS.c.rowid == si.c.id))
                .where(*conditions, *under, _FTS_MATCH).order_by(*_ORDER_RECENT)
                .limit(candidates))
    rank = -func.bm25(literal_column("store_items_fts"))
    return (select(si, rank.label("score")).select_from(si.join(_FTS, _FTS.c.rowid == si.c.id))
            .where(si.c.id.in_(matching.scalar_subquery()), _FTS_MATCH)
            .order_by(rank.desc(), *_ORDER_RECENT).limit(limit))


@lru_cache(maxsize=SHAPES)
def _lexical_shaped(postgres: bool, shape: tuple[Any, ...], prefixed: bool) -> Any:
    """`_lexical` for the scopes of one shape, built once (`s_candidates`, `s_limit`)."""
    return _lexical(postgres, _conditions(postgres, shape), _PARAMETERS if prefixed else None,
                    bindparam("s_candidates", type_=Integer), bindparam("s_limit", type_=Integer))


class StoreRepository(RevisionedRepository):
    table = si
    key_columns = ("namespace", "key")

    def __init__(self, connection: Any, tenant_id: str, now: datetime) -> None:
        super().__init__(connection, tenant_id)
        self.now = now
        self.postgres = dialect_name(connection) == "postgresql"

    def _now(self) -> Any:
        return bindparam("now", self.now, type_=UTCDateTime())

    def _live(self) -> ColumnElement[bool]:
        return and_(super()._live(), ~_expired(self._now()))

    # --- one item (RevisionedResource) --------------------------------------------------

    async def get(self, key: Key, *, lock: bool = False) -> AnyRow | None:
        """The row; an expired one reads as deleted at its expiry."""
        row: AnyRow | None = await direct.first(
            self.connection, _get_statement(lock and self.postgres),
            {"b_tenant": self.tenant_id, "b_namespace": key[0], "b_key": key[1],
             "b_now": self.now})
        return row

    def _gone(self) -> ColumnElement[bool]:
        return or_(super()._gone(), _expired(self._now()))

    async def write(self, key: Key, content: dict[str, Any], accept: Accept,
                    revisions: Sequence[int], event: tuple[str, str] | None) -> AnyRow | None:
        """A PUT in one statement: the item created, revived or replaced, with a `created`
        column; its vectors removed unless it is new (a caller adds the new ones after); on
        Postgres with `event` (actor, resource) its `store.item.created`/`updated` audit event
        written too. None when the item is there and does not meet `accept` (then nothing
        was written).

        `accept` "live" and "in" only replace a live item (If-Match); the others create when
        there is none, or revive a tombstone or an expired item (a new `created_at`, the
        revision sequence continued)."""
        params: dict[str, Any] = {"b_tenant": self.tenant_id, "b_namespace": key[0],
                                  "b_key": key[1], "b_now": self.now,
                                  **{f"c_{name}": content[name] for name in CONTENT}}
        if accept in ("in", "not_in"):
            params["b_revisions"] = list(revisions)
        if event is not None and self.postgres:
            params["b_actor"], params["b_resource"] = event
        stmt = _write_statement(self.postgres, accept, event is not None and self.postgres)
        row: AnyRow | None = await direct.first(self.connection, stmt, params)
        if row is not None and not self.postgres and row.revision > 1:
            await self.delete_vectors(key[0], key[1])
        return row

    # --- vectors ------------------------------------------------------------------------

    async def dims_of(self, index_names: Sequence[str]) -> dict[str, int]:
        """The dimension each named vector index holds in this tenant (absent: empty)."""
        found: dict[str, int] = {}
        for name in index_names:
            dims = await self.connection.scalar(
                select(sv.c.dims).where(sv.c.tenant_id == self.tenant_id,
                                       sv.c.index_name == name).limit(1))
            if dims is not None:
                found[name] = int(dims)
        return found

    async def delete_vectors(self, namespace: str, key: str,
                             fields: Sequence[tuple[str, str | None]] | None = None) -> None:
        """The item's vectors: all, or those of (index, field) pairs (field None: the whole
        index)."""
        stmt = delete(sv).where(sv.c.tenant_id == self.tenant_id, sv.c.namespace == namespace,
                               sv.c.key == key)
        if fields is not None:
            if not fields:
                return
            stmt = stmt.where(or_(*(
                sv.c.index_name == index if field is None
                else and_(sv.c.index_name == index, sv.c.field == field)
                for index, field in fields)))
        await self.connection.execute(stmt)

    async def insert_vectors(self, namespace: str, key: str,
                             rows: Sequence[tuple[str, str, int, bytes]]) -> None:
        if rows:
            await self.connection.execute(insert(sv), [
                {"tenant_id": self.tenant_id, "namespace": namespace, "key": key,
                 "index_name": index, "field": field, "dims": dims, "embedding": data}
                for index, field, dims, data in rows])

    # --- search -------------------------------------------------------------------------

    def scope(self, prefix: str | None, conditions: Sequence[Condition]) -> Scope:
        """A search's scope: live, unexpired items of the tenant under `prefix` whose value
        meets every condition."""
        shape = tuple(_shape(self.postgres, c) for c in conditions)
        params: dict[str, Any] = {"s_tenant": self.tenant_id, "s_now": self.now}
        for n, c in enumerate(conditions):
            params.update(_values(self.postgres, n, c))
        return Scope(prefix or None, _conditions(self.postgres, shape), params, shape)

    async def recent(self, scope: Scope, limit: int, offset: int) -> list[AnyRow]:
        """Matching items, most recently updated first (`_recent`)."""
        if scope.shape is None:
            stmt = _recent(self.postgres, scope.conditions, scope.under, limit, offset,
                           limit + offset)
            params = scope.params
        else:
            stmt = _recent_shaped(self.postgres, scope.shape, scope.prefix is not None)
            params = {**scope.params, **scope.under_params, "s_limit": limit,
                      "s_offset": offset, "s_part": limit + offset}
        return list((await self.connection.execute(stmt, params)).all())

    async def lexical(self, scope: Scope, words: Sequence[str],
                      limit: int) -> list[tuple[AnyRow, float]]:
        """The best `limit` items matching any of `words`, with their text rank (Postgres
        ts_rank; SQLite minus FTS5's bm25), higher first, then the most recent: ranked among
        the `LEXICAL_CANDIDATES` (or `limit`, if more) most recently updated matches.

        When no more items than that match, that is every match. When more do (a word in a
        large share of the items), the older ones are not ranked: ranking every match cost 80-130
        ms for a word in 33,000 of 100,000 items (each fetched and ranked), the candidates
        take the recency index and stop at the last one (docs/PERFORMANCE.md). Where the
        words are rare the planner reads the text index instead."""
        candidates = max(LEXICAL_CANDIDATES, limit)
        params = {**scope.params, **scope.under_params}
        params["s_words" if self.postgres else "fts_query"] = (
            " | ".join(f"'{word}'" for word in words) if self.postgres
            else " OR ".join(f'"{word}"' for word in words))
        if scope.shape is None:
            stmt = _lexical(self.postgres, scope.conditions, scope.under, candidates, limit)
        else:
            stmt = _lexical_shaped(self.postgres, scope.shape, scope.prefix is not None)
            params.update(s_candidates=candidates, s_limit=limit)
        rows = (await self.connection.execute(stmt, params)).all()
        return [(row, float(row.score)) for row in rows]

    async def vectors(self, scope: Scope, index: str,
                      dims: int) -> AsyncIterator[tuple[list[int], bytes]]:
        """The index's vectors of the matching items, a chunk at a time: (item ids, their
        embeddings end to end). One statement: a statement per chunk joined items and
        vectors again each time. Postgres sends each chunk as one row (the ids as an array,
        the embeddings as one `string_agg` of bytes: no row object per vector); reads run
        outside a transaction, where there is no server-side cursor, so the answer is held
        whole (dims * 4 bytes a candidate)."""
        joined = si.join(sv, and_(sv.c.tenant_id == si.c.tenant_id,
                                  sv.c.namespace == si.c.namespace, sv.c.key == si.c.key))
        where = [*scope.where, sv.c.tenant_id == self.tenant_id, sv.c.index_name == index,
                 sv.c.dims == dims]
        if scope.prefix is not None:
            # The join implies it; said of the vectors too, Postgres reads only the prefix's
            # vectors (their unique index) instead of every vector of the index in the tenant.
            where.append(prefix_condition(scope.prefix, sv.c.namespace))
        if self.postgres:
            # Chunks by item id (ids are dense enough: at most VECTOR_CHUNK items a chunk,
            # times their fields); both aggregates read a group's rows in the same order.
            group = si.c.id // VECTOR_CHUNK
            result = await self.connection.execute(
                select(func.array_agg(si.c.id),
                       func.string_agg(sv.c.embedding, literal(b"", LargeBinary)))
                .select_from(joined).where(*where).group_by(group), scope.params)
            for ids, blob in result:
                yield list(ids), bytes(blob)
            return
        result = await self.connection.execute(
            select(si.c.id, sv.c.embedding).select_from(joined).where(*where), scope.params)
        for rows in result.partitions(VECTOR_CHUNK):
            yield [row[0] for row in rows], b"".join(row[1] for row in rows)

    async def by_ids(self, ids: Sequence[int]) -> dict[int, AnyRow]:
        if not ids:
            return {}
        rows = (await self.connection.execute(
            select(si).where(si.c.tenant_id == self.tenant_id, si.c.id.in_(list(ids))))).all()
        return {row.id: row for row in rows}

    async def without_vectors(self, scope: Scope, index: str, limit: int,
                              offset: int) -> list[AnyRow]:
        """Matching items with no vector in the index, most recently updated first."""
        has = (select(sv.c.id).where(sv.c.tenant_id == si.c.tenant_id,
                                    sv.c.namespace == si.c.namespace, sv.c.key == si.c.key,
                                    sv.c.index_name == index).exists())
        return await self.recent(scope.also(~has), limit, offset)

    async def refresh(self, ids: Sequence[int], ttl_ms: int, expires_at: datetime) -> None:
        """Restart the time to live of live items (no new revision: it is bookkeeping)."""
        await self.connection.execute(
            update(si).where(si.c.tenant_id == self.tenant_id, si.c.id.in_(list(ids)),
                            si.c.ttl_ms == ttl_ms, self._live())
            .values(expires_at=expires_at))

    async def namespaces(self, prefix: str | None) -> list[str]:
        """The distinct namespaces of live items, under `prefix` when given."""
        where = [self._live()]
        if prefix:
            where.append(prefix_condition(prefix))
        return list((await self.connection.scalars(
            select(si.c.namespace).where(*where).distinct().order_by(si.c.namespace))).all())

    # --- pgvector (app/store/pgvector.py) -----------------------------------------------

    async def has_pgvector(self) -> bool:
        """Whether the database has `store_vectors.embedding_vec`. A "yes" is kept for the
        engine's life; a "no" for `PGVECTOR_RECHECK_S`, so a server running while
        `agentstate migrate` adds the column (pgvector installed later) uses it within a
        minute, without a restart."""
        if not self.postgres:
            return False
        engine = self.connection.engine.sync_engine
        known = _pgvector.known(engine)
        if known is not None:
            return known
        return _pgvector.learn(engine, bool(await self.connection.scalar(text(PGVECTOR_COLUMN))),
                               PGVECTOR_RECHECK_S)

    async def ensure_statistics(self) -> None:
        """Postgres plans a join over tables it has never analyzed blind: a vector search
        of 20,000 items loaded into a fresh database (autovacuum had not analyzed them yet)
        ran into the statement timeout, a 503, and took 0.1 s once they were analyzed
        (docs/operations.md). Until the store's tables have statistics, a vector search
        analyzes them first (at most every STATISTICS_RECHECK_S: an empty table gets none);
        then never again for the engine's life. A role that does not own them is skipped
        by ANALYZE with a warning, and autovacuum's statistics come in time."""
        if not self.postgres:
            return
        engine = self.connection.engine.sync_engine
        if _statistics.known(engine) is not None:
            return
        missing = text("SELECT count(DISTINCT tablename) < 2 FROM pg_stats WHERE schemaname "
                       "= current_schema() AND tablename IN ('store_items', 'store_vectors')")
        found = not await self.connection.scalar(missing)
        if not found:
            await self.connection.execute(text("ANALYZE store_items, store_vectors"))
            found = not await self.connection.scalar(missing)
            if found:
                log.info("store: analyzed store_items and store_vectors (no planner "
                         "statistics)")
        _statistics.learn(engine, found, STATISTICS_RECHECK_S)

    async def hnsw_state(self, index: str, dims: int, cap: int,
                         names: Sequence[str]) -> tuple[int, bool, list[str] | None]:
        """(the tenant's vectors in the index, counted up to `cap`; whether an HNSW index
        of `names` is valid; the `reloptions` of the first valid one)."""
        counted = select(literal(1)).where(sv.c.tenant_id == self.tenant_id,
                                           sv.c.index_name == index, sv.c.dims == dims)
        relname = literal_column("relname", Text)
        valid = (select(literal_column("reloptions", ARRAY(Text)))
                 .select_from(text("pg_index JOIN pg_class ON pg_class.oid = indexrelid"))
                 .where(relname.in_(names), literal_column("indisvalid"))
                 .order_by(relname).limit(1))
        count, found, options = (await self.connection.execute(select(
            select(func.count()).select_from(counted.limit(cap).subquery()).scalar_subquery(),
            exists(valid), valid.scalar_subquery()))).one()
        return int(count), bool(found), options

    async def nearest_vectors(self, scope: Scope, index: str, dims: int, operator: str,
                              embedding: str, limit: int,
                              ef_search: int | None) -> list[tuple[int, bytes]]:
        """(item id, embedding) of the scope's `limit` vectors nearest to `embedding`
        (pgvector's text form) by `operator`, nearest first. With `ef_search`, in the form
        the HNSW index serves, with pgvector 0.8's iterative scan (strict order: filtered
        rows do not leave the answer short); else in a form no index serves: exact."""
        column = cast(literal_column("store_vectors.embedding_vec"), _Vector(dims))
        query = cast(bindparam("pgvector_query", embedding), _Vector(dims))
        distance: Any = column.op(operator, return_type=Float)(query)
        if ef_search is None:
            # A cosine NaN (a zero vector) is similarity 0, as numpy scores it.
            distance = (func.coalesce(func.nullif(distance, literal(float("nan"), Float)), 1.0)
                        if operator == "<=>" else distance + 0.0)
        joined = si.join(sv, and_(sv.c.tenant_id == si.c.tenant_id,
                                  sv.c.namespace == si.c.namespace, sv.c.key == si.c.key))
        # Constants in the statement: the planner proves the partial index's predicate.
        where = [*scope.where, sv.c.tenant_id == self.tenant_id,
                 sv.c.index_name == bindparam(None, index, type_=sv.c.index_name.type,
                                              literal_execute=True),
                 sv.c.dims == bindparam(None, dims, type_=Integer, literal_execute=True)]
        if scope.prefix is not None:
            where.append(prefix_condition(scope.prefix, sv.c.namespace))
        stmt = (select(si.c.id, sv.c.embedding).select_from(joined).where(*where)
                .order_by(distance).limit(limit))
        if ef_search is None:
            return [(row[0], bytes(row[1]))
                    for row in await self.connection.execute(stmt, scope.params)]
        async with self._transaction():
            # The server chose HNSW from the index's size (`pgvector.NearestVectors`); the
            # planner would choose from its statistics, which miss a bulk load until the
            # table is analyzed again (the new index name reads as one row: an exact sort).
            # No sort for this transaction's statement leaves it the index's ordered scan.
            await self.connection.execute(select(
                func.set_config("hnsw.iterative_scan", "strict_order", True),
                func.set_config("hnsw.ef_search", str(ef_search), True),
                func.set_config("enable_sort", "off", True)))
            return [(row[0], bytes(row[1]))
                    for row in await self.connection.execute(stmt, scope.params)]

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


class _Vector(UserDefinedType[Any]):
    cache_ok = True

    def __init__(self, dims: int) -> None:
        self.dims = dims

    def get_col_spec(self, **_kw: Any) -> str:
        return f"vector({self.dims})"


@cache
def _write_statement(postgres: bool, accept: Accept, with_event: bool) -> Any:
    """`StoreRepository.write`'s statement, built once per shape (app/db/direct.py)."""
    now = bindparam("b_now", type_=UTCDateTime())
    address = (si.c.tenant_id == bindparam("b_tenant"),
               si.c.namespace == bindparam("b_namespace"), si.c.key == bindparam("b_key"))
    content = {name: bindparam(f"c_{name}", type_=si.c[name].type) for name in CONTENT}
    gone = or_(si.c.deleted_at.is_not(None), _expired(now))
    revisions = bindparam("b_revisions", expanding=True, type_=si.c.revision.type)
    returned = (*si.c, (si.c.created_at == now).label("created"))
    if accept in ("live", "in"):
        matching = si.c.revision.in_(revisions) if accept == "in" else literal(True)
        written: Any = (update(si).where(*address, ~gone, matching)
                        .values(revision=si.c.revision + 1, updated_at=now, **content)
                        .returning(*returned))
    else:
        live = {"none": false(), "any": literal(True),
                "not_in": si.c.revision.not_in(revisions)}[accept]
        module: Any = postgresql if postgres else sqlite
        proposed = module.insert(si).values(
            tenant_id=bindparam("b_tenant"), namespace=bindparam("b_namespace"),
            key=bindparam("b_key"), revision=1, created_at=now, updated_at=now, **content)
        written = proposed.on_conflict_do_update(
            index_elements=["tenant_id", "namespace", "key"],
            set_={"revision": si.c.revision + 1, "updated_at": now, "deleted_at": None,
                  "created_at": case((gone, now), else_=si.c.created_at),
                  **{name: proposed.excluded[name] for name in CONTENT}},
            where=or_(gone, live)).returning(*returned)
    if not postgres:
        return written
    up = written.cte("written")
    # An item written before has vectors of its old content (a tombstone's are gone, an
    # expired item's may not be): they go in the same statement.
    old_vectors = delete(sv).where(
        sv.c.tenant_id == bindparam("b_tenant"), sv.c.namespace == bindparam("b_namespace"),
        sv.c.key == bindparam("b_key"),
        exists(select(up.c.id).where(up.c.revision > 1))).cte("old_vectors")
    stmt = select(*(up.c[c.name] for c in si.c), up.c.created).add_cte(old_vectors)
    if with_event:
        # The audit event, written by the same statement.
        kind = case((up.c.created, literal("store.item.created")),
                    else_=literal("store.item.updated"))
        event = written_by(
            select(bindparam("b_tenant", type_=e.c.tenant_id.type),
                   bindparam("b_actor", type_=e.c.actor.type), kind,
                   bindparam("b_resource", type_=e.c.resource.type), up.c.revision,
                   literal(None, e.c.thread_id.type), now).select_from(up)).cte("event")
        stmt = stmt.add_cte(event)
    return stmt


@cache
def _get_statement(lock: bool) -> Any:
    """`StoreRepository.get`'s statement, built once (app/db/direct.py)."""
    now = bindparam("b_now", type_=UTCDateTime())
    expired = _expired(now)
    gone = case((and_(si.c.deleted_at.is_(None), expired), si.c.expires_at),
                else_=si.c.deleted_at).label("deleted_at")
    stmt = select(*(c for c in si.c if c.name != "deleted_at"), gone).where(
        si.c.tenant_id == bindparam("b_tenant"), si.c.namespace == bindparam("b_namespace"),
        si.c.key == bindparam("b_key"))
    return stmt.with_for_update(key_share=True) if lock else stmt
