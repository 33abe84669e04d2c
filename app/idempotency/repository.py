"""Stored first responses to `Idempotency-Key`s. Every statement is scoped by tenant."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.base import AnyRow, table
from app.db.dialect import dialect_name
from app.idempotency.models import IdempotencyKey, TenantIdempotencyKey
from app.threads.models import Thread

k = table(IdempotencyKey)
tk = table(TenantIdempotencyKey)
t = table(Thread)
_PURGE_BATCH = 100


class IdempotencyRepository:
    def __init__(self, connection: AsyncConnection, tenant_id: str) -> None:
        self.connection = connection
        self.tenant_id = tenant_id

    async def try_claim(self, lock_key: int) -> bool:
        """Postgres: take the key's transaction-scoped advisory lock, never waiting; False if
        another transaction holds it. SQLite's writers are serialised: always True."""
        if dialect_name(self.connection) != "postgresql":
            return True
        return bool(await self.connection.scalar(
            select(func.pg_try_advisory_xact_lock(lock_key))))

    async def get(self, thread_id: str | None, endpoint: str, key: str) -> AnyRow | None:
        """The stored response for a key of a live thread (None: of the tenant)."""
        if thread_id is None:
            return (await self.connection.execute(
                select(tk.c.id, tk.c.request_hash, tk.c.status, tk.c.response, tk.c.created_at)
                .where(tk.c.tenant_id == self.tenant_id, tk.c.endpoint == endpoint,
                       tk.c.key == key))).first()
        return (await self.connection.execute(
            select(k.c.id, k.c.request_hash, k.c.status, k.c.response, k.c.created_at)
            .join(t, t.c.id == k.c.thread_pk)
            .where(t.c.tenant_id == self.tenant_id, t.c.thread_id == thread_id,
                   t.c.deleted_at.is_(None), k.c.tenant_id == self.tenant_id,
                   k.c.endpoint == endpoint, k.c.key == key)
        )).first()

    async def delete(self, row_id: int, *, of_tenant: bool = False) -> None:
        keys = tk if of_tenant else k
        await self.connection.execute(delete(keys).where(keys.c.id == row_id))

    async def forget_thread(self, thread_pk: int) -> None:
        """Drop a thread's stored responses: they quote messages that were just removed or
        redacted, whose old content must not stay in the database."""
        await self.connection.execute(
            delete(k).where(k.c.tenant_id == self.tenant_id, k.c.thread_pk == thread_pk))

    async def purge_expired(self, before: datetime, *, of_tenant: bool = False) -> None:
        """Lazy expiry, a bounded batch at a time, so no write ever pays for a backlog. Two
        statements, not DELETE ... IN (subquery), which Postgres may answer with a seq scan."""
        keys = tk if of_tenant else k
        expired = (await self.connection.scalars(
            select(keys.c.id)
            .where(keys.c.tenant_id == self.tenant_id, keys.c.created_at < before)
            .order_by(keys.c.created_at)
            .limit(_PURGE_BATCH)
        )).all()
        if expired:
            await self.connection.execute(delete(keys).where(keys.c.id.in_(expired)))

    async def insert(self, **values: Any) -> None:
        """A key of a thread (`thread_pk`), or of the tenant (`thread_pk=None`)."""
        if values.get("thread_pk", 0) is None:
            del values["thread_pk"]
            await self.connection.execute(insert(tk).values(tenant_id=self.tenant_id, **values))
            return
        await self.connection.execute(insert(k).values(tenant_id=self.tenant_id, **values))
