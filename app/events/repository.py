"""Reading the audit log. Every statement is scoped by tenant."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Row, select
from sqlalchemy.ext.asyncio import AsyncConnection

from app.events.models import Event

e = Event.__table__


class EventRepository:
    def __init__(self, session: AsyncConnection, tenant_id: str) -> None:
        self.session = session
        self.tenant_id = tenant_id

    async def list(self, *, after_seq: int, limit: int, thread_id: str | None,
                   types: list[str] | None) -> list[Row[Any]]:
        """Events after `after_seq`, oldest first. Seqs commit in order (see service.py), so
        reading past the newest one never skips an event that commits later."""
        stmt = select(e).where(e.c.tenant_id == self.tenant_id, e.c.seq > after_seq)
        if thread_id is not None:
            stmt = stmt.where(e.c.thread_id == thread_id)
        if types:
            stmt = stmt.where(e.c.type.in_(types))
        stmt = stmt.order_by(e.c.seq).limit(limit)
        return list((await self.session.execute(stmt)).all())
