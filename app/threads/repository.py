"""Thread rows. Every statement is scoped by tenant; revisions change only inside SQL.

Only `app/threads/aggregate.py` and the thread service use this repository: every other slice
goes through the aggregate.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from functools import cache
from typing import Any, Literal

from sqlalchemy import (
    BigInteger,
    Integer,
    Text,
    and_,
    bindparam,
    case,
    cast,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.jsonutil import dumps
from app.db import direct
from app.db.base import AnyRow, table, utcnow
from app.db.dialect import dialect_name, insert_ignoring_conflicts, json_contains_param
from app.events.models import Event
from app.events.repository import written_by
from app.threads.models import Thread, ThreadRevision
from app.threads.schemas import RENDERED_COLUMNS

t = table(Thread)
h = table(ThreadRevision)
e = table(Event)
Lock = Literal["update", "share"] | None
Expectation = Literal["any", "one", "many"]
# "all": the whole row comes back; "keys": only what a write to the thread's children needs,
# so an append never pays for the size of the thread's state; "stored": what the thread's
# representation shows, its JSON as the text stored (`render_thread`), and what a write to
# its children needs.
Returning = Literal["all", "keys", "stored"]
_KEYS = (t.c.id, t.c.thread_id, t.c.revision, t.c.last_seq, t.c.deleted_at, t.c.history_limit)


def _stored(columns: Any) -> tuple[Any, ...]:
    """The "stored" columns of `columns` (the table's, or a CTE's of its rows)."""
    return tuple(cast(columns[name], Text).label(name) if name in ("state", "metadata")
                 else columns[name]
                 for name in (*RENDERED_COLUMNS, "id", "last_seq", "deleted_at"))


_STORED = _stored(t.c)
_RETURNED = {"all": tuple(t.c), "keys": _KEYS, "stored": _STORED}

# The statements every request runs are built once per shape, with a parameter for every
# value (docs/CONVENTIONS.md, "Statements"): building and keying a statement costs about as
# much as executing it.
_KEY = and_(t.c.tenant_id == bindparam("tenant"), t.c.thread_id == bindparam("thread"))
_LIVE_PK = select(t.c.id).where(_KEY, t.c.deleted_at.is_(None))
_GET_MANY = (select(t).where(t.c.tenant_id == bindparam("tenant"),
                             t.c.thread_id.in_(bindparam("threads", expanding=True)))
             .order_by(t.c.thread_id))
_GET_MANY_LOCKED = _GET_MANY.with_for_update(key_share=True)


@cache
def _get(lock: Lock, returning: Returning) -> Any:
    stmt = select(*_RETURNED[returning]).where(_KEY)
    # "share" (FOR KEY SHARE) keeps the row from being deleted under a child insert without
    # blocking appends; "update" (FOR NO KEY UPDATE) excludes other writers.
    return stmt.with_for_update(read=lock == "share", key_share=True) if lock else stmt


def expectation(expected: Collection[int] | None) -> Expectation:
    return "any" if expected is None else "one" if len(expected) == 1 else "many"


_NOW = bindparam("now", type_=t.c.updated_at.type)
_MESSAGES = bindparam("messages", type_=t.c.last_seq.type)


@cache
def _advance(columns: tuple[str, ...], expected: Expectation, returning: Returning) -> Any:
    """UPDATE of a live thread: revision + 1, `columns` and the message counters set from
    parameters, guarded by the expected revision(s)."""
    stmt = update(t).where(_KEY, t.c.deleted_at.is_(None))
    if expected == "one":
        stmt = stmt.where(t.c.revision == bindparam("expected"))
    elif expected == "many":
        stmt = stmt.where(t.c.revision.in_(bindparam("expected", expanding=True)))
    stmt = stmt.values(
        revision=t.c.revision + 1, updated_at=_NOW,
        last_seq=t.c.last_seq + bindparam("seqs", type_=BigInteger),
        message_count=t.c.message_count + bindparam("live_delta", type_=BigInteger),
        **_new_values(columns),
    )
    return stmt.returning(*_RETURNED[returning])


def _new_values(columns: tuple[str, ...]) -> dict[str, Any]:
    """`columns` set from the parameters `new_<column>`."""
    return {name: bindparam(f"new_{name}", type_=t.c[name].type) for name in columns}


def _new_params(values: dict[str, Any]) -> dict[str, Any]:
    """The parameters `new_<column>` of `_new_values` for `values`."""
    return {f"new_{name}": value for name, value in values.items()}


@cache
def _insert(dialect: str, columns: tuple[str, ...]) -> Any:
    """A new thread at revision 1 with `columns`, nothing where the id is taken."""
    return (insert_ignoring_conflicts(dialect, t, ["tenant_id", "thread_id"])
            .values(tenant_id=bindparam("tenant"), thread_id=bindparam("thread"), revision=1,
                    created_at=_NOW, updated_at=_NOW, last_seq=_MESSAGES,
                    message_count=_MESSAGES, **_new_values(columns))
            .returning(*_STORED))


@cache
def _revive(columns: tuple[str, ...]) -> Any:
    """A tombstone started afresh with `columns` (the rest of its settings cleared)."""
    return (update(t).where(_KEY, t.c.deleted_at.is_not(None))
            .values(revision=t.c.revision + 1, created_at=_NOW, updated_at=_NOW,
                    deleted_at=None, last_seq=_MESSAGES, message_count=_MESSAGES,
                    **{"history_limit": None, "ttl_seconds": None,
                       "forked_from_thread_id": None, "forked_from_revision": None,
                       **_new_values(columns)})
            .returning(*_STORED))


def advancing(expected: Expectation) -> Any:
    """`advance`'s UPDATE (keys back, no values) for a child's one-statement write to read
    as a CTE; its parameters are `ThreadRepository.advance_params`'."""
    return _advance((), expected, "keys")


