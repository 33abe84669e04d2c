"""Message use cases: API.md section 4 (append, read)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import ValidationError

from app.core.errors import InvalidCursor, NotFound, RevisionMismatch, Unprocessable
from app.core.limits import check_metadata
from app.core.pagination import (
    Page,
    RenderedPage,
    bad_cursor,
    decode_cursor,
    split_page,
)
from app.core.revisions import Preconditions
from app.db.base import AnyRow, utcnow
from app.db.unit import UnitOfWork
from app.idempotency.service import IdempotencyRequest, IdempotencyService
from app.messages.errors import (
    MessageAmbiguous,
    MessageCompacted,
    refuse_referenced,
    refuse_taken,
)
from app.messages.parents import resolve_parents
from app.messages.repository import MessageRepository, checks_ids_on_insert
from app.messages.schemas import (
    LINEAGE_CURSOR,
    MESSAGE_CURSOR,
    AppendOut,
    LineageMessageOut,
    MessageIn,
    MessageOut,
    MessageRedaction,
    MessageRemoval,
    RemoveOut,
    check_batch,
    columns_of,
    message_page,
    messages_path,
    renderer,
)
from app.threads.aggregate import ThreadAggregate

View = Literal["live", "full"]
ABOVE_ANY_SEQ = 2**62
# Messages one removal request may take (a longer trim is several requests).
MAX_REMOVE = 1000
Order = Literal["asc", "desc"]


class MessageService:
    def __init__(self, uow: UnitOfWork) -> None:
        self.uow = uow
        self.settings = uow.settings
        self.repo = MessageRepository(uow.connection, uow.tenant_id)
        self.threads = ThreadAggregate(uow)

    async def append(self, thread_id: str, messages: list[MessageIn], pre: Preconditions,
                     idempotency: IdempotencyRequest | None) -> tuple[dict[str, Any], bool]:
        """Append one request's messages as one revision. Returns the response body and
        whether it is the replay of an earlier request with the same Idempotency-Key."""
        check_batch(messages, self.settings, "/messages")
        if idempotency is None and messages and not any(m.parent_id for m in messages):
            alone = await self._append_alone(thread_id, messages, pre)
            if alone is not None:
                return alone, False
        keys = IdempotencyService(self.uow, "messages")
        replay = await keys.begin(thread_id, idempotency)
        if replay is not None:
            return replay.body, True
        count = len(messages)
        # A thread that does not exist is created (API.md section 3).
        row = await self.threads.advance(thread_id, pre, seqs=count, live_delta=count,
                                         create=True)
        if not checks_ids_on_insert(messages):
            refuse_taken(await self.repo.taken_id(row.id, [msg.id for msg in messages if msg.id]))
        parents = await resolve_parents(self.repo, row, messages, "/messages")
        stored, taken = await self.repo.append(row, messages, utcnow(), parents)
        refuse_taken(taken)
        self.uow.record("message.appended", messages_path(thread_id), revision=row.revision,
                        thread_id=thread_id)
        body = AppendOut(data=[MessageOut.from_row(r) for r in stored],
                         thread_revision=row.revision).model_dump(mode="json")
        await keys.save(row.id, idempotency, 201, body)
        return body, False

    async def _append_alone(self, thread_id: str, messages: list[MessageIn],
                            pre: Preconditions) -> dict[str, Any] | None:
        """Postgres: the messages, their thread's new revision and its event in one statement
        that commits by itself (`UnitOfWork.autocommit`, `MessageRepository.append_alone`),
        the response body. None if it stored nothing (the thread is absent, deleted or at
        another revision, or has the message's id) or cannot run so: then the transaction
        does the append and gives its answer (the thread created, 404, 410, 412, 409)."""
        if not await self.uow.autocommit():  # Postgres only
            return None
        resource = messages_path(thread_id)
        appended = await self.repo.append_alone(
            thread_id, messages, utcnow(), pre.expected_revisions(), self.uow.principal.actor,
            resource)
        if appended is None:
            await self.uow.transactional()
            return None
        revision, stored = appended
        self.uow.recorded("message.appended", resource, revision=revision, thread_id=thread_id)
        return AppendOut(data=[MessageOut.from_row(row) for row in stored],
                         thread_revision=revision).model_dump(mode="json")

    async def list(self, thread_id: str, *, view: View = "live", order: Order = "asc",
                   cursor: str | None = None, after_seq: int | None = None,
                   before_seq: int | None = None, role: str | None = None,
                   agent_name: str | None = None, created_after: datetime | None = None,
                   limit: int, fields: Collection[str] | None = None) -> RenderedPage:
        """A page of the thread's messages; with `fields`, only those members of each."""
        try:
            after = decode_cursor(MESSAGE_CURSOR, cursor, 2)
            if after is not None and not all(
                type(value) is int and 0 <= value <= ABOVE_ANY_SEQ for value in after
            ):
                raise bad_cursor()
        except InvalidCursor:
            await self.threads.live_pk(thread_id)  # a missing thread is said first (404)
            raise
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
        # The thread and its page in one statement; only an empty page asks whether the
        # thread is there at all (404).
        rows = await self.repo.page(
            thread_id, live=view == "live", descending=order == "desc", lower=lower,
            upper=upper, role=role, agent_name=agent_name, limit=limit + 1,
            created_after=created_after, as_stored=True,
            columns=columns_of(fields),
        )
        if not rows:
            await self.threads.live_pk(thread_id)
        return message_page(rows, limit, self.settings.max_page_bytes, renderer(fields))

    async def get(self, thread_id: str, message_id: str) -> MessageOut:
        row = await self.repo.get(await self.threads.live_pk(thread_id), message_id)
        if row is None:
            raise NotFound(f"Message {message_id!r} does not exist in thread {thread_id!r}.")
        return MessageOut.from_row(row)

    # --- removal and redaction -----------------------------------------------------------

    async def _selected(self, thread_pk: int, body: MessageRemoval) -> Sequence[AnyRow]:
        """The messages `body` names, in view order (404 for an id the thread lacks, 422 for
        a range of more than MAX_REMOVE)."""
        if body.ids is not None:
            rows = await self.repo.by_ids(thread_pk, body.ids)
            found = {row.message_id for row in rows}
            missing = next((mid for mid in body.ids if mid not in found), None)
            if missing is not None:
                raise NotFound(f"Message {missing!r} does not exist in this thread; nothing "
                               "was removed.")
            return rows
        if body.last is not None:
            rows = await self.repo.page(thread_pk, live=True, descending=True, lower=None,
                                        upper=None, role=None, agent_name=None, limit=body.last)
            return rows[::-1]
        lower = (body.after_seq, ABOVE_ANY_SEQ) if body.after_seq is not None else None
        upper = (body.before_seq, 0) if body.before_seq is not None else None
        rows = await self.repo.page(thread_pk, live=False, descending=False, lower=lower,
                                    upper=upper, role=None, agent_name=None,
                                    limit=MAX_REMOVE + 1)
        if len(rows) > MAX_REMOVE:
            raise Unprocessable(
                f"A removal takes at most {MAX_REMOVE} messages; narrow the range and repeat.",
                errors=[{"pointer": "", "code": "too_many_messages",
                         "message": f"more than {MAX_REMOVE} messages in the range"}])
        return rows

    @staticmethod
    def _refuse_compacted(rows: Sequence[AnyRow]) -> None:
        for row in rows:
            if row.status == "compacted" or (row.status == "live" and row.summary_of):
                raise MessageCompacted(
                    f"Message {row.message_id!r} is part of compaction "
                    f"{row.compacted_by or row.summary_of!r}; revert it first. Nothing was "
                    "changed.")

    async def remove(self, thread_id: str, body: MessageRemoval,
                     pre: Preconditions) -> RemoveOut:
        """Delete messages (their content leaves the database; their seqs are never handed
        out again) as one revision of the thread. Removing nothing changes nothing."""
        chosen = [name for name in ("ids", "last") if getattr(body, name) is not None]
        ranged = body.after_seq is not None or body.before_seq is not None
        if len(chosen) + ranged != 1:
            raise Unprocessable(
                "Name the messages to remove by exactly one of: ids, last, or after_seq and/or "
                "before_seq.", errors=[{"pointer": "", "code": "one_selector",
                                        "message": "exactly one selector"}])
        thread_pk = await self.threads.write_target(thread_id, pre)
        if not await self._selected(thread_pk, body):
            current = (await self.threads.live(thread_id)).revision
            expected = pre.expected_revisions()
            if expected is not None and current not in expected:
                raise RevisionMismatch(current)
            return RemoveOut(data=[], thread_revision=current)
        row = await self.threads.advance(thread_id, pre)
        rows = await self._selected(row.id, body)  # again, under the row's lock
        self._refuse_compacted(rows)
        refuse_referenced(await self.repo.referrer(thread_id, row.id, [r.seq for r in rows]),
                          "this removal")
        await self.repo.remove(row.id, [r.seq for r in rows])
        await IdempotencyService(self.uow, "messages").forget_thread(row.id)
        await self.threads.add_live(row, -sum(r.status == "live" for r in rows))
        self.uow.record("message.removed", messages_path(thread_id), revision=row.revision,
                        thread_id=thread_id)
        return RemoveOut(data=[MessageOut.from_row(r) for r in rows],
                         thread_revision=row.revision)

    async def redact(self, thread_id: str, message_id: str, body: MessageRedaction,
                     pre: Preconditions) -> tuple[MessageOut, int]:
        """Overwrite members of one message in place, as one revision of the thread."""
        sent = body.model_fields_set
        if "metadata" in sent and body.metadata is not None:
            check_metadata(body.metadata, self.settings)
        row = await self.threads.advance(thread_id, pre)
        message = await self.repo.get(row.id, message_id)
        if message is None:
            raise NotFound(f"Message {message_id!r} does not exist in thread {thread_id!r}.")
        self._refuse_compacted([message])
        values: dict[str, Any] = {}
        if "content" in sent:
            try:  # the content rules of the message's role
                MessageIn.model_validate({"role": message.role, "content": body.content})
            except ValidationError as exc:
                raise Unprocessable("content breaks the rules of the message's role.", errors=[
                    {"pointer": "/content", "code": "invalid_content",
                     "message": exc.errors()[0]["msg"]}]) from None
            values["content"] = body.content
        if "item" in sent:
            values["item"] = body.item
        if "metadata" in sent:
            values["metadata"] = body.metadata or {}
        stored = await self.repo.replace(row.id, message.seq, values) if values else message
        await IdempotencyService(self.uow, "messages").forget_thread(row.id)
        self.uow.record("message.redacted", f"{messages_path(thread_id)}/{message_id}",
                        revision=row.revision, thread_id=thread_id)
        return MessageOut.from_row(stored), row.revision

    # --- lineage -------------------------------------------------------------------------

    async def lineage(self, message_id: str, *, limit: int,
                      cursor: str | None) -> Page[LineageMessageOut]:
        """The message with this id, in any thread of the tenant, and the ones before it along
        parent links: the last `limit` of them, oldest first. `next_cursor` continues with
        the older ones (it names where the walk goes on, so the id is not looked up again)."""
        after = decode_cursor(LINEAGE_CURSOR, cursor, 2)
        if after is not None:
            if not (isinstance(after[0], str) and type(after[1]) is int):
                raise bad_cursor()
            start = (after[0], after[1])
        else:
            found = await self.repo.carriers([message_id])
            if not found:
                raise NotFound(f"No message of this tenant has the id {message_id!r}.")
            if len(found) > 1:
                raise MessageAmbiguous(
                    f"{len(found)} messages of this tenant have the id {message_id!r} (a forked "
                    "thread keeps its source's ids); read it by thread instead.")
            start = (found[0].thread_id, found[0].seq)
        rows = await self.repo.lineage(start, limit + 1)
        if not rows:  # only a cursor can name a message that is gone
            raise NotFound("The message this cursor continues from no longer exists.")
        page = split_page(LINEAGE_CURSOR, rows, limit,
                          lambda row: [row.parent_thread_id, row.parent_seq],
                          LineageMessageOut.from_row, max_bytes=self.settings.max_page_bytes)
        page.data.reverse()
        return page
