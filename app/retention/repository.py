"""What the retention sweeper finds and removes, across tenants, a bounded batch at a time.

Every statement here runs outside requests (the sweeper, `agentstate gc`) and is scoped by
a time bound and a LIMIT, never by tenant: retention is a property of the server.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, bindparam, delete, func, literal_column, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.base import UTCDateTime, table
from app.events.models import Event
from app.idempotency.models import IdempotencyKey, TenantIdempotencyKey
from app.store.models import StoreItem, StoreVector
from app.threads.models import Thread

t, e, k = table(Thread), table(Event), table(IdempotencyKey)
si, sv, tk = table(StoreItem), table(StoreVector), table(TenantIdempotencyKey)


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

    async def old_idempotency_keys(self, before: datetime, limit: int, *,
                                   of_tenants: bool = False) -> list[int]:
        """Of threads' keys, or (`of_tenants`) of the keys of writes outside threads."""
        keys = tk if of_tenants else k
        return list((await self.connection.scalars(
            select(keys.c.id)
            .where(keys.c.created_at < bindparam("before", before, type_=UTCDateTime()))
            .order_by(keys.c.created_at).limit(limit))).all())

    async def delete_idempotency_keys(self, ids: list[int], *, of_tenants: bool = False) -> int:
        keys = tk if of_tenants else k
        result = await self.connection.execute(delete(keys).where(keys.c.id.in_(ids)))
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
        total = 0
        for keys in (k, tk):
            total += int(await self.connection.scalar(
                select(func.count()).select_from(keys)
                .where(keys.c.created_at < bindparam("before", before, type_=UTCDateTime())))
                or 0)
        return total

    async def count_expired_threads(self, now: datetime) -> int:
        return int(await self.connection.scalar(
            select(func.count()).select_from(t)
            .where(t.c.ttl_seconds.is_not(None), t.c.deleted_at.is_(None),
                   self._expired(now))) or 0)

    # --- store items: expired ones blanked into tombstones, old tombstones removed --------

    def _expired_items(self, now: datetime) -> tuple[ColumnElement[bool], ...]:
        return (si.c.expires_at.is_not(None), si.c.deleted_at.is_(None),
                si.c.expires_at <= bindparam("now", now, type_=UTCDateTime()))

    async def expired_store_items(self, now: datetime, limit: int) -> list[Any]:
        """Live store items whose time to live has passed: (id, tenant, namespace, key,
        revision, expires_at)."""
        return list((await self.connection.execute(
            select(si.c.id, si.c.tenant_id, si.c.namespace, si.c.key, si.c.revision,
                   si.c.expires_at)
            .where(*self._expired_items(now)).order_by(si.c.expires_at).limit(limit))).all())

    async def expire_store_items(self, rows: list[Any], now: datetime) -> list[Any]:
        """Blank them into tombstones (deleted at their expiry) with their vectors, checking
        again that they are still expired: the ones this call expired."""
        expired = []
        for row in rows:
            done = await self.connection.execute(
                update(si).where(si.c.id == row.id, *self._expired_items(now))
                .values(deleted_at=si.c.expires_at, value={}, index_fields=None,
                        search_text=None, ttl_ms=None, expires_at=None))
            if done.rowcount:
                await self.connection.execute(delete(sv).where(
                    sv.c.tenant_id == row.tenant_id, sv.c.namespace == row.namespace,
                    sv.c.key == row.key))
                expired.append(row)
        return expired

    async def old_store_tombstones(self, before: datetime, limit: int) -> list[int]:
        return list((await self.connection.scalars(
            select(si.c.id)
            .where(si.c.deleted_at.is_not(None),
                   si.c.deleted_at < bindparam("before", before, type_=UTCDateTime()))
            .order_by(si.c.deleted_at).limit(limit))).all())

    async def delete_store_items(self, ids: list[int]) -> int:
        result = await self.connection.execute(
            delete(si).where(si.c.id.in_(ids), si.c.deleted_at.is_not(None)))
        return int(result.rowcount or 0)

    async def count_expired_store_items(self, now: datetime) -> int:
        return int(await self.connection.scalar(
            select(func.count()).select_from(si).where(*self._expired_items(now))) or 0)

    async def count_store_tombstones(self, before: datetime) -> int:
        return int(await self.connection.scalar(
            select(func.count()).select_from(si)
            .where(si.c.deleted_at.is_not(None),
                   si.c.deleted_at < bindparam("before", before, type_=UTCDateTime()))) or 0)
