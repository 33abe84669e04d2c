"""API key rows. The one repository that is not scoped by tenant: a key is what names the
tenant, and the CLI manages the keys of every tenant."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import insert, inspect, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.auth.models import ApiKey
from app.db.base import AnyRow, table

ak = table(ApiKey)


class ApiKeyRepository:
    def __init__(self, connection: AsyncConnection) -> None:
        self.connection = connection

    async def insert(self, **values: Any) -> None:
        await self.connection.execute(insert(ak).values(**values))

    async def get(self, key_id: str) -> AnyRow | None:
        stmt = select(ak.c.tenant_id, ak.c.scopes, ak.c.hash, ak.c.revoked_at).where(
            ak.c.key_id == key_id
        )
        return (await self.connection.execute(stmt)).first()

    async def table_exists(self) -> bool:
        """False on a database not migrated as far as the keys' table."""
        return await self.connection.run_sync(lambda sync: inspect(sync).has_table(ak.name))

    async def any_exist(self) -> bool:
        """Revoked keys count: revoking the last key must not open the server to everyone."""
        return (await self.connection.execute(select(ak.c.id).limit(1))).first() is not None

    async def list(self, tenant_id: str | None) -> list[AnyRow]:
        stmt = select(ak.c.key_id, ak.c.tenant_id, ak.c.name, ak.c.scopes, ak.c.created_at,
                      ak.c.revoked_at).order_by(ak.c.tenant_id, ak.c.created_at, ak.c.key_id)
        if tenant_id is not None:
            stmt = stmt.where(ak.c.tenant_id == tenant_id)
        return list((await self.connection.execute(stmt)).all())

    async def revoke(self, key_id: str, now: datetime) -> bool:
        """Mark a live key revoked; False if there is no such live key."""
        stmt = (
            update(ak)
            .where(ak.c.key_id == key_id, ak.c.revoked_at.is_(None))
            .values(revoked_at=now)
            .returning(ak.c.id)
        )
        return (await self.connection.execute(stmt)).first() is not None
