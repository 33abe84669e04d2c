"""Compaction records. Every statement is scoped by tenant."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.compactions.models import Compaction
from app.db.base import AnyRow, table

c = table(Compaction)


class CompactionRepository:
    def __init__(self, connection: AsyncConnection, tenant_id: str) -> None:
        self.connection = connection
        self.tenant_id = tenant_id

    def _thread(self, thread_pk: int) -> Any:
        return (c.c.thread_pk == thread_pk) & (c.c.tenant_id == self.tenant_id)

    async def insert(self, values: dict[str, Any]) -> None:
        await self.connection.execute(insert(c).values(tenant_id=self.tenant_id, **values))

    async def get(self, thread_pk: int, compaction_id: str) -> AnyRow | None:
        """A record that has not been reverted."""
        return (await self.connection.execute(
            select(c).where(self._thread(thread_pk), c.c.compaction_id == compaction_id,
                            c.c.reverted_at.is_(None))
        )).first()

    async def page(self, thread_pk: int, *, after_seq: int | None, limit: int) -> list[AnyRow]:
        """Records not reverted, oldest first (by their summary's seq)."""
        stmt = select(c).where(self._thread(thread_pk), c.c.reverted_at.is_(None))
        if after_seq is not None:
            stmt = stmt.where(c.c.seq > after_seq)
        return list((await self.connection.execute(stmt.order_by(c.c.seq).limit(limit))).all())

    async def mark_reverted(self, thread_pk: int, compaction_id: str, now: datetime) -> None:
        await self.connection.execute(
            update(c).where(self._thread(thread_pk), c.c.compaction_id == compaction_id)
            .values(reverted_at=now)
        )