def advanced_event(advanced: Any, type: str) -> Any:
    """The CTE that writes the event `type` of the thread the CTE `advanced` (`_advance`)
    moved, at its new revision: the parameters `tenant`, `thread`, `now` of the UPDATE, and
    `actor` and `resource`."""
    return written_by(select(
        bindparam("tenant", type_=e.c.tenant_id.type), bindparam("actor", type_=e.c.actor.type),
        literal(type, e.c.type.type), bindparam("resource", type_=e.c.resource.type),
        advanced.c.revision, bindparam("thread", type_=e.c.thread_id.type),
        bindparam("now", type_=e.c.at.type)).select_from(advanced)).cte("event")


# A window of 0: the thread's whole history goes.
_FORGET_HISTORY = delete(h).where(h.c.tenant_id == bindparam("tenant"),
                                  h.c.thread_pk == bindparam("pk"))


def _newest_at_or_below(history: Any, pk: Any, oldest: Any) -> Any:
    """The newest history entry of thread `pk` at or below revision `oldest`: the floor of
    what a window starting at `oldest` keeps (it tells the state at `oldest`)."""
    return (select(func.max(history.c.revision))
            .where(history.c.tenant_id == bindparam("tenant"), history.c.thread_pk == pk,
                   history.c.revision <= oldest).scalar_subquery())


@cache
def _keep_history(postgres: bool) -> tuple[Any, ...]:
    """Copy the thread's row as its newest history entry and drop the entries the window no
    longer needs: those older than the newest one at or below `oldest` (the first revision of
    the window), which still tells the state of every revision in the window.

    On Postgres one statement (the DELETE as a CTE), so a state write pays one round trip for
    its history; on SQLite two.
    """
    mine = and_(h.c.tenant_id == bindparam("tenant"), h.c.thread_pk == bindparam("pk"))
    copy = insert(h).from_select(
        ["thread_pk", "revision", "tenant_id", "state", "metadata", "updated_at"],
        select(t.c.id, t.c.revision, t.c.tenant_id, t.c.state, t.c.metadata, t.c.updated_at)
        .where(t.c.tenant_id == bindparam("tenant"), t.c.id == bindparam("pk")),
    )
    oldest = bindparam("oldest", type_=BigInteger)
    floor: Any = _newest_at_or_below(h, bindparam("pk"), oldest)
    if postgres:
        # The CTE's DELETE does not see the row the INSERT adds, which is the floor itself
        # when the window is one revision wide.
        revision = bindparam("revision", type_=BigInteger)
        floor = func.greatest(floor, case((revision <= oldest, revision)))
        return (copy.add_cte(delete(h).where(mine, h.c.revision < floor).cte("pruned")),)
    return copy, delete(h).where(mine, h.c.revision < floor)


