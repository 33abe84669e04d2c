"""SQL for resources kept as one row per key with a revision and a tombstone.

Agent states and MCP servers are stored this way: a DELETE sets `deleted_at` instead of
removing the row, so a later create continues the revision sequence and an ETag is never
reused for the same key. Every statement is scoped by tenant; revisions change only in SQL.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import ColumnElement, Table, and_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.base import AnyRow, utcnow
from app.db.dialect import dialect_name, insert_ignoring_conflicts

Key = tuple[str, ...]


class RevisionedRepository:
    table: ClassVar[Table]
    # The columns that, with tenant_id, name one resource (a unique constraint).
    key_columns: ClassVar[tuple[str, ...]]

    def __init__(self, connection: AsyncConnection, tenant_id: str) -> None:
        self.connection = connection
        self.tenant_id = tenant_id

    def _key(self, key: Key) -> ColumnElement[bool]:
        c = self.table.c
        return and_(c.tenant_id == self.tenant_id,
                    *(c[name] == value for name, value in zip(self.key_columns, key, strict=True)))

    def _live(self) -> ColumnElement[bool]:
        return and_(self.table.c.tenant_id == self.tenant_id, self.table.c.deleted_at.is_(None))

    def _gone(self) -> ColumnElement[bool]:
        """A row a create revives: a tombstone."""
        return self.table.c.deleted_at.is_not(None)

    async def get(self, key: Key, *, lock: bool = False) -> AnyRow | None:
        """The row (live or tombstone). `lock` holds it FOR NO KEY UPDATE on Postgres; SQLite's
        write transactions are serialised by BEGIN IMMEDIATE already."""
        stmt = select(self.table).where(self._key(key))
        if lock and dialect_name(self.connection) == "postgresql":
            stmt = stmt.with_for_update(key_share=True)
        return (await self.connection.execute(stmt)).first()

    async def create(self, key: Key, values: dict[str, Any], now: datetime) -> AnyRow | None:
        """Revision 1 for a new key; a tombstoned key continues after its deletion's revision.
        None if the key is live (a concurrent create won)."""
        t = self.table
        inserted = await self.connection.execute(
            insert_ignoring_conflicts(dialect_name(self.connection), t,
                                      ["tenant_id", *self.key_columns])
            .values(tenant_id=self.tenant_id, **dict(zip(self.key_columns, key, strict=True)),
                    revision=1, created_at=now, updated_at=now, **values)
            .returning(*t.c)
        )
        row = inserted.first()
        if row is not None:
            return row
        revived = await self.connection.execute(
            update(t)
            .where(self._key(key), self._gone())
            .values(revision=t.c.revision + 1, created_at=now, updated_at=now, deleted_at=None,
                    **values)
            .returning(*t.c)
        )
        return revived.first()

    async def update(self, key: Key, values: dict[str, Any], expected: int) -> AnyRow | None:
        """Bump the revision of a live row that is still at `expected`."""
        t = self.table
        stmt = (
            update(t)
            .where(self._key(key), t.c.deleted_at.is_(None), t.c.revision == expected)
            .values(revision=t.c.revision + 1, updated_at=utcnow(), **values)
            .returning(*t.c)
        )
        return (await self.connection.execute(stmt)).first()

    async def tombstone(self, key: Key, expected: int, values: dict[str, Any],
                        now: datetime) -> int | None:
        """Delete a live row at `expected`, keeping the key; the deletion takes one revision.
        `values` blanks the content (nothing of a deleted resource stays readable)."""
        t = self.table
        stmt = (
            update(t)
            .where(self._key(key), t.c.deleted_at.is_(None), t.c.revision == expected)
            .values(revision=t.c.revision + 1, updated_at=now, deleted_at=now, **values)
            .returning(t.c.revision)
        )
        revision: int | None = (await self.connection.execute(stmt)).scalar()
        return revision
