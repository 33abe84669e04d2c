"""What the retention sweeper finds and removes, across tenants, a bounded batch at a time.

Every statement here runs outside requests (the sweeper, `agentstate gc`) and is scoped by
a time bound and a LIMIT, never by tenant: retention is a property of the server.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ColumnElement, bindparam, delete, func, literal_column, select
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.base import UTCDateTime, table
from app.events.models import Event
from app.idempotency.models import IdempotencyKey
from app.threads.models import Thread

t, e, k = table(Thread), table(Event), table(IdempotencyKey)


class RetentionRepository:
    def __init__(self, connection: AsyncConnection) -> None:
        self.connection = connection
        self.postgres = connection.dialect.name == "postgresql"

    def _expired(self, now: datetime) -> ColumnElement[bool]:
        when = bindparam("now", now, type_=UTCDateTime())
        if self.postgres:
            return t.c.updated_at + literal_column("interval '1 second'") * t.c.ttl_seconds < when
        return (func.julianday(t.c.updated_at) + t.c.ttl_seconds / 86400.0
                < func.julianday(when))

    async def expired_threads(self, now: datetime, limit: int) -> list[tuple[str, str]]:
        """Live threads whose time to live has passed: (tenant_id, thread_id)."""
        rows = await self.connection.execute(
            select(t.c.tenant_id, t.c.thread_id)
            .where(t.c.ttl_seconds.is_not(None), t.c.deleted_at.is_(None), self._expired(now))
            .order_by(t.c.updated_at).limit(limit))
        return [(row.tenant_id, row.thread_id) for row in rows]

    def _old_events(self, before: datetime) -> tuple[ColumnElement[bool], ...]:
        # Never a tenant's newest numbered event: the next seq is max(seq) + 1, so keeping it
        # keeps seqs from ever being handed out twice. Never an unnumbered one either.
        inner = e.alias("newer")
        has_newer = (select(inner.c.id)
                     .where(inner.c.tenant_id == e.c.tenant_id, inner.c.seq > e.c.seq)
                     .exists())
        return (e.c.at < bindparam("before", before, type_=UTCDateTime()),
                e.c.seq.is_not(None), has_newer)

    async def old_event_ids(self, before: datetime, limit: int) -> list[int]:
        return list((await self.connection.scalars(
            select(e.c.id).where(*self._old_events(before)).order_by(e.c.at).limit(limit))).all())

    async def delete_events(self, ids: list[int]) -> int:
        result = await self.connection.execute(delete(e).where(e.c.id.in_(ids)))
        return int(result.rowcount or 0)

    async def old_tombstones(self, before: datetime, limit: int) -> list[int]:
        return list((await self.connection.scalars(
            select(t.c.id)
            .where(t.c.deleted_at.is_not(None),
                   t.c.deleted_at < bindparam("before", before, type_=UTCDateTime()))
            .order_by(t.c.deleted_at).limit(limit))).all())

    async def delete_threads(self, ids: list[int]) -> int:
        result = await self.connection.execute(
            delete(t).where(t.c.id.in_(ids), t.c.deleted_at.is_not(None)))
        return int(result.rowcount or 0)

    async def old_idempotency_keys(self, before: datetime, limit: int) -> list[int]:
        return list((await self.connection.scalars(
            select(k.c.id)
            .where(k.c.created_at < bindparam("before", before, type_=UTCDateTime()))
            .order_by(k.c.created_at).limit(limit))).all())

    async def delete_idempotency_keys(self, ids: list[int]) -> int:
        result = await self.connection.execute(delete(k).where(k.c.id.in_(ids)))
        return int(result.rowcount or 0)

    async def count_events(self, before: datetime) -> int:
        return int(await self.connection.scalar(
            select(func.count()).select_from(e).where(*self._old_events(before))) or 0)

    async def count_tombstones(self, before: datetime) -> int:
        return int(await self.connection.scalar(
            select(func.count()).select_from(t)
            .where(t.c.deleted_at.is_not(None),
                   t.c.deleted_at < bindparam("before", before, type_=UTCDateTime()))) or 0)

    async def count_idempotency_keys(self, before: datetime) -> int:
        return int(await self.connection.scalar(
            select(func.count()).select_from(k)
            .where(k.c.created_at < bindparam("before", before, type_=UTCDateTime()))) or 0)

    async def count_expired_threads(self, now: datetime) -> int:
        return int(await self.connection.scalar(
            select(func.count()).select_from(t)
            .where(t.c.ttl_seconds.is_not(None), t.c.deleted_at.is_(None),
                   self._expired(now))) or 0)
