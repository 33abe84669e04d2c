"""Export: the whole database in one read transaction, streamed as records.

The read transaction is REPEATABLE READ on Postgres; on SQLite the deferred read transaction
pins a WAL snapshot. Every query runs over a server-side cursor, so memory does not grow with
the database. `Exporter` is also what import, copy and verify compare threads with (a
checksum of a thread's record lines).
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import IO, Any

from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.base import AnyRow
from app.db.engine import Database
from app.portability.format import (
    CHILDREN,
    END,
    EVENT,
    KINDS,
    THREAD,
    THREAD_END,
    Counts,
    Header,
    Kind,
    encode,
)
from app.portability.repository import PortabilityRepository
from app.portability.secrets import SecretsOut

# Told how many records were done since it was last called.
Progress = Callable[[int], None]


def row_record(kind: Kind, row: AnyRow, thread_id: str | None = None) -> dict[str, Any]:
    """A stored row as a record of its kind (sealed fields as stored)."""
    values = row._mapping
    record: dict[str, Any] = {"kind": kind.name}
    for name in kind.fields:
        record[name] = thread_id if name in kind.virtual else values[name]
    return record




@asynccontextmanager
async def snapshot(db: Database) -> AsyncIterator[AsyncConnection]:
    """One read transaction over the whole database, so the tables agree with each other."""
    async with db.engine.connect() as connection:
        if db.dialect == "postgresql":
            await connection.execution_options(isolation_level="REPEATABLE READ",
                                               postgresql_readonly=True)
        async with connection.begin():
            yield connection


class Exporter:
    def __init__(self, connection: AsyncConnection, secrets: SecretsOut) -> None:
        self.repo = PortabilityRepository(connection)
        self.secrets = secrets

    def record(self, kind: Kind, row: AnyRow, thread_id: str | None = None) -> dict[str, Any]:
        record = row_record(kind, row, thread_id)
        for name in kind.sealed:
            record[name] = self.secrets.field(record["tenant_id"], record["server_name"],
                                              record[name])
        return record

    async def bundle(self, row: AnyRow) -> AsyncIterator[dict[str, Any]]:
        """A thread's records: the thread, then its children kind by kind."""
        yield self.record(THREAD, row)
        for kind in CHILDREN:
            async for child in self.repo.children(kind, row.id, (row.tenant_id, row.thread_id)):
                yield self.record(kind, child, row.thread_id)

    async def records(self) -> AsyncIterator[dict[str, Any]]:
        """Every record of the database in file order, with the thread_end and end lines."""
        total = 0
        for kind in KINDS:
            if kind is THREAD:
                async for row in self.repo.stream(THREAD):
                    counts = Counts()
                    async for record in self.bundle(row):
                        counts.add(record["kind"])
                        yield record
                    total += counts.total
                    yield {"kind": THREAD_END, "tenant_id": row.tenant_id,
                           "thread_id": row.thread_id, "records": counts.as_record()}
            elif kind.scope != "thread":
                async for row in self.repo.stream(kind):
                    total += 1
                    yield self.record(kind, row)
        async for row in self.repo.loose_events():
            total += 1
            yield self.record(EVENT, row)
        yield {"kind": END, "records": total}

    async def digest(self, row: AnyRow) -> tuple[str, dict[str, int]]:
        """A thread's checksum (sha256 of its record lines) and its records per kind."""
        hasher, counts = hashlib.sha256(), Counts()
        async for record in self.bundle(row):
            hasher.update(encode(record).encode() + b"\n")
            counts.add(record["kind"])
        return hasher.hexdigest(), counts.as_record()

    async def total(self) -> int:
        return sum([await self.repo.count(kind) for kind in KINDS])


async def export(db: Database, out: IO[str], header: Header, secrets: SecretsOut,
                 progress: Progress | None = None) -> int:
    """Write the whole database; returns the number of records."""
    written = 0
    async with snapshot(db) as connection:
        out.write(header.line() + "\n")
        async for record in Exporter(connection, secrets).records():
            out.write(encode(record) + "\n")
            if record["kind"] == END:
                written = record["records"]
            elif progress is not None and record["kind"] != THREAD_END:
                progress(1)
    return written
