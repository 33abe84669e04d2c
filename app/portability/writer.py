"""Writing one imported thread with all its records, a batch of rows per INSERT."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from app.portability.format import CHILDREN, EVENT, THREAD, Kind
from app.portability.repository import PortabilityRepository

BATCH = 1000  # rows per INSERT


class SeqTaken(Exception):
    def __init__(self, seq: int) -> None:
        super().__init__(f"event seq {seq} is taken by another event in this database")


class ThreadWriter:
    """Stores one thread's records in the caller's transaction, a batch per INSERT."""

    def __init__(self, connection: AsyncConnection) -> None:
        self.connection = connection
        self.repo = PortabilityRepository(connection)
        self.pending: dict[str, list[dict[str, Any]]] = {}
        self.pk: int | None = None
        self.rows = 0

    async def start(self, record: dict[str, Any]) -> bool:
        """Insert the thread row; False if the thread exists."""
        self.pk = await self.repo.insert_thread(
            {column.name: record[column.name] for column in THREAD.columns})
        self.rows = 1
        return self.pk is not None

    async def add(self, kind: Kind, record: dict[str, Any]) -> None:
        row = {column.name: record[column.name] for column in kind.columns}
        if kind.thread_fk is not None:
            row[kind.thread_fk] = self.pk
        rows = self.pending.setdefault(kind.name, [])
        rows.append(row)
        if len(rows) >= BATCH:
            await self.flush(kind)

    async def flush(self, kind: Kind) -> None:
        rows = self.pending.pop(kind.name, [])
        if not rows:
            return
        if kind is EVENT:
            for tenant in sorted({row["tenant_id"] for row in rows}):
                await self.repo.hold_event_seqs(tenant)
                taken = await self.repo.taken_seqs(
                    tenant, [row["seq"] for row in rows if row["tenant_id"] == tenant])
                if taken:
                    raise SeqTaken(taken[0])
        await self.repo.insert(kind, rows)
        self.rows += len(rows)

    async def finish(self) -> None:
        for kind in CHILDREN:
            await self.flush(kind)
