"""Message use cases: API.md section 4 (append, read)."""

from __future__ import annotations

from typing import Any, Literal

from app.core.errors import NotFound
from app.core.pagination import Page, bad_cursor, decode_cursor, split_page
from app.core.revisions import Preconditions
from app.core.settings import Settings
from app.db.base import utcnow
from app.db.unit import UnitOfWork
from app.idempotency.service import IdempotencyRequest, IdempotencyService
from app.messages.errors import refuse_taken
from app.messages.repository import MessageRepository
from app.messages.schemas import (
    MESSAGE_CURSOR,
    AppendOut,
    MessageIn,
    MessageOut,
    check_batch,
    messages_path,
    page_key,
)
from app.threads.aggregate import ThreadAggregate

View = Literal["live", "full"]
ABOVE_ANY_SEQ = 2**62
Order = Literal["asc", "desc"]


class MessageService:
    def __init__(self, uow: UnitOfWork, settings: Settings) -> None:
        self.uow = uow
        self.settings = settings
        self.repo = MessageRepository(uow.connection, uow.tenant_id)
        self.threads = ThreadAggregate(uow, settings)

    async def append(self, thread_id: str, messages: list[MessageIn], pre: Preconditions,
                     idempotency: IdempotencyRequest | None) -> tuple[dict[str, Any], bool]:
        """Append one request's messages as one revision. Returns the response body and
        whether it is the replay of an earlier request with the same Idempotency-Key."""
        check_batch(messages, self.settings, "/messages")
        keys = IdempotencyService(self.uow, self.settings, "messages")
        replay = await keys.begin(thread_id, idempotency)
        if replay is not None:
            return replay.body, True
        count = len(messages)
        # A thread that does not exist is created (API.md section 3).
        row = await self.threads.advance(thread_id, pre, seqs=count, live_delta=count,
                                         create=True)
        refuse_taken(await self.repo.taken_id(row.id, [msg.id for msg in messages if msg.id]))
        stored = await self.repo.append(row, messages, utcnow())
        self.uow.record("message.appended", messages_path(thread_id), revision=row.revision,
                        thread_id=thread_id)
        body = AppendOut(data=[MessageOut.from_row(r) for r in stored],
                         thread_revision=row.revision).model_dump(mode="json")
        await keys.save(row.id, idempotency, 201, body)
        return body, False

    async def list(self, thread_id: str, *, view: View = "live", order: Order = "asc",
                   cursor: str | None = None, after_seq: int | None = None,
                   before_seq: int | None = None, role: str | None = None,
                   agent_name: str | None = None, limit: int) -> Page[MessageOut]:
        thread_pk = await self.threads.live_pk(thread_id)
        after = decode_cursor(MESSAGE_CURSOR, cursor, 2)
        if after is not None and not all(
            type(value) is int and 0 <= value <= ABOVE_ANY_SEQ for value in after
        ):
            raise bad_cursor()
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
        return split_page(MESSAGE_CURSOR, rows, limit, page_key, MessageOut.from_row,
                          max_bytes=self.settings.max_page_bytes)

    async def get(self, thread_id: str, message_id: str) -> MessageOut:
        row = await self.repo.get(await self.threads.live_pk(thread_id), message_id)
        if row is None:
            raise NotFound(f"Message {message_id!r} does not exist in thread {thread_id!r}.")
        return MessageOut.from_row(row)
