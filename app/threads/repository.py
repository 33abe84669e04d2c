"""Thread rows. Every statement is scoped by tenant; revisions change only inside SQL."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Row, and_, delete, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.base import utcnow
from app.db.dialect import dialect_name, insert_ignoring_conflicts, json_contains
from app.threads.models import Thread

t = Thread.__table__
Lock = Literal["update", "share"] | None


class ThreadRepository:
    def __init__(self, session: AsyncSession, tenant_id: str) -> None:
        self.session = session
        self.tenant_id = tenant_id

    def _key(self, thread_id: str) -> Any:
        return and_(t.c.tenant_id == self.tenant_id, t.c.thread_id == thread_id)

    async def get(self, thread_id: str, lock: Lock = None) -> Row[Any] | None:
        """The row (live or tombstone). `lock` takes a row lock on Postgres; SQLite's write
        transactions are serialised by BEGIN IMMEDIATE already."""
        stmt = select(t).where(self._key(thread_id))
        if lock and dialect_name(self.session) == "postgresql":
            # "share" (FOR KEY SHARE) keeps the row from being deleted under a child insert
            # without blocking appends; "update" (FOR NO KEY UPDATE) excludes other writers.
            stmt = stmt.with_for_update(read=lock == "share", key_share=True)
        return (await self.session.execute(stmt)).first()

    async def live_pk(self, thread_id: str) -> int | None:
        """The key of a live thread, for reads of its children: the state is not fetched."""
        return await self.session.scalar(
            select(t.c.id).where(self._key(thread_id), t.c.deleted_at.is_(None))
        )

    async def insert(self, thread_id: str, state: dict[str, Any], meta: dict[str, Any],
                     now: datetime, messages: int = 0) -> Row[Any] | None:
        """Create at revision 1 (holding seqs 1..`messages`); None if the id exists (live or
        tombstone)."""
        stmt = (
            insert_ignoring_conflicts(self.session, t, ["tenant_id", "thread_id"])
            .values(tenant_id=self.tenant_id, thread_id=thread_id, revision=1, state=state,
                    metadata=meta, created_at=now, updated_at=now, last_seq=messages,
                    message_count=messages)
            .returning(*t.c)
        )
        return (await self.session.execute(stmt)).first()

    async def revive(self, thread_id: str, state: dict[str, Any], meta: dict[str, Any],
                     now: datetime, messages: int = 0) -> Row[Any] | None:
        """Start a tombstoned id afresh; its revision continues after the deletion's."""
        stmt = (
            update(t)
            .where(self._key(thread_id), t.c.deleted_at.is_not(None))
            .values(revision=t.c.revision + 1, state=state, metadata=meta, created_at=now,
                    updated_at=now, deleted_at=None, last_seq=messages, message_count=messages)
            .returning(*t.c)
        )
        return (await self.session.execute(stmt)).first()

    async def update(self, thread_id: str, values: dict[str, Any],
                     expected: Iterable[int] | None = None) -> Row[Any] | None:
        """Bump the revision of a live thread, only if it is one of `expected` (when given).

        Check and increment are one statement, so two writers holding the same revision
        cannot both succeed, whichever process or server they run in.
        """
        stmt = self._bump(thread_id, values, expected).returning(*t.c)
        return (await self.session.execute(stmt)).first()

    def _bump(self, thread_id: str, values: dict[str, Any],
              expected: Iterable[int] | None) -> Any:
        stmt = update(t).where(self._key(thread_id), t.c.deleted_at.is_(None))
        if expected is not None:
            stmt = stmt.where(t.c.revision.in_(list(expected)))
        return stmt.values(revision=t.c.revision + 1, updated_at=utcnow(), **values)

    @staticmethod
    def message_counters(seqs: int, live_delta: int) -> dict[str, Any]:
        """Values for `update`: hand out `seqs` new message seqs, change the live count."""
        return {"last_seq": t.c.last_seq + seqs, "message_count": t.c.message_count + live_delta}

    async def advance(self, thread_id: str, *, seqs: int, live_delta: int,
                      expected: Iterable[int] | None = None) -> Row[Any] | None:
        """One revision of a live thread for a message write: the row comes back with the
        last of the `seqs` new seqs in `last_seq`, and stays locked until commit, so
        concurrent appends queue here and seqs never gap or repeat. Only the keys come back,
        not the state, so an append never pays for the size of the thread's state."""
        stmt = self._bump(thread_id, self.message_counters(seqs, live_delta), expected)
        stmt = stmt.returning(t.c.id, t.c.thread_id, t.c.revision, t.c.last_seq)
        return (await self.session.execute(stmt)).first()

    async def delete(self, thread_id: str, revision: int, now: datetime) -> int | None:
        """Delete a live thread at `revision` (children go by ON DELETE CASCADE) and leave a
        tombstone that took one revision. Returns the tombstone's revision."""
        gone = await self.session.execute(
            delete(t)
            .where(self._key(thread_id), t.c.deleted_at.is_(None), t.c.revision == revision)
            .returning(t.c.revision)
        )
        if gone.first() is None:
            return None
        await self.session.execute(
            insert(t).values(
                tenant_id=self.tenant_id, thread_id=thread_id, revision=revision + 1, state={},
                metadata={}, created_at=now, updated_at=now, deleted_at=now, last_seq=0,
                message_count=0,
            )
        )
        return revision + 1

    async def list(self, *, limit: int, after: tuple[datetime, str] | None,
                   metadata: dict[str, Any] | None,
                   updated_after: datetime | None) -> list[Row[Any]]:
        """Live threads, newest created first, keyset-paged on (created_at, thread_id)."""
        stmt = select(t).where(t.c.tenant_id == self.tenant_id, t.c.deleted_at.is_(None))
        if metadata:
            stmt = stmt.where(json_contains(self.session, t.c.metadata, metadata))
        if updated_after is not None:
            stmt = stmt.where(t.c.updated_at > updated_after)
        if after is not None:
            created, thread_id = after
            stmt = stmt.where(
                or_(t.c.created_at < created,
                    and_(t.c.created_at == created, t.c.thread_id < thread_id))
            )
        stmt = stmt.order_by(t.c.created_at.desc(), t.c.thread_id.desc()).limit(limit)
        return list((await self.session.execute(stmt)).all())
