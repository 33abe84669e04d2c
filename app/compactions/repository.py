"""Compaction records. Every statement is scoped by tenant."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, case, insert, literal, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.compactions.models import Compaction
from app.db.base import AnyRow, table

cp = table(Compaction)


class CompactionRepository:
    def __init__(self, connection: AsyncConnection, tenant_id: str) -> None:
        self.connection = connection
        self.tenant_id = tenant_id

    def _thread(self, thread_pk: int) -> Any:
        return (cp.c.thread_pk == thread_pk) & (cp.c.tenant_id == self.tenant_id)

    async def insert(self, values: dict[str, Any]) -> None:
        await self.connection.execute(insert(cp).values(tenant_id=self.tenant_id, **values))

    async def get(self, thread_pk: int, compaction_id: str) -> AnyRow | None:
        """A record that has not been reverted."""
        return (await self.connection.execute(
            select(cp).where(self._thread(thread_pk), cp.c.compaction_id == compaction_id,
                            cp.c.reverted_at.is_(None))
        )).first()

    async def page(self, thread_pk: int, *, after_seq: int | None, limit: int) -> list[AnyRow]:
        """Records not reverted, oldest first (by their summary's seq)."""
        stmt = select(cp).where(self._thread(thread_pk), cp.c.reverted_at.is_(None))
        if after_seq is not None:
            stmt = stmt.where(cp.c.seq > after_seq)
        return list((await self.connection.execute(stmt.order_by(cp.c.seq).limit(limit))).all())

    async def mark_reverted(self, thread_pk: int, compaction_id: str, revision: int,
                            now: datetime) -> None:
        await self.connection.execute(
            update(cp).where(self._thread(thread_pk), cp.c.compaction_id == compaction_id)
            .values(reverted_at=now, reverted_revision=revision)
        )

    async def made_by(self, thread_pk: int, revision: int) -> list[AnyRow]:
        """Every record (reverted ones too) made at or before `revision`, oldest first."""
        return list((await self.connection.execute(
            select(cp.c.compaction_id, cp.c.source_message_ids, cp.c.summary_message_id,
                   cp.c.reverted_revision)
            .where(self._thread(thread_pk), cp.c.thread_revision <= revision).order_by(cp.c.seq)
        )).all())

    async def copy(self, source_pk: int, target_pk: int, *, up_to_revision: int,
                   revision: int) -> None:
        """Copy the records made by `up_to_revision` into another thread, as they were then
        (a revert after it is undone), stored there in `revision`."""
        reverted = cp.c.reverted_revision <= up_to_revision
        columns = [column.name for column in cp.c if column.name not in (
            "thread_pk", "thread_revision", "reverted_at", "reverted_revision")]
        await self.connection.execute(insert(cp).from_select(
            ["thread_pk", "thread_revision", "reverted_at", "reverted_revision", *columns],
            select(literal(target_pk, BigInteger), literal(revision, BigInteger),
                   case((reverted, cp.c.reverted_at), else_=None),
                   case((reverted, literal(revision, BigInteger)), else_=None),
                   *(cp.c[name] for name in columns))
            .where(self._thread(source_pk), cp.c.thread_revision <= up_to_revision),
        ))
