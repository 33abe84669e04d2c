"""The audit log's rows. Every statement is scoped by tenant.

Writers take no lock for their events (docs/events.md). On Postgres an event is inserted with
`seq` NULL; the sequencer (`sequence`, the SQL function `agentstate_sequence_events` of the
migrations) numbers committed events after the tenant's newest seq, under a short per-tenant
lock of its own held to its commit, so seqs become visible as a growing prefix 1..N: a reader
never sees N+1 before N, and nothing is ever numbered behind a cursor. On SQLite writers are
serialised (BEGIN IMMEDIATE), so the insert numbers its rows itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

from sqlalchemy import BigInteger, bindparam, column, func, insert, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db import direct
from app.db.base import AnyRow, table, utcnow
from app.db.unit import PendingEvent
from app.events.models import Event

e = table(Event)
_COLUMNS = ("tenant_id", "actor", "type", "resource", "revision", "thread_id", "at")
SEQUENCE_BATCH = 5000
_SEQUENCE = (text("SELECT agentstate_sequence_events(:tenant, :limit) AS head")
             .columns(column("head", BigInteger)))
# One index probe per tenant (the newest seq of each), not a scan of their events.
_HEADS = (text("SELECT t.tenant, (SELECT max(seq) FROM events WHERE tenant_id = t.tenant) AS head"
               " FROM unnest(CAST(:tenants AS text[])) AS t(tenant)")
          .columns(column("tenant"), column("head", BigInteger)))
_OUT = (e.c.seq, e.c.at, e.c.type, e.c.thread_id, e.c.resource, e.c.revision, e.c.actor)


# Rows without a seq (the sequencer numbers them), one parameter set a row: executed as an
# executemany, so the statement is compiled once. A multi-row VALUES built per request is never
# found in SQLAlchemy's compiled cache ("multivalues are simply not cacheable"): it was compiled
# anew on every write.
_POSTGRES_INSERT = insert(e)


def written_by(rows: Any) -> Any:
    """Postgres: an INSERT of the events `rows` selects (one row per event, the values of
    `tenant_id, actor, type, resource, revision, thread_id, at` in that order, in the order
    the sequencer is to number them), to run as a CTE of the change's own statement: its
    events in the same round trip, `seq` NULL as `append` writes them."""
    return insert(e).from_select(list(_COLUMNS), rows)


@cache
def _sqlite_insert() -> Any:
    """One row numbered after the tenant's newest: writers are serialised, so the subquery
    sees every committed event of the tenant and the rows of this transaction before it."""
    values = {name: bindparam(f"v_{name}", type_=e.c[name].type) for name in _COLUMNS}
    head = (select(func.coalesce(func.max(e.c.seq), 0) + 1)
            .where(e.c.tenant_id == values["tenant_id"]).scalar_subquery())
    return insert(e).values(**values, seq=head)


class EventRepository:
    def __init__(self, connection: AsyncConnection, tenant_id: str) -> None:
        self.connection = connection
        self.tenant_id = tenant_id

    async def append(self, actor: str, events: Sequence[PendingEvent]) -> None:
        """Write a transaction's events, in order, as its last statements (those the
        change's own statement wrote already, `stored`, are not written again)."""
        events = [event for event in events if not event.stored]
        if not events:
            return
        at = utcnow()
        rows = [{"tenant_id": self.tenant_id, "actor": actor, "type": event.type,
                 "resource": event.resource, "revision": event.revision,
                 "thread_id": event.thread_id, "at": at} for event in events]
        if self.connection.dialect.name != "postgresql":
            await self.connection.execute(
                _sqlite_insert(), [{f"v_{name}": row[name] for name in _COLUMNS} for row in rows])
            return
        # In order: the ids the rows draw are the order the sequencer numbers them in.
        await direct.execute_many(self.connection, _POSTGRES_INSERT, rows)

    async def sequence(self) -> int:
        """Number the tenant's committed events that have no seq yet and return the tenant's
        newest seq: everything committed before this call is visible to reads after it. One round trip, its own
        transaction: the connection must be a read connection (in autocommit, or through a
        transaction pooler in a transaction this commits). SQLite numbers at insert time, so
        this only reads the newest seq."""
        if self.connection.dialect.name != "postgresql":
            return await self.head()
        # A tenant with more than a batch ready gets the rest on the next call: every
        # reader and the feed's sequencing pass call this before they read.
        row = await direct.first(self.connection, _SEQUENCE,
                                 {"tenant": self.tenant_id, "limit": SEQUENCE_BATCH})
        # Through a pooler the read is a transaction: commit the numbering and free the
        # tenant's sequencing lock now (in autocommit this sends nothing).
        await self.connection.commit()
        return int(row[0] or 0)

    async def heads(self, tenants: Sequence[str]) -> dict[str, int]:
        """The newest seq of each of `tenants` (without numbering anything), one statement:
        what a server without a LISTEN connection polls."""
        rows = (await self.connection.execute(_HEADS, {"tenants": list(tenants)})).all()
        return {row.tenant: int(row.head or 0) for row in rows}

    async def head(self) -> int:
        """The tenant's newest seq (0 before its first event)."""
        return int(await self.connection.scalar(
            select(func.coalesce(func.max(e.c.seq), 0)).where(e.c.tenant_id == self.tenant_id))
            or 0)

    async def page(self, *, after_seq: int, limit: int, thread_id: str | None,
                   types: list[str] | None, resource_prefix: str | None = None) -> list[AnyRow]:
        """Numbered events after `after_seq`, oldest first. Seqs become visible in order
        (see above), so reading past the newest one never skips an event seen later."""
        stmt = select(*_OUT).where(e.c.tenant_id == self.tenant_id, e.c.seq > after_seq)
        if thread_id is not None:
            stmt = stmt.where(e.c.thread_id == thread_id)
        if types:
            stmt = stmt.where(e.c.type.in_(types))
        if resource_prefix:
            stmt = stmt.where(e.c.resource.startswith(resource_prefix, autoescape=True))
        stmt = stmt.order_by(e.c.seq).limit(limit)
        return list((await self.connection.execute(stmt)).all())

    async def seq_at_id(self, event_id: int) -> int:
        """The tenant's seq at a table-wide event id (a cursor from before the per-tenant
        feed: the migration numbered each tenant's events in id order)."""
        return int(await self.connection.scalar(
            select(func.coalesce(func.max(e.c.seq), 0))
            .where(e.c.tenant_id == self.tenant_id, e.c.id <= event_id)) or 0)