@cache
def _advance_keeping(columns: tuple[str, ...], expected: Expectation, with_event: bool) -> Any:
    """Postgres: `_advance` (the "stored" columns back), the new revision kept in the thread's
    history and the history pruned to its window as `_keep_history` and `_FORGET_HISTORY`
    do, and with `with_event` the write's `thread.updated` event, all in one statement
    (alone in autocommit, one round trip where a transaction of them took five). The
    window is the row's
    `history_limit`, else the server's (`window`); the CTEs read the row the UPDATE
    returns, since the statement's snapshot does not show it."""
    up = _advance(columns, expected, "all").cte("advanced")
    window = func.coalesce(up.c.history_limit, bindparam("window", type_=BigInteger))
    copy = insert(h).from_select(
        ["thread_pk", "revision", "tenant_id", "state", "metadata", "updated_at"],
        select(up.c.id, up.c.revision, up.c.tenant_id, up.c.state, up.c.metadata,
               up.c.updated_at).where(window > 0)).cte("kept")
    # The thread's key, window and floor are worked out once, in a row of their own that
    # the DELETE reads as constants: in its condition the floor would be a subquery run
    # again for every history entry, and a join on the key a scan of the tenant's history
    # (2.8 ms a write at 100 entries, `EXPLAIN ANALYZE`).
    oldest = up.c.revision - window + 1
    floor = func.greatest(_newest_at_or_below(h.alias("older"), up.c.id, oldest),
                          case((up.c.revision <= oldest, up.c.revision)))
    bounds = (select(up.c.id, window.label("window"), floor.label("floor"))
              .cte("bounds").prefix_with("MATERIALIZED"))

    def bound(column: Any) -> Any:
        return select(column).scalar_subquery()

    pruned = delete(h).where(
        h.c.tenant_id == bindparam("tenant"), h.c.thread_pk == bound(bounds.c.id),
        or_(bound(bounds.c.window) <= 0, h.c.revision < bound(bounds.c.floor))).cte("pruned")
    stmt = select(*_stored(up.c)).add_cte(copy).add_cte(pruned)
    if with_event:
        stmt = stmt.add_cte(advanced_event(up, "thread.updated"))
    return stmt


@cache
def _page(dialect: str, order_by: Literal["created_at", "updated_at"], thread_ids: bool,
          forked_from: bool, metadata: bool, updated_after: bool, after: bool) -> Any:
    """The statement of `ThreadRepository.page` for one shape of its filters, built once."""
    stmt = select(*_STORED).where(t.c.tenant_id == bindparam("tenant"), t.c.deleted_at.is_(None))
    if thread_ids:
        stmt = stmt.where(t.c.thread_id.in_(bindparam("thread_ids", expanding=True)))
    if forked_from:
        stmt = stmt.where(t.c.forked_from_thread_id == bindparam("forked_from"))
    if metadata:
        stmt = stmt.where(json_contains_param(dialect, t.c.metadata, "metadata"))
    if updated_after:
        stmt = stmt.where(t.c.updated_at > bindparam("updated_after", type_=t.c.updated_at.type))
    at = t.c[order_by]
    if after:
        moment = bindparam("after_at", type_=at.type)
        thread = bindparam("after_thread", type_=t.c.thread_id.type)
        stmt = stmt.where(or_(at < moment, and_(at == moment, t.c.thread_id < thread)))
    return (stmt.order_by(at.desc(), t.c.thread_id.desc())
            .limit(bindparam("limit", type_=Integer)))


