"""Message use cases: API.md section 4 (append, read) and `?include=messages` of section 3."""

from __future__ import annotations

from typing import Any, Literal

from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from app.auth.dependencies import Principal
from app.core.conditional import ETagList
from app.core.errors import InvalidCursor, NotFound, ThreadDeleted
from app.core.pagination import decode_cursor, encode_cursor
from app.core.settings import Settings
from app.db.base import utcnow
from app.events import service as events
from app.messages.idempotency import IdempotencyRequest, IdempotencyStore
from app.messages.repository import MessageRepository
from app.messages.schemas import AppendOut, MessageIn, MessageOut, check_batch
from app.threads.repository import ThreadRepository
from app.threads.schemas import ThreadWithMessages
from app.threads.service import ThreadService, messages_path
from app.threads.service import to_out as thread_out

View = Literal["live", "full"]
ABOVE_ANY_SEQ = 2**62
Order = Literal["asc", "desc"]


def to_out(row: Row[Any] | dict[str, Any]) -> MessageOut:
    r = row._mapping if isinstance(row, Row) else row
    compacted = r["status"] == "compacted"
    return MessageOut(
        id=r["message_id"], seq=r["seq"], position=r["position"], role=r["role"],
        content=r["content"], name=r["name"], tool_calls=r["tool_calls"],
        tool_call_id=r["tool_call_id"], agent_name=r["agent_name"], metadata=r["metadata"],
        created_at=r["created_at"], status=r["status"],
        compaction_id=r["compacted_by"] if compacted else r["summary_of"],
    )


def expected_revisions(if_match: ETagList | None) -> set[int] | None:
    """What a conditional UPDATE may find: None for "any revision" (no header, or `*`)."""
    return None if if_match is None or if_match.any else if_match.strong_revisions()


class MessageService:
    def __init__(self, session: AsyncConnection, principal: Principal, settings: Settings) -> None:
        self.session = session
        self.principal = principal
        self.settings = settings
        self.repo = MessageRepository(session, principal.tenant_id)
        self.threads = ThreadRepository(session, principal.tenant_id)
        self.thread_service = ThreadService(session, principal, settings)

    async def append(self, thread_id: str, messages: list[MessageIn], if_match: ETagList | None,
                     idempotency: IdempotencyRequest | None) -> tuple[dict[str, Any], bool]:
        """Append one request's messages as one revision. Returns the response body and
        whether it is the replay of an earlier request with the same Idempotency-Key."""
        check_batch(messages, self.settings, "/messages")
        keys = IdempotencyStore(self.session, self.principal.tenant_id, self.settings)
        replay = await keys.begin(thread_id, "messages", idempotency)
        if replay is not None:
            return replay.body, True
        count = len(messages)
        row = await self.threads.advance(thread_id, seqs=count, live_delta=count,
                                         expected=expected_revisions(if_match))
        if row is None:
            row = await self._first_append(thread_id, if_match, count)
        stored = await self.repo.append(row.id, row.last_seq, messages, utcnow())
        events.record(self.session, self.principal, "message.appended", messages_path(thread_id),
                      revision=row.revision, thread_id=thread_id)
        body = AppendOut(data=[to_out(r) for r in stored],
                         thread_revision=row.revision).model_dump(mode="json")
        await keys.save(row.id, "messages", idempotency, 201, body)
        return body, False

    async def _first_append(self, thread_id: str, if_match: ETagList | None,
                            count: int) -> Row[Any]:
        """The append's UPDATE touched no row: create a missing thread (API.md section 3),
        or say why not (410 deleted, 412 If-Match not current)."""
        if if_match is None:
            # Also the path of a thread another request created since our UPDATE.
            await self.thread_service.ensure_live(thread_id)
            row = await self.threads.advance(thread_id, seqs=count, live_delta=count)
            if row is None:  # deleted between the create and here
                raise ThreadDeleted(f"Thread {thread_id!r} was deleted.")
            return row
        await self.thread_service.refuse_write(thread_id)

    async def page(self, thread_pk: int, *, view: View = "live", order: Order = "asc",
                   cursor: str | None = None, after_seq: int | None = None,
                   before_seq: int | None = None, role: str | None = None,
                   agent_name: str | None = None,
                   limit: int) -> tuple[list[MessageOut], str | None]:
        after = decode_cursor("messages", cursor, 2)
        if after is not None and not all(
            type(value) is int and 0 <= value <= ABOVE_ANY_SEQ for value in after
        ):
            raise InvalidCursor("The cursor is not one this list handed out.")
        # Filters and the cursor become (position, seq) bounds: position > after_seq is
        # (position, seq) > (after_seq, ABOVE_ANY_SEQ), position < before_seq is < (before_seq, 0).
        lower = (after_seq, ABOVE_ANY_SEQ) if after_seq is not None else None
        upper = (before_seq, 0) if before_seq is not None else None
        if after is not None:
            key = (after[0], after[1])
            if order == "desc":
                upper = min(upper, key) if upper else key
            else:
                lower = max(lower, key) if lower else key
        rows = await self.repo.page(
            thread_pk, live=view == "live", descending=order == "desc", lower=lower,
            upper=upper, role=role, agent_name=agent_name, limit=limit + 1,
        )
        page = rows[:limit]
        next_cursor = (encode_cursor("messages", [page[-1].position, page[-1].seq])
                       if len(rows) > limit else None)
        return [to_out(row) for row in page], next_cursor

    async def list(self, thread_id: str, **filters: Any) -> tuple[list[MessageOut], str | None]:
        return await self.page(await self.thread_service.live_pk(thread_id), **filters)

    async def get(self, thread_id: str, message_id: str) -> MessageOut:
        row = await self.repo.get(await self.thread_service.live_pk(thread_id), message_id)
        if row is None:
            raise NotFound(f"Message {message_id!r} does not exist in thread {thread_id!r}.")
        return to_out(row)

    async def thread_with_messages(self, thread_id: str, limit: int) -> ThreadWithMessages:
        """The thread and the first page of its live view, read in one transaction."""
        thread = await self.thread_service.live_row(thread_id)
        messages, next_cursor = await self.page(thread.id, limit=limit)
        return ThreadWithMessages(**thread_out(thread).model_dump(), messages=messages,
                                  messages_next_cursor=next_cursor)

