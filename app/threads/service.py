"""Thread use cases: section 2 (revisions, preconditions) and section 3 of the contract."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NoReturn

from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from app.auth.dependencies import Principal
from app.core.conditional import Preconditions, check_preconditions
from app.core.errors import (
    AlreadyExists,
    InvalidCursor,
    NotFound,
    RevisionMismatch,
    ThreadDeleted,
    ThreadExists,
)
from app.core.ids import new_id
from app.core.limits import check_metadata
from app.core.mergepatch import merge_patch
from app.core.pagination import decode_cursor, encode_cursor
from app.core.settings import Settings
from app.db.base import utcnow
from app.events import service as events
from app.messages.repository import MessageRepository
from app.messages.schemas import MessageIn, check_batch
from app.threads.repository import ThreadRepository
from app.threads.schemas import ThreadCreate, ThreadOut, ThreadPatch, ThreadReplace


def thread_path(thread_id: str) -> str:
    return f"/v1/threads/{thread_id}"


def messages_path(thread_id: str) -> str:
    return f"{thread_path(thread_id)}/messages"


def to_out(row: Row[Any]) -> ThreadOut:
    return ThreadOut(
        thread_id=row.thread_id, revision=row.revision, state=row.state, metadata=row.metadata,
        created_at=row.created_at, updated_at=row.updated_at, message_count=row.message_count,
    )


class ThreadService:
    def __init__(self, session: AsyncConnection, principal: Principal, settings: Settings) -> None:
        self.session = session
        self.principal = principal
        self.settings = settings
        self.repo = ThreadRepository(session, principal.tenant_id)

    def _event(self, type: str, thread_id: str, revision: int) -> None:
        events.record(self.session, self.principal, type, thread_path(thread_id),
                      revision=revision, thread_id=thread_id)

    async def _create(self, thread_id: str, state: dict[str, Any], meta: dict[str, Any],
                      now: datetime, messages: int = 0) -> Row[Any] | None:
        """Explicit create: a new id, or a tombstoned one started afresh. None if live."""
        row = await self.repo.insert(thread_id, state, meta, now, messages)
        if row is None:
            row = await self.repo.revive(thread_id, state, meta, now, messages)
        if row is not None:
            self._event("thread.created", thread_id, row.revision)
        return row

    async def refuse_write(self, thread_id: str, *, if_match_sent: bool = True) -> NoReturn:
        """Explain why a conditional write to the thread touched no row: gone (410), missing
        (404, when no If-Match named a revision) or a lost race (412)."""
        row = await self.repo.get(thread_id)
        if row is not None and row.deleted_at is not None:
            raise ThreadDeleted(f"Thread {thread_id!r} was deleted.")
        if row is None and not if_match_sent:
            raise NotFound(f"Thread {thread_id!r} does not exist.")
        raise RevisionMismatch(row.revision if row is not None else None)

    async def create(self, body: ThreadCreate) -> ThreadOut:
        check_metadata(body.metadata, self.settings)
        thread_id = body.thread_id or new_id("thr")
        row = await self._create(thread_id, body.state, body.metadata, utcnow())
        if row is None:
            raise ThreadExists(f"Thread {thread_id!r} already exists.")
        return to_out(row)

    async def get(self, thread_id: str) -> ThreadOut:
        return to_out(await self.live_row(thread_id))

    async def live_row(self, thread_id: str) -> Row[Any]:
        """The row of a thread readers may see; a tombstone reads as 404."""
        row = await self.repo.get(thread_id)
        if row is None or row.deleted_at is not None:
            raise NotFound(f"Thread {thread_id!r} does not exist.")
        return row

    async def live_pk(self, thread_id: str) -> int:
        """The key of a thread readers may see, for reading its children; 404 otherwise."""
        pk = await self.repo.live_pk(thread_id)
        if pk is None:
            raise NotFound(f"Thread {thread_id!r} does not exist.")
        return pk

    async def replace(self, thread_id: str, body: ThreadReplace,
                      pre: Preconditions) -> tuple[ThreadOut, bool]:
        """PUT: returns the thread and whether it was created. `append_messages` are stored
        under the same revision, taking the next seqs (a create holds seqs 1..n)."""
        check_metadata(body.metadata, self.settings)
        appended = body.append_messages or []
        check_batch(appended, self.settings, "/append_messages")
        count = len(appended)
        now = utcnow()
        if pre.create_only:
            row = await self._create(thread_id, body.state, body.metadata or {}, now, count)
            if row is None:
                current = await self.repo.get(thread_id)
                raise AlreadyExists(current.revision if current is not None else None)
            await self._append(row, appended, now)
            return to_out(row), True

        values: dict[str, Any] = {"state": body.state}
        if body.metadata is not None:
            values["metadata"] = body.metadata
        if pre.if_match is not None:
            expected = None if pre.if_match.any else pre.if_match.strong_revisions()
            row = await self.repo.update(thread_id, values, expected, seqs=count,
                                         live_delta=count)
            if row is None:
                await self.refuse_write(thread_id)
            self._event("thread.updated", thread_id, row.revision)
            await self._append(row, appended, now)
            return to_out(row), False

        created = await self.repo.insert(thread_id, body.state, body.metadata or {}, now, count)
        if created is not None:
            self._event("thread.created", thread_id, created.revision)
            await self._append(created, appended, now)
            return to_out(created), True
        current = await self.repo.get(thread_id)
        assert current is not None
        if current.deleted_at is not None:
            raise ThreadDeleted(
                f"Thread {thread_id!r} was deleted; send If-None-Match: * to start it afresh."
            )
        check_preconditions(pre, current.revision, method="PUT", noun="thread",
                            required=self.settings.require_preconditions)
        row = await self.repo.update(thread_id, values, seqs=count, live_delta=count)
        if row is None:
            await self.refuse_write(thread_id)
        self._event("thread.updated", thread_id, row.revision)
        await self._append(row, appended, now)
        return to_out(row), False

    async def _append(self, row: Row[Any], messages: list[MessageIn], now: datetime) -> None:
        """Store the messages of a PUT in the revision `row` was just given."""
        if not messages:
            return
        await MessageRepository(self.session, self.principal.tenant_id).append(
            row.id, row.last_seq, messages, now
        )
        events.record(self.session, self.principal, "message.appended",
                      messages_path(row.thread_id), revision=row.revision,
                      thread_id=row.thread_id)

    async def _locked_live(self, thread_id: str, pre: Preconditions, method: str) -> Row[Any]:
        """The live row, locked, after section 2's checks (404/410/412/428)."""
        row = await self.repo.get(thread_id, lock="update")
        if row is not None and row.deleted_at is not None:
            raise ThreadDeleted(f"Thread {thread_id!r} was deleted.")
        check_preconditions(pre, row.revision if row is not None else None, method=method,
                            noun="thread", required=self.settings.require_preconditions)
        if row is None:
            raise NotFound(f"Thread {thread_id!r} does not exist.")
        return row

    async def patch(self, thread_id: str, body: ThreadPatch, pre: Preconditions) -> ThreadOut:
        row = await self._locked_live(thread_id, pre, "PATCH")
        values: dict[str, Any] = {}
        # A member set to null is removed (RFC 7396); for these two that means "empty".
        if "state" in body.model_fields_set:
            values["state"] = merge_patch(row.state, body.state) if body.state is not None else {}
        if "metadata" in body.model_fields_set:
            values["metadata"] = (
                merge_patch(row.metadata, body.metadata) if body.metadata is not None else {}
            )
            check_metadata(values["metadata"], self.settings)
        updated = await self.repo.update(thread_id, values, [row.revision])
        if updated is None:  # only if the lock was not held (cannot happen on either backend)
            await self.refuse_write(thread_id)
        self._event("thread.updated", thread_id, updated.revision)
        return to_out(updated)

    async def delete(self, thread_id: str, pre: Preconditions) -> None:
        row = await self._locked_live(thread_id, pre, "DELETE")
        revision = await self.repo.delete(thread_id, row.revision, utcnow())
        if revision is None:
            await self.refuse_write(thread_id)
        self._event("thread.deleted", thread_id, revision)

    async def list(self, *, limit: int, cursor: str | None, metadata: dict[str, Any] | None,
                   updated_after: datetime | None) -> tuple[list[ThreadOut], str | None]:
        after = decode_cursor("threads", cursor, 2)
        try:
            key = (datetime.fromisoformat(after[0]), str(after[1])) if after else None
        except (TypeError, ValueError):
            raise InvalidCursor("The cursor is not one this list handed out.") from None
        rows = await self.repo.list(limit=limit + 1, after=key, metadata=metadata,
                                    updated_after=updated_after)
        page, more = rows[:limit], len(rows) > limit
        next_cursor = (
            encode_cursor("threads", [page[-1].created_at.isoformat(), page[-1].thread_id])
            if more else None
        )
        return [to_out(row) for row in page], next_cursor

    async def ensure_live(self, thread_id: str, *, create: bool = True) -> Row[Any]:
        """For writes to a thread's children (messages, agent states): the live thread,
        created with empty state if it does not exist (and `create`), 410 if tombstoned.

        On Postgres the row is held FOR KEY SHARE, so a concurrent DELETE waits for this
        transaction instead of leaving orphans or failing a foreign key.
        """
        row = await self.repo.get(thread_id, lock="share")
        if row is None and create:
            # Insert only, never revive: a tombstone committed since our read (a DELETE that
            # won the race) must answer 410, not be resurrected by a late writer.
            row = await self.repo.insert(thread_id, {}, {}, utcnow())
            if row is not None:
                self._event("thread.created", thread_id, row.revision)
            else:  # lost a race; the winner's row (live or tombstone) is there now
                row = await self.repo.get(thread_id, lock="share")
        if row is None:
            raise NotFound(f"Thread {thread_id!r} does not exist.")
        if row.deleted_at is not None:
            raise ThreadDeleted(f"Thread {thread_id!r} was deleted.")
        return row
