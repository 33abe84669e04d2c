"""The audit log's rows. Every statement is scoped by tenant.

A request's events are written as the last statements of its transaction, under a per-tenant
transaction lock on Postgres, so events commit in `seq` order: a poller that reads
"everything after seq N" can never miss an event that commits later with a smaller seq.
(SQLite serialises writers anyway.) The lock is held only from these inserts to the commit.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

from sqlalchemy import bindparam, func, insert, select, union_all
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.base import AnyRow, table, utcnow
from app.db.unit import PendingEvent
from app.events.models import Event

e = table(Event)
_LOCK_NAMESPACE = 0x61677374  # "agst"
_COLUMNS = ("tenant_id", "actor", "type", "resource", "revision", "thread_id", "at")


@cache
def _locked_insert(count: int) -> Any:
    """One statement that takes the tenant's event lock and then inserts `count` rows in order.

    The lock is a MATERIALIZED CTE the inserted rows are selected from, so it is held before
    any `seq` is drawn, and the request pays no round trip of its own for it.
    """
    tenant = bindparam("lock_tenant", type_=e.c.tenant_id.type)
    lock = (
        select(func.pg_advisory_xact_lock(_LOCK_NAMESPACE, func.hashtext(tenant)).label("held"))
        .cte("event_lock")
        .prefix_with("MATERIALIZED")
    )
    selects = [
        # asyncpg binds carry their type ($1::VARCHAR), so no branch has an unknown NULL.
        select(*(bindparam(f"{name}_{i}", type_=e.c[name].type) for name in _COLUMNS))
        .select_from(lock)
        for i in range(count)
    ]
    source = selects[0] if count == 1 else union_all(*selects)
    return insert(e).from_select(_COLUMNS, source)


class EventRepository:
    def __init__(self, connection: AsyncConnection, tenant_id: str) -> None:
        self.connection = connection
        self.tenant_id = tenant_id

    async def append(self, actor: str, events: Sequence[PendingEvent]) -> None:
        """Write a transaction's events, in order, as its last statements."""
        if not events:
            return
        at = utcnow()
        rows = [{"tenant_id": self.tenant_id, "actor": actor, "type": event.type,
                 "resource": event.resource, "revision": event.revision,
                 "thread_id": event.thread_id, "at": at} for event in events]
        if self.connection.dialect.name != "postgresql":
            await self.connection.execute(insert(e), rows)
            return
        params = {f"{name}_{i}": row[name] for i, row in enumerate(rows) for name in _COLUMNS}
        await self.connection.execute(_locked_insert(len(rows)),
                                      {"lock_tenant": self.tenant_id, **params})

    async def page(self, *, after_seq: int, limit: int, thread_id: str | None,
                   types: list[str] | None) -> list[AnyRow]:
        """Events after `after_seq`, oldest first. Seqs commit in order (see above), so
        reading past the newest one never skips an event that commits later."""
        stmt = select(e).where(e.c.tenant_id == self.tenant_id, e.c.seq > after_seq)
        if thread_id is not None:
            stmt = stmt.where(e.c.thread_id == thread_id)
        if types:
            stmt = stmt.where(e.c.type.in_(types))
        stmt = stmt.order_by(e.c.seq).limit(limit)
        return list((await self.connection.execute(stmt)).all())
