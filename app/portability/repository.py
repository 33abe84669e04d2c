"""SQL of the maintenance commands `export`, `import` and `copy`: every row of every tenant.

Not scoped by tenant, deliberately: these commands move a whole database (like `secrets
rotate`). They run outside requests, so the tenant guard does not apply. Statements are
generic over `app/portability/format.py`'s kinds, so a column added to a mapped table needs
no change here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    ColumnElement,
    DateTime,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    and_,
    delete,
    exists,
    func,
    insert,
    select,
    text,
    tuple_,
    union,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.jsonutil import dumps
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

    async def analyze(self) -> None:
        """Postgres: every table's planner statistics now (the tables an import filled
        would otherwise have none until autovacuum's next visit, and Postgres plans a join
        over a table it never analyzed blind: a store vector search right after loading
        20,000 items into a fresh database took 21 s, and 0.04 s once analyzed)."""
        if self.postgres:
            await self.connection.execute(text("ANALYZE"))

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
        """One thread's rows of a child kind, in file order, a keyset batch per statement
        (one round trip for the few rows most threads have, flat memory for the many)."""
        table = kind.table
        if kind.thread_fk is not None:
            where: ColumnElement[bool] = table.c[kind.thread_fk] == thread_pk
        else:  # events name their thread by id
            where = and_(table.c.tenant_id == thread[0], table.c.thread_id == thread[1])
        order = [self._ordered(table.c[name]) for name in kind.order]
        stmt = self._select(kind).where(where).order_by(*order).limit(BATCH)
        after: tuple[Any, ...] | None = None
        while True:
            page = stmt if after is None else stmt.where(tuple_(*order) > tuple_(*after))
            rows = (await self.connection.execute(page)).all()
            for row in rows:
                yield row
            if len(rows) < BATCH:
                return
            after = tuple(rows[-1]._mapping[name] for name in kind.order)

    async def loose_events(self) -> AsyncIterator[AnyRow]:
        """Events that name no thread row (MCP servers', or none at all), by seq."""
        named = exists().where(t.c.tenant_id == e.c.tenant_id, t.c.thread_id == e.c.thread_id)
        stmt = self._select(EVENT).where(~named).order_by(e.c.tenant_id, e.c.seq)
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
        if not rows:
            return
        if self.postgres and len(rows) > 1:
            await self._copy(kind.table, rows)
        else:
            await self.connection.execute(insert(kind.table), rows)

    async def _copy(self, table: Table, rows: list[dict[str, Any]]) -> None:
        """Postgres COPY, in the transaction the connection is in: several times the rate
        of a multi-row INSERT for the long runs of messages a copy writes."""
        columns = list(rows[0])
        json_columns = {name for name in columns if table.c[name].type._type_affinity is JSON}
        records = [tuple(dumps(row[name]) if name in json_columns else row[name]
                         for name in columns) for row in rows]
        raw = await self.connection.get_raw_connection()
        await raw.driver_connection.copy_records_to_table(  # type: ignore[union-attr]
            table.name, records=records, columns=columns)

    async def delete_thread(self, thread_pk: int, tenant_id: str, thread_id: str) -> None:
        """The thread row (its children go by ON DELETE CASCADE) and the events naming it."""
        await self.connection.execute(delete(t).where(t.c.id == thread_pk))
        await self.connection.execute(
            delete(e).where(e.c.tenant_id == tenant_id, e.c.thread_id == thread_id))

    async def taken_seqs(self, tenant_id: str, seqs: Sequence[int]) -> list[int]:
        """Which of these event seqs some stored event of the tenant already has."""
        if not seqs:
            return []
        return list((await self.connection.scalars(
            select(e.c.seq).where(e.c.tenant_id == tenant_id, e.c.seq.in_(list(seqs))))).all())

    async def hold_event_seqs(self, tenant_id: str) -> None:
        """Take the tenant's sequencing lock until this transaction ends (Postgres), so the
        sequencer cannot hand out a seq that the events stored here with their own seqs
        take. New events are numbered after the tenant's newest seq, imported or not."""
        if self.postgres:
            await self.connection.execute(
                text("SELECT pg_advisory_xact_lock(1634169716, hashtext(:tenant))"),
                {"tenant": tenant_id})

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

    async def delete_event(self, tenant_id: str, seq: int) -> None:
        await self.connection.execute(delete(e).where(e.c.tenant_id == tenant_id, e.c.seq == seq))

    async def find_events(self, tenant_id: str, seqs: Sequence[int]) -> list[AnyRow]:
        return list((await self.connection.execute(
            self._select(EVENT).where(e.c.tenant_id == tenant_id, e.c.seq.in_(list(seqs)))
            .order_by(e.c.seq))).all())


# --- the stores agentstate replaces, read by `agentstate import --format ...` -------------
# Their tables as those libraries create them, on a MetaData of their own: never part of
# agentstate's schema or migrations.

_foreign = MetaData()

# aisuite 0.2.0, aisuite/agents/postgres_state_store.py SCHEMA_STATEMENTS.
aisuite_heads = Table(
    "agent_thread_heads", _foreign,
    Column("thread_id", Text, primary_key=True),
    Column("model_context_message_ids", ARRAY(Text)),
    Column("full_history_message_ids", ARRAY(Text)),
    Column("step_ids", ARRAY(Text)),
    Column("compacted_from_message_ids", ARRAY(Text)),
    Column("state", JSONB),
    Column("revision", BigInteger),
    Column("metadata", JSONB),
    Column("created_at", DateTime(timezone=True)),
    Column("updated_at", DateTime(timezone=True)),
)
aisuite_messages = Table(
    "agent_messages", _foreign,
    Column("message_id", Text, primary_key=True),
    Column("thread_id", Text),
    Column("role", Text),
    Column("message", JSONB),
    Column("artifact_refs", JSONB),
    Column("created_at", DateTime(timezone=True)),
)
aisuite_compactions = Table(
    "agent_compactions", _foreign,
    Column("compaction_id", Text, primary_key=True),
    Column("thread_id", Text),
    Column("source_message_ids", ARRAY(Text)),
    Column("summary_message_id", Text),
    Column("summary_text", Text),
    Column("reason", Text),
    Column("model", Text),
    Column("input_token_count", BigInteger),
    Column("output_token_count", BigInteger),
    Column("created_at", DateTime(timezone=True)),
    Column("metadata", JSONB),
)

# The Colosseum design's three models (its "Schema Design").
colosseum_states = Table(
    "agent_states", _foreign,
    Column("id", Integer, primary_key=True),
    Column("agent_name", String(255)),
    Column("session_id", String(255)),
    Column("state_data", JSON),
    Column("created_at", DateTime),
    Column("updated_at", DateTime),
)
colosseum_history = Table(
    "conversation_history", _foreign,
    Column("id", Integer, primary_key=True),
    Column("session_id", String(255)),
    Column("agent_name", String(255)),
    Column("role", String(50)),
    Column("content", Text),
    Column("metadata", JSON),
    Column("timestamp", DateTime),
)
colosseum_servers = Table(
    "mcp_server_states", _foreign,
    Column("id", Integer, primary_key=True),
    Column("server_name", String(255)),
    Column("server_type", String(100)),
    Column("state_data", JSON),
    Column("last_connected", DateTime),
)


class AisuiteRepository:
    """aisuite's PostgresStateStore tables, read thread by thread."""

    def __init__(self, connection: AsyncConnection) -> None:
        self.connection = connection

    async def heads(self) -> AsyncIterator[AnyRow]:
        result = await self.connection.stream(
            select(aisuite_heads).order_by(aisuite_heads.c.thread_id.collate("C"))
            .execution_options(yield_per=100))
        async for row in result:
            yield row

    async def messages(self, thread_id: str) -> list[AnyRow]:
        return list((await self.connection.execute(
            select(aisuite_messages).where(aisuite_messages.c.thread_id == thread_id))).all())

    async def compactions(self, thread_id: str) -> list[AnyRow]:
        return list((await self.connection.execute(
            select(aisuite_compactions).where(aisuite_compactions.c.thread_id == thread_id)
            .order_by(aisuite_compactions.c.created_at, aisuite_compactions.c.compaction_id)
        )).all())


class ColosseumRepository:
    """The Colosseum design's tables, read session by session."""

    def __init__(self, connection: AsyncConnection) -> None:
        self.connection = connection

    async def sessions(self) -> AsyncIterator[str]:
        ids = union(select(colosseum_history.c.session_id),
                    select(colosseum_states.c.session_id)).subquery()
        result = await self.connection.stream(
            select(ids.c.session_id).order_by(ids.c.session_id)
            .execution_options(yield_per=BATCH))
        async for row in result:
            yield row.session_id

    async def history(self, session_id: str) -> list[AnyRow]:
        """Oldest first; rows saved at the same instant in the order they were saved."""
        return list((await self.connection.execute(
            select(colosseum_history).where(colosseum_history.c.session_id == session_id)
            .order_by(colosseum_history.c.timestamp, colosseum_history.c.id)
        )).all())

    async def states(self, session_id: str) -> list[AnyRow]:
        """Every saved row, per agent oldest first (the design saves a row per call)."""
        return list((await self.connection.execute(
            select(colosseum_states).where(colosseum_states.c.session_id == session_id)
            .order_by(colosseum_states.c.agent_name,
                      func.coalesce(colosseum_states.c.updated_at, colosseum_states.c.created_at),
                      colosseum_states.c.id)
        )).all())

    async def servers(self) -> list[AnyRow]:
        return list((await self.connection.execute(
            select(colosseum_servers)
            .order_by(colosseum_servers.c.server_name, colosseum_servers.c.id))).all())

    async def latest(self) -> datetime | None:
        """The newest time the database records anywhere."""
        stamps = [
            select(func.max(colosseum_history.c.timestamp)),
            select(func.max(func.coalesce(colosseum_states.c.updated_at,
                                          colosseum_states.c.created_at))),
            select(func.max(colosseum_servers.c.last_connected)),
        ]
        values = [await self.connection.scalar(stmt) for stmt in stamps]
        found = [value for value in values if value is not None]
        return max(found) if found else None
