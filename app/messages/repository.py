"""Message rows. Every statement is scoped by tenant and walks an index from a key, so its
cost is the rows it returns, never the length of the thread."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from functools import cache
from types import SimpleNamespace
from typing import Any, Literal

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Integer,
    Text,
    UniqueConstraint,
    bindparam,
    case,
    cast,
    column,
    delete,
    func,
    insert,
    literal,
    literal_column,
    select,
    true,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.ids import new_id
from app.core.schemas import utc_text
from app.db import direct
from app.db.base import AnyRow, table
from app.db.dialect import dialect_name
from app.messages.models import Message
from app.messages.schemas import RENDERED_COLUMNS, MessageIn
from app.threads.models import Thread
from app.threads.repository import (
    Expectation,
    ThreadRepository,
    advanced_event,
    advancing,
    expectation,
)

m = table(Message)
t = table(Thread)
# Where a parent link points: (thread id, seq) of the message it names.
Parent = tuple[str, int]
# Rendered as a literal, not a parameter: Postgres can only prove a partial index's predicate
# from a constant, and a prepared statement's generic plan would otherwise miss `ix_messages_live`.
LIVE: Any = literal_column("'live'")
Key = tuple[int, int]  # (position, seq): the order of both views


_POSITION_SEQ = tuple_(m.c.position, m.c.seq)
# A page's columns with the JSON ones as their stored text, for `schemas.render_message`;
# on Postgres `created_at` too, as `utc_text` writes it: decoding, converting and formatting
# the datetimes in Python cost a third of the server's CPU for a page of 800.
_UTC_TEXT: Any = literal_column("""'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'""")
_LAST, _FIRST = (literal_column(f"'{utc_text(moment.replace(tzinfo=UTC))}'", Text)
                 for moment in (datetime.max, datetime.min))


# Read by every page: the cursor is made of them.
_KEY_COLUMNS = ("position", "seq")


@cache
def _as_stored(postgres: bool, projected: bool) -> list[Any]:
    """With `projected`, each column but the key is NULL unless its `with_<name>` parameter
    is true (one statement for every choice of columns, not one per choice)."""
    columns = []
    for name in RENDERED_COLUMNS:
        column: Any = m.c[name]
        if column.type._type_affinity is JSON:
            column = cast(column, Text)
        elif name == "created_at" and postgres:
            text = func.to_char(func.timezone("UTC", column), _UTC_TEXT)
            # asyncpg stores datetime.max and .min as +-infinity, which to_char makes NULL.
            column = func.coalesce(text, case((column > func.now(), _LAST), else_=_FIRST))
        if projected and name not in _KEY_COLUMNS:
            column = case((bindparam(f"with_{name}", type_=Boolean), column))
        columns.append(column.label(name))
    return columns


@cache
def _append(postgres: bool) -> Any:
    """INSERT of an appended row that skips it if the thread has its id already and returns
    the id if it stored it: the check for a taken id is the insert itself."""
    return ((postgresql if postgres else sqlite).insert(m)
            .on_conflict_do_nothing(index_elements=["thread_pk", "message_id"])
            .returning(m.c.message_id))


# The key of the live thread named by its id, inside the statement that reads its messages.
_LIVE_THREAD_PK = (select(t.c.id)
                   .where(t.c.tenant_id == bindparam("tenant"),
                          t.c.thread_id == bindparam("thread"), t.c.deleted_at.is_(None))
                   .scalar_subquery())


@cache
def _page(postgres: bool, as_stored: bool, live: bool, descending: bool, lower: bool,
          upper: bool, role: bool, agent_name: bool, created_after: bool,
          by_thread_id: bool = False, projected: bool = False) -> Any:
    """The statement of `MessageRepository.page` for one shape of its filters, built once:
    each page is then a lookup of its compiled form, not a statement built, walked for its
    cache key and compiled again. `by_thread_id`: the thread named by its id (live only)
    instead of its key."""
    stmt = select(*_as_stored(postgres, projected)) if as_stored else select(m)
    stmt = stmt.where(m.c.thread_pk == (_LIVE_THREAD_PK if by_thread_id
                                        else bindparam("pk", type_=BigInteger)),
                      m.c.tenant_id == bindparam("tenant"))
    if live:
        stmt = stmt.where(m.c.status == LIVE)
    for name, present, above in (("lower", lower, True), ("upper", upper, False)):
        if present:
            key = tuple_(bindparam(f"{name}_position", type_=BigInteger),
                         bindparam(f"{name}_seq", type_=BigInteger))
            stmt = stmt.where(_POSITION_SEQ > key if above else _POSITION_SEQ < key)
    if role:
        stmt = stmt.where(m.c.role == bindparam("role"))
    if agent_name:
        stmt = stmt.where(m.c.agent_name == bindparam("agent_name"))
    if created_after:
        stmt = stmt.where(m.c.created_at > bindparam("created_after",
                                                     type_=m.c.created_at.type))
    order = ((m.c.position.desc(), m.c.seq.desc()) if descending else (m.c.position, m.c.seq))
    return stmt.order_by(*order).limit(bindparam("limit", type_=Integer))


def checks_ids_on_insert(messages: Sequence[MessageIn]) -> bool:
    """Whether `MessageRepository.append` finds a taken id itself, in its INSERT: for one
    message without a parent link (an agent's usual append), one statement instead of two.
    Other appends check with `taken_id` first: before their parent links are resolved (a
    taken id is refused before a parent that is not found, as always), and a multi-row
    INSERT ... RETURNING would be a new SQL text for every count, a statement asyncpg
    prepares and caches per count."""
    return len(messages) == 1 and messages[0].parent_id is None


# The constraint a message id the thread has already breaks.
_TAKEN_ID = str(next(c.name for c in m.constraints if isinstance(c, UniqueConstraint)))


def _constraint(error: IntegrityError) -> str | None:
    """The constraint asyncpg says `error` broke (SQLAlchemy's adapter keeps its error as
    the cause)."""
    return getattr(error.orig.__cause__, "constraint_name", None) if error.orig else None


# What `_append_alone` takes from its parameters (`MessageRepository.row`'s values); the
# thread's key, the seq, position and revision come from the thread's UPDATE.
_FROM_THE_THREAD = ("thread_pk", "seq", "position", "revision")
# Of those, what differs between the messages of one append (an array each, unnested).
_PER_MESSAGE = ("message_id", "role", "content", "item", "name", "tool_calls", "tool_call_id",
                "agent_name", "metadata")


@cache
def _append_alone(expected: Expectation, several: bool) -> Any:
    """Postgres: messages appended as `append` stores them, the thread's `advance` (a seq
    each, as many live messages more) and the `message.appended` event in one statement, to
    run alone in autocommit: one round trip where a transaction of them takes five or six.
    One message binds its values; `several` bind an array per column of `_PER_MESSAGE`,
    unnested in order (one SQL text for any count). A taken id fails the statement on the
    thread's unique constraint, so nothing is written; a thread that is absent, deleted or
    at another revision (the UPDATE matched nothing) inserts nothing and returns no row."""
    up = advancing(expected).cte("advanced")
    own = [c.name for c in m.c if c.name not in _FROM_THE_THREAD]
    if several:
        new = func.unnest(*(bindparam(f"m_{name}", type_=ARRAY(m.c[name].type, dimensions=1))
                            for name in _PER_MESSAGE)).table_valued(
            *(column(name, m.c[name].type) for name in _PER_MESSAGE),
            with_ordinality="ord").render_derived()
        seq = up.c.last_seq - bindparam("seqs", type_=BigInteger) + new.c.ord
        source = select(up.c.id, seq, seq, up.c.revision, *(
            new.c[name] if name in _PER_MESSAGE else bindparam(f"m_{name}", type_=m.c[name].type)
            for name in own)).select_from(up).join(new, true()).order_by(new.c.ord)
    else:
        source = select(up.c.id, up.c.last_seq, up.c.last_seq, up.c.revision,
                        *(bindparam(f"m_{name}", type_=m.c[name].type) for name in own))
    stored = insert(m).from_select([*_FROM_THE_THREAD, *own], source).cte("stored")
    return (select(up.c.id, up.c.revision, up.c.last_seq).add_cte(stored)
            .add_cte(advanced_event(up, "message.appended")))


_INSERT = insert(m)
_TAKEN = (select(m.c.message_id)
          .where(m.c.thread_pk == bindparam("pk"), m.c.tenant_id == bindparam("tenant"),
                 m.c.message_id.in_(bindparam("ids", expanding=True)))
          .limit(1))


def _bound(key: Key) -> Any:
    # Typed BIGINT like the columns (a plain int binds as INTEGER on Postgres).
    return tuple_(*(literal(value, BigInteger) for value in key))


class MessageRepository:
    def __init__(self, connection: AsyncConnection, tenant_id: str) -> None:
        self.connection = connection
        self.tenant_id = tenant_id

    def _thread(self, thread_pk: int) -> Any:
        return (m.c.thread_pk == thread_pk) & (m.c.tenant_id == self.tenant_id)

    async def taken_id(self, thread_pk: int, ids: Sequence[str]) -> str | None:
        """One of `ids` that a message of the thread already has, if any. Race-free: callers
        hold the thread row lock."""
        if not ids:
            return None
        taken: str | None = await self.connection.scalar(
            _TAKEN, {"pk": thread_pk, "tenant": self.tenant_id, "ids": list(ids)})
        return taken

    def row(self, thread_pk: int, message: MessageIn, *, seq: int, position: int,
            revision: int, now: datetime, summary_of: str | None = None,
            parent: Parent | None = None) -> dict[str, Any]:
        return {
            "thread_pk": thread_pk, "seq": seq, "tenant_id": self.tenant_id,
            "message_id": message.id or new_id("msg"), "position": position,
            "role": message.role, "content": message.content, "item": message.item,
            "name": message.name,
            "tool_calls": message.tool_calls, "tool_call_id": message.tool_call_id,
            "agent_name": message.agent_name, "metadata": message.metadata,
            "created_at": now, "status": "live", "compacted_by": None,
            "summary_of": summary_of, "revision": revision,
            "parent_id": message.parent_id,
            "parent_thread_id": parent[0] if parent is not None else None,
            "parent_seq": parent[1] if parent is not None else None,
        }

    async def insert(self, rows: list[dict[str, Any]]) -> None:
        await direct.execute_many(self.connection, _INSERT, rows)

    async def append(self, thread: Any, messages: Sequence[MessageIn], now: datetime,
                     parents: Sequence[Parent | None] = ()
                     ) -> tuple[list[SimpleNamespace], str | None]:
        """Store `messages` as seqs `last_seq - n + 1 .. last_seq` of `thread`, the row the
        caller's UPDATE returned (it handed the seqs out and holds the row lock until commit),
        in its revision. Returns the stored rows and, when the INSERT checks the ids itself
        (`checks_ids_on_insert`), the id if the thread has it already: then nothing was
        stored and the caller must refuse the request. Otherwise the caller has checked that
        the ids are free (`taken_id`). Race-free: the caller holds the thread row lock."""
        first = thread.last_seq - len(messages) + 1
        rows = [self.row(thread.id, msg, seq=first + i, position=first + i,
                         revision=thread.revision, now=now,
                         parent=parents[i] if parents else None)
                for i, msg in enumerate(messages)]
        stored = [SimpleNamespace(**row) for row in rows]
        if checks_ids_on_insert(messages):
            stmt = _append(dialect_name(self.connection) == "postgresql")
            if await direct.first(self.connection, stmt, rows[0]) is None:
                return stored, rows[0]["message_id"]
            return stored, None
        await self.insert(rows)
        return stored, None

    async def append_alone(self, thread_id: str, messages: Sequence[MessageIn], now: datetime,
                           expected: Collection[int] | None, actor: str,
                           resource: str) -> tuple[int, list[SimpleNamespace]] | None:
        """Postgres, in autocommit: `messages` (none with a parent link) appended to the live
        thread `thread_id` (at one of the `expected` revisions, when given) with their event,
        in one statement (`_append_alone`). The thread's new revision and the stored rows;
        None if nothing was written: the thread is not live (or not at an expected
        revision), or already has one of the messages' ids."""
        rows = [self.row(0, message, seq=0, position=0, revision=0, now=now)
                for message in messages]
        several = len(rows) > 1
        params = {**ThreadRepository(self.connection, self.tenant_id).advance_params(
                      thread_id, {}, expected, seqs=len(rows), live_delta=len(rows)),
                  **{f"m_{name}": ([row[name] for row in rows]
                                   if several and name in _PER_MESSAGE else rows[0][name])
                     for name in rows[0] if name not in _FROM_THE_THREAD},
                  "actor": actor, "resource": resource,
                  "now": now}  # the thread's, the messages' and the event's time alike
        try:
            thread = await direct.first(
                self.connection, _append_alone(expectation(expected), several), params)
        except IntegrityError as error:
            if _constraint(error) != _TAKEN_ID:
                raise
            return None
        if thread is None:
            return None
        first = thread.last_seq - len(rows) + 1
        for index, row in enumerate(rows):
            row.update(thread_pk=thread.id, seq=first + index, position=first + index,
                       revision=thread.revision)
        return thread.revision, [SimpleNamespace(**row) for row in rows]

    async def get(self, thread_pk: int, message_id: str) -> AnyRow | None:
        return (await self.connection.execute(
            select(m).where(self._thread(thread_pk), m.c.message_id == message_id)
        )).first()

    async def page(self, thread: int | str, *, live: bool, descending: bool,
                   lower: Key | None, upper: Key | None, role: str | None,
                   agent_name: str | None, limit: int, created_after: datetime | None = None,
                   as_stored: bool = False,
                   columns: Collection[str] | None = None) -> list[AnyRow]:
        """One page of a view in (position, seq) order, strictly between two keys; with
        `as_stored`, the JSON columns as the text they are stored as, and with `columns`
        too, only those columns read (the others NULL; position and seq always). `thread`: the
        thread's key, or its id (then no page of a thread that is deleted or absent: an
        empty page does not say which).

        Every bound is a (position, seq) row value, so both backends seek the index to it
        instead of stepping over the rows before it.
        """
        by_id = isinstance(thread, str)
        stmt = _page(dialect_name(self.connection) == "postgresql", as_stored, live,
                     descending, lower is not None, upper is not None, role is not None,
                     agent_name is not None, created_after is not None, by_id,
                     as_stored and columns is not None)
        params: dict[str, Any] = {"tenant": self.tenant_id, "limit": limit,
                                  "role": role, "agent_name": agent_name,
                                  "created_after": created_after,
                                  "thread" if by_id else "pk": thread}
        if columns is not None:
            params.update((f"with_{name}", name in columns) for name in RENDERED_COLUMNS
                          if name not in _KEY_COLUMNS)
        for name, key in (("lower", lower), ("upper", upper)):
            if key is not None:
                params[f"{name}_position"], params[f"{name}_seq"] = key
        return await direct.rows(self.connection, stmt, params)

    async def remove(self, thread_pk: int, seqs: Sequence[int]) -> None:
        """Delete the rows: their content is gone from the table, their seqs stay unused."""
        await self.connection.execute(
            delete(m).where(self._thread(thread_pk), m.c.seq.in_(seqs)))

    async def replace(self, thread_pk: int, seq: int, values: dict[str, Any]) -> AnyRow:
        """Overwrite members of one message in place (a redaction); the row as now stored."""
        row = (await self.connection.execute(
            update(m).where(self._thread(thread_pk), m.c.seq == seq).values(**values)
            .returning(*m.c))).first()
        assert row is not None  # the caller found it under the thread's lock
        return row

    async def by_ids(self, thread_pk: int, ids: Sequence[str]) -> list[AnyRow]:
        """The thread's messages among `ids`, in view order."""
        return list((await self.connection.execute(
            select(m).where(self._thread(thread_pk), m.c.message_id.in_(ids))
            .order_by(m.c.position, m.c.seq)
        )).all())

    async def live_count_between(self, thread_pk: int, first: Key, last: Key, cap: int) -> int:
        """Live messages from `first` to `last` inclusive, counting at most `cap` (so a wide,
        non-contiguous range costs no more than the run it claims to be)."""
        inside = (
            select(m.c.seq)
            .where(self._thread(thread_pk), m.c.status == LIVE,
                   _POSITION_SEQ >= _bound(first), _POSITION_SEQ <= _bound(last))
            .limit(cap)
            .subquery()
        )
        return int(await self.connection.scalar(select(func.count()).select_from(inside)) or 0)

    async def set_status(self, thread_pk: int, ids: Sequence[str],
                         status: Literal["live", "compacted", "reverted"],
                         compacted_by: str | None) -> None:
        await self.connection.execute(
            update(m).where(self._thread(thread_pk), m.c.message_id.in_(ids))
            .values(status=status, compacted_by=compacted_by)
        )

    async def copy(self, source_pk: int, target_pk: int, *, up_to_revision: int,
                   revision: int, source_id: str, target_id: str) -> int:
        """Copy the messages a thread had stored by `up_to_revision` into another thread
        (same seqs, positions, ids and times; stored there in `revision`), every one live:
        the caller then sets the statuses they had at that revision. A parent link into the
        source thread points at the copy of its parent; one into another thread is kept.
        Returns the last seq."""
        fixed = ("thread_pk", "status", "compacted_by", "revision", "parent_thread_id")
        columns = [column.name for column in m.c if column.name not in fixed]
        parent_thread = case((m.c.parent_thread_id == source_id,
                              literal(target_id, m.c.parent_thread_id.type)),
                             else_=m.c.parent_thread_id)
        await self.connection.execute(insert(m).from_select(
            [*fixed, *columns],
            select(literal(target_pk, BigInteger), LIVE, literal(None, m.c.compacted_by.type),
                   literal(revision, BigInteger), parent_thread,
                   *(m.c[name] for name in columns))
            .where(self._thread(source_pk), m.c.revision <= up_to_revision),
        ))
        last: int | None = await self.connection.scalar(
            select(func.max(m.c.seq)).where(self._thread(target_pk)))
        return last or 0

    async def live_count(self, thread_pk: int) -> int:
        """Live messages of a thread, counted (only forks need it: appends and compactions
        keep the thread's `message_count` up to date)."""
        return int(await self.connection.scalar(
            select(func.count()).select_from(m).where(self._thread(thread_pk), m.c.status == LIVE)
        ) or 0)

    # --- parent links and lineage (API.md section 4, "Parent links") ---------------------

    async def carriers(self, ids: Sequence[str]) -> list[AnyRow]:
        """The tenant's messages, in any thread, that carry one of `ids`:
        (message_id, thread_pk, thread_id, seq)."""
        if not ids:
            return []
        return list((await self.connection.execute(
            select(m.c.message_id, m.c.thread_pk, t.c.thread_id, m.c.seq)
            .select_from(m.join(t, (t.c.id == m.c.thread_pk)
                                & (t.c.tenant_id == self.tenant_id)))
            .where(m.c.tenant_id == self.tenant_id, m.c.message_id.in_(ids))
        )).all())

    async def hold_threads(self, thread_pks: Collection[int]) -> set[int]:
        """Hold the rows of live threads (FOR SHARE on Postgres) until commit, so neither a
        delete of one nor a removal from one can run between the caller's check that a
        parent exists and its commit. The ones still live."""
        if not thread_pks:
            return set()
        stmt = select(t.c.id).where(t.c.tenant_id == self.tenant_id,
                                    t.c.id.in_(sorted(thread_pks)), t.c.deleted_at.is_(None))
        if dialect_name(self.connection) == "postgresql":
            stmt = stmt.with_for_update(read=True)
        return set((await self.connection.scalars(stmt)).all())

    async def referrer(self, thread_id: str, thread_pk: int,
                       seqs: Sequence[int] | None = None) -> tuple[str, str] | None:
        """A message that continues one of the thread's messages (all of them, or those of
        `seqs`) and would outlive them: one of another thread, or of this one outside `seqs`.
        Its (thread id, message id), or None."""
        where = [m.c.tenant_id == self.tenant_id, m.c.parent_thread_id == thread_id]
        if seqs is None:
            where.append(m.c.thread_pk != thread_pk)
        else:
            where += [m.c.parent_seq.in_(seqs),
                      ~((m.c.thread_pk == thread_pk) & m.c.seq.in_(seqs))]
        found = (await self.connection.execute(
            select(t.c.thread_id, m.c.message_id)
            .select_from(m.join(t, (t.c.id == m.c.thread_pk)
                                & (t.c.tenant_id == self.tenant_id)))
            .where(*where).limit(1))).first()
        return (found.thread_id, found.message_id) if found is not None else None

    async def lineage(self, start: Parent, limit: int) -> list[AnyRow]:
        """The message at `start` (thread id, seq) and the ones before it along parent links,
        newest first, at most `limit`: one recursive query, each step two index lookups
        (the parent's thread by its id, the message by its key). Rows carry `thread_id`."""
        t1, m1 = t.alias("t1"), m.alias("m1")
        depth = literal(0, BigInteger).label("depth")
        chain = (
            select(m1.c.thread_pk, m1.c.seq, m1.c.parent_thread_id, m1.c.parent_seq, depth)
            .select_from(m1.join(t1, (t1.c.id == m1.c.thread_pk)
                                 & (t1.c.tenant_id == self.tenant_id)))
            .where(m1.c.tenant_id == self.tenant_id, t1.c.thread_id == start[0],
                   m1.c.seq == start[1])
            .cte("chain", recursive=True)
        )
        t2, m2 = t.alias("t2"), m.alias("m2")
        chain = chain.union_all(
            select(m2.c.thread_pk, m2.c.seq, m2.c.parent_thread_id, m2.c.parent_seq,
                   chain.c.depth + 1)
            .select_from(
                chain.join(t2, (t2.c.tenant_id == self.tenant_id)
                           & (t2.c.thread_id == chain.c.parent_thread_id))
                .join(m2, (m2.c.tenant_id == self.tenant_id) & (m2.c.thread_pk == t2.c.id)
                      & (m2.c.seq == chain.c.parent_seq)))
            .where(chain.c.depth < limit - 1)
        )
        return list((await self.connection.execute(
            select(*m.c, t.c.thread_id)
            .select_from(
                chain.join(m, (m.c.tenant_id == self.tenant_id)
                           & (m.c.thread_pk == chain.c.thread_pk) & (m.c.seq == chain.c.seq))
                .join(t, (t.c.tenant_id == self.tenant_id) & (t.c.id == m.c.thread_pk)))
            .order_by(chain.c.depth)
        )).all())