class ThreadRepository:
    def __init__(self, connection: AsyncConnection, tenant_id: str) -> None:
        self.connection = connection
        self.tenant_id = tenant_id

    def _params(self, thread_id: str) -> dict[str, Any]:
        return {"tenant": self.tenant_id, "thread": thread_id}

    async def get(self, thread_id: str, lock: Lock = None,
                  returning: Returning = "all") -> AnyRow | None:
        """The row (live or tombstone). `lock` takes a row lock on Postgres; SQLite's write
        transactions are serialised by BEGIN IMMEDIATE already."""
        postgres_lock = lock if lock and dialect_name(self.connection) == "postgresql" else None
        row: AnyRow | None = await direct.first(
            self.connection, _get(postgres_lock, returning), self._params(thread_id))
        return row

    async def get_many(self, thread_ids: list[str]) -> list[AnyRow]:
        """The rows (live or tombstones) of these threads in `thread_id` order, locked as
        `get(lock="update")` locks one: taken in that order, so two transactions that lock
        overlapping sets this way cannot deadlock on them."""
        stmt = _GET_MANY_LOCKED if dialect_name(self.connection) == "postgresql" else _GET_MANY
        return await direct.rows(self.connection, stmt,
                                 {"tenant": self.tenant_id, "threads": thread_ids})

    async def live_pk(self, thread_id: str) -> int | None:
        """The key of a live thread, for reads of its children: the state is not fetched."""
        row = await direct.first(self.connection, _LIVE_PK, self._params(thread_id))
        return row[0] if row is not None else None

    async def insert(self, thread_id: str, values: dict[str, Any], now: datetime,
                     messages: int = 0) -> AnyRow | None:
        """Create at revision 1 with `values` (state, metadata, history_limit), holding seqs
        1..`messages`: its "stored" columns; None if the id exists (live or tombstone)."""
        stmt = _insert(dialect_name(self.connection), tuple(sorted(values)))
        return (await self.connection.execute(
            stmt, self._created_params(thread_id, values, now, messages))).first()

    async def revive(self, thread_id: str, values: dict[str, Any], now: datetime,
                     messages: int = 0) -> AnyRow | None:
        """Start a tombstoned id afresh (its "stored" columns back); its revision continues
        after the deletion's."""
        return (await self.connection.execute(
            _revive(tuple(sorted(values))),
            self._created_params(thread_id, values, now, messages))).first()

    def _created_params(self, thread_id: str, values: dict[str, Any], now: datetime,
                        messages: int) -> dict[str, Any]:
        return {**self._params(thread_id), "now": now, "messages": messages,
                **_new_params(values)}

    async def set_log(self, thread_pk: int, *, last_seq: int, message_count: int) -> None:
        """Set a new thread's message counters (a fork copies its log after the create)."""
        await self.connection.execute(
            update(t).where(t.c.tenant_id == self.tenant_id, t.c.id == thread_pk)
            .values(last_seq=last_seq, message_count=message_count))

    async def add_live(self, thread_pk: int, delta: int) -> None:
        """Add `delta` to the live-message count of a thread this transaction has advanced
        (removals learn how many live messages they took under the row's lock)."""
        await self.connection.execute(
            update(t).where(t.c.tenant_id == self.tenant_id, t.c.id == thread_pk)
            .values(message_count=t.c.message_count + delta))

    async def advance(self, thread_id: str, *, values: dict[str, Any] | None = None,
                      expected: Collection[int] | None = None, seqs: int = 0,
                      live_delta: int = 0, returning: Returning = "all") -> AnyRow | None:
        """Bump the revision of a live thread, only if it is one of `expected` (when given),
        setting `values` (state, metadata) and handing out `seqs` message seqs: the row comes
        back with the last of them in `last_seq`. None if no live thread matched.

        Check and increment are one statement, so two writers holding the same revision
        cannot both succeed, whichever process or server they run in; the row stays locked
        until commit, so concurrent appends queue here and seqs never gap or repeat.
        """
        values = values or {}
        stmt = _advance(tuple(sorted(values)), expectation(expected), returning)
        row: AnyRow | None = await direct.first(self.connection, stmt, self.advance_params(
            thread_id, values, expected, seqs=seqs, live_delta=live_delta))
        return row

    def advance_params(self, thread_id: str, values: dict[str, Any],
                        expected: Collection[int] | None, *, seqs: int = 0,
                        live_delta: int = 0) -> dict[str, Any]:
        """The parameters of `_advance` (and of the statements that run it: `_advance_keeping`,
        `advancing`'s)."""
        params = {**self._params(thread_id), "now": utcnow(), "seqs": seqs,
                  "live_delta": live_delta, **_new_params(values)}
        if expected is not None:
            params["expected"] = list(expected) if len(expected) != 1 else next(iter(expected))
        return params

    async def advance_keeping(self, thread_id: str, *, values: dict[str, Any],
                              expected: Collection[int] | None, window: int,
                              event: tuple[str, str] | None) -> AnyRow | None:
        """Postgres: `advance` with `values` and `keep_history` in one statement, and with
        `event` (actor, resource) the `thread.updated` event too (`_advance_keeping`). None
        if no live thread (at one of the `expected` revisions, when given) matched: nothing
        was written."""
        stmt = _advance_keeping(tuple(sorted(values)), expectation(expected), event is not None)
        params = {**self.advance_params(thread_id, values, expected), "window": window}
        if event is not None:
            params["actor"], params["resource"] = event
        row: AnyRow | None = await direct.first(self.connection, stmt, params)
        return row

    async def keep_history(self, thread_pk: int, revision: int, window: int) -> None:
        """Record the thread's current state as revision `revision` of its history, keeping
        what the last `window` revisions need (0: keep nothing)."""
        if window <= 0:
            await direct.execute(self.connection, _FORGET_HISTORY,
                                 {"tenant": self.tenant_id, "pk": thread_pk})
            return
        params = {"tenant": self.tenant_id, "pk": thread_pk, "revision": revision,
                  "oldest": revision - window + 1}
        for stmt in _keep_history(dialect_name(self.connection) == "postgresql"):
            await direct.execute(self.connection, stmt, params)

    async def history_at(self, thread_pk: int, revision: int) -> AnyRow | None:
        """The history entry that tells the state at `revision`: the newest at or below it."""
        return (await self.connection.execute(
            select(h).where(h.c.tenant_id == self.tenant_id, h.c.thread_pk == thread_pk,
                            h.c.revision <= revision)
            .order_by(h.c.revision.desc()).limit(1)
        )).first()

    async def history(self, thread_pk: int, *, before: int | None,
                      limit: int) -> list[AnyRow]:
        """History entries, newest first, below revision `before` when given."""
        stmt = select(h).where(h.c.tenant_id == self.tenant_id, h.c.thread_pk == thread_pk)
        if before is not None:
            stmt = stmt.where(h.c.revision < before)
        stmt = stmt.order_by(h.c.revision.desc()).limit(limit)
        return list((await self.connection.execute(stmt)).all())

    async def delete(self, thread_id: str, revision: int, now: datetime) -> int | None:
        """Delete a live thread at `revision` (children go by ON DELETE CASCADE) and leave a
        tombstone that took one revision. Returns the tombstone's revision."""
        gone = await self.connection.execute(
            delete(t)
            .where(_KEY, t.c.deleted_at.is_(None), t.c.revision == revision)
            .returning(t.c.revision),
            self._params(thread_id),
        )
        if gone.first() is None:
            return None
        await self.connection.execute(
            insert(t).values(
                tenant_id=self.tenant_id, thread_id=thread_id, revision=revision + 1, state={},
                metadata={}, created_at=now, updated_at=now, deleted_at=now, last_seq=0,
                message_count=0,
            )
        )
        return revision + 1

    async def page(self, *, limit: int, after: tuple[datetime, str] | None,
                   metadata: dict[str, Any] | None, updated_after: datetime | None,
                   order_by: Literal["created_at", "updated_at"] = "created_at",
                   thread_ids: list[str] | None = None,
                   forked_from: str | None = None) -> list[AnyRow]:
        """Live threads (among `thread_ids`, when given; forked from thread `forked_from`,
        when given), newest first by `order_by`, keyset-paged on (that time, thread_id); the
        columns `get(..., returning="stored")` reads."""
        stmt = _page(dialect_name(self.connection), order_by, bool(thread_ids),
                     forked_from is not None, bool(metadata), updated_after is not None,
                     after is not None)
        params: dict[str, Any] = {"tenant": self.tenant_id, "limit": limit,
                                  "thread_ids": thread_ids, "forked_from": forked_from,
                                  "metadata": dumps(metadata) if metadata else None,
                                  "updated_after": updated_after}
        if after is not None:
            params["after_at"], params["after_thread"] = after
        return await direct.rows(self.connection, stmt, params)
