"""SQL of the maintenance commands `export`, `import` and `copy`: every row of every tenant.

Not scoped by tenant, deliberately: these commands move a whole database (like `secrets
rotate`). They run outside requests, so the tenant guard does not apply. Statements are
generic over `app/portability/format.py`'s kinds, so a column added to a mapped table needs
no change here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    String,
    and_,
    delete,
    exists,
    func,
    insert,
    select,
    text,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.base import AnyRow
from app.db.dialect import dialect_name
from app.portability.format import EVENT, THREAD, Kind

t = THREAD.table
e = EVENT.table
BATCH = 1000


class PortabilityRepository:
    def __init__(self, connection: AsyncConnection) -> None:
        self.connection = connection
        self.postgres = dialect_name(connection) == "postgresql"

    def _ordered(self, column: Any) -> Any:
        """Byte order on both backends, whatever the Postgres database's locale, so an
        export of the same data is the same file from either backend."""
        if self.postgres and isinstance(column.type, String):
            return column.collate("C")
        return column

    def _select(self, kind: Kind, *extra: Any) -> Any:
        return select(*(kind.table.c[column.name] for column in kind.columns), *extra)

    # --- reading ---------------------------------------------------------------------------

    async def stream(self, kind: Kind) -> AsyncIterator[AnyRow]:
        """Every row of a global or tenant kind in file order (threads with their `id`), over
        a server-side cursor: memory stays flat however many rows there are."""
        table = kind.table
        stmt = self._select(kind, *([table.c.id] if kind is THREAD else []))
        stmt = stmt.order_by(*(self._ordered(table.c[name]) for name in kind.order))
        result = await self.connection.stream(stmt.execution_options(yield_per=BATCH))
        async for row in result:
            yield row

    async def children(self, kind: Kind, thread_pk: int,
                       thread: tuple[str, str]) -> AsyncIterator[AnyRow]:
        """One thread's rows of a child kind, in file order, streamed."""
        table = kind.table
        if kind.thread_fk is not None:
            where: ColumnElement[bool] = table.c[kind.thread_fk] == thread_pk
        else:  # events name their thread by id
            where = and_(table.c.tenant_id == thread[0], table.c.thread_id == thread[1])
        stmt = (self._select(kind).where(where)
                .order_by(*(self._ordered(table.c[name]) for name in kind.order)))
        result = await self.connection.stream(stmt.execution_options(yield_per=BATCH))
        async for row in result:
            yield row

    async def loose_events(self) -> AsyncIterator[AnyRow]:
        """Events that name no thread row (MCP servers', or none at all), by seq."""
        named = exists().where(t.c.tenant_id == e.c.tenant_id, t.c.thread_id == e.c.thread_id)
        stmt = self._select(EVENT).where(~named).order_by(e.c.seq)
        result = await self.connection.stream(stmt.execution_options(yield_per=BATCH))
        async for row in result:
            yield row

    async def thread_row(self, thread_pk: int) -> AnyRow | None:
        """A thread's exported columns and its id."""
        return (await self.connection.execute(
            self._select(THREAD, t.c.id).where(t.c.id == thread_pk))).first()

    async def count(self, kind: Kind) -> int:
        return int(await self.connection.scalar(select(func.count()).select_from(kind.table))
                   or 0)

    # --- writing ---------------------------------------------------------------------------

    async def thread_pk(self, tenant_id: str, thread_id: str) -> int | None:
        pk: int | None = await self.connection.scalar(
            select(t.c.id).where(t.c.tenant_id == tenant_id, t.c.thread_id == thread_id))
        return pk

    async def insert_thread(self, values: dict[str, Any]) -> int | None:
        """The new row's id; None if the thread exists (a concurrent writer made it)."""
        module: Any
        if self.postgres:
            from sqlalchemy.dialects import postgresql as module
        else:
            from sqlalchemy.dialects import sqlite as module
        stmt = (module.insert(t).values(**values)
                .on_conflict_do_nothing(index_elements=["tenant_id", "thread_id"])
                .returning(t.c.id))
        pk: int | None = (await self.connection.execute(stmt)).scalar()
        return pk

    async def insert(self, kind: Kind, rows: list[dict[str, Any]]) -> None:
        if rows:
            await self.connection.execute(insert(kind.table), rows)

    async def delete_thread(self, thread_pk: int, tenant_id: str, thread_id: str) -> None:
        """The thread row (its children go by ON DELETE CASCADE) and the events naming it."""
        await self.connection.execute(delete(t).where(t.c.id == thread_pk))
        await self.connection.execute(
            delete(e).where(e.c.tenant_id == tenant_id, e.c.thread_id == thread_id))

    async def taken_seqs(self, seqs: Sequence[int]) -> list[int]:
        """Which of these event seqs some stored event already has."""
        if not seqs:
            return []
        return list((await self.connection.scalars(
            select(e.c.seq).where(e.c.seq.in_(list(seqs))))).all())

    async def advance_event_seq(self) -> None:
        """After events were stored with their own seqs, new events must come after them.
        SQLite's AUTOINCREMENT follows explicit values by itself; a Postgres sequence not."""
        if self.postgres:
            await self.connection.execute(text(
                "SELECT setval(s.name, m.top) "
                "FROM (SELECT pg_get_serial_sequence('events', 'seq') AS name) AS s, "
                "(SELECT max(seq) AS top FROM events) AS m "
                "WHERE m.top > COALESCE((SELECT last_value FROM pg_sequences "
                "WHERE format('%I.%I', schemaname, sequencename) = s.name), 0)"))

    async def find(self, kind: Kind, key: dict[str, Any]) -> AnyRow | None:
        """The stored row of a global or tenant kind with this natural key."""
        table = kind.table
        return (await self.connection.execute(
            self._select(kind).where(*(table.c[name] == key[name] for name in kind.key))
        )).first()

    async def delete_one(self, kind: Kind, key: dict[str, Any]) -> None:
        table = kind.table
        await self.connection.execute(
            delete(table).where(*(table.c[name] == key[name] for name in kind.key)))

    async def delete_event(self, seq: int) -> None:
        await self.connection.execute(delete(e).where(e.c.seq == seq))

    async def find_events(self, seqs: Sequence[int]) -> list[AnyRow]:
        return list((await self.connection.execute(
            self._select(EVENT).where(e.c.seq.in_(list(seqs))).order_by(e.c.seq))).all())
