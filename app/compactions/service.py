"""Compaction use cases: API.md section 5.

Every write here first takes one revision of the thread with a conditional UPDATE (the same
statement appends use), so compactions, reverts and appends of one thread are serialised on
its row and validate a view no one else is changing.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from app.auth.dependencies import Principal
from app.compactions.repository import CompactionRepository
from app.compactions.schemas import CompactionDetail, CompactionIn, CompactionOut
from app.core.conditional import ETagList
from app.core.errors import (
    CompactionCovered,
    CompactionNotContiguous,
    InvalidCursor,
    MessageNotFound,
    MessageNotLive,
    NotFound,
)
from app.core.ids import new_id
from app.core.limits import check_metadata
from app.core.pagination import decode_cursor, encode_cursor
from app.core.settings import Settings
from app.db.base import utcnow
from app.events import service as events
from app.messages.idempotency import IdempotencyRequest, IdempotencyStore
from app.messages.repository import MessageRepository
from app.messages.schemas import MessageIn
from app.messages.service import expected_revisions
from app.messages.service import to_out as message_out
from app.threads.repository import ThreadRepository
from app.threads.service import ThreadService, thread_path


def compaction_path(thread_id: str, compaction_id: str) -> str:
    return f"{thread_path(thread_id)}/compactions/{compaction_id}"


def summary_text(summary: MessageIn) -> str | None:
    if isinstance(summary.content, list):
        texts = [part["text"] for part in summary.content
                 if part.get("type") == "text" and isinstance(part.get("text"), str)]
        return "\n".join(texts) if texts else None
    return summary.content


def to_out(row: Row[Any], thread_id: str) -> CompactionOut:
    return CompactionOut(
        id=row.compaction_id, thread_id=thread_id, source_message_ids=row.source_message_ids,
        summary_message_id=row.summary_message_id, summary_text=row.summary_text,
        reason=row.reason, model=row.model, input_token_count=row.input_token_count,
        output_token_count=row.output_token_count, metadata=row.metadata,
        created_at=row.created_at, thread_revision=row.thread_revision,
    )


def _source_errors(ids: list[str], indexes: list[int], message: str) -> list[dict[str, str]]:
    return [{"pointer": f"/source_message_ids/{i}", "code": "invalid_source",
             "message": f"{ids[i]!r} {message}"} for i in indexes]


class CompactionService:
    def __init__(self, session: AsyncConnection, principal: Principal, settings: Settings) -> None:
        self.session = session
        self.principal = principal
        self.settings = settings
        self.repo = CompactionRepository(session, principal.tenant_id)
        self.messages = MessageRepository(session, principal.tenant_id)
        self.threads = ThreadRepository(session, principal.tenant_id)
        self.thread_service = ThreadService(session, principal, settings)

    async def create(self, thread_id: str, body: CompactionIn, if_match: ETagList | None,
                     idempotency: IdempotencyRequest | None) -> tuple[dict[str, Any], bool]:
        """Returns the response body and whether it replays an earlier Idempotency-Key."""
        check_metadata(body.metadata, self.settings)
        check_metadata(body.summary.metadata, self.settings, "/summary/metadata")
        ids = body.source_message_ids
        repeated = [i for i, mid in enumerate(ids) if mid in ids[:i]]
        if repeated:
            raise CompactionNotContiguous("A source message is named twice.",
                                          errors=_source_errors(ids, repeated, "is repeated"))
        keys = IdempotencyStore(self.session, self.principal.tenant_id, self.settings)
        replay = await keys.begin(thread_id, "compactions", idempotency)
        if replay is not None:
            return replay.body, True

        # The summary takes the next seq; the run's messages leave the live count.
        thread = await self.threads.advance(thread_id, seqs=1, live_delta=1 - len(ids),
                                            expected=expected_revisions(if_match))
        if thread is None:
            await self.thread_service.refuse_write(thread_id, if_match_sent=if_match is not None)
        sources = await self._check_run(thread.id, ids)
        await self.messages.ensure_new_ids(thread.id, [body.summary.id] if body.summary.id else [])

        now = utcnow()
        compaction_id = new_id("cmp")
        await self.messages.set_status(thread.id, ids, "compacted", compaction_id)
        # Standing at the position of the run's last message puts the summary exactly where
        # the run stood in the live view, and right after it in the full view.
        summary = self.messages.row(thread.id, body.summary, seq=thread.last_seq,
                                    position=sources[-1].position, now=now,
                                    summary_of=compaction_id)
        await self.messages.insert([summary])
        record = {
            "thread_pk": thread.id, "seq": thread.last_seq, "compaction_id": compaction_id,
            "source_message_ids": ids, "summary_message_id": summary["message_id"],
            "summary_text": summary_text(body.summary), "reason": body.reason,
            "model": body.model, "input_token_count": body.input_token_count,
            "output_token_count": body.output_token_count, "metadata": body.metadata,
            "created_at": now, "thread_revision": thread.revision,
        }
        await self.repo.insert(record)
        events.record(self.session, self.principal, "compaction.created",
                      compaction_path(thread_id, compaction_id), revision=thread.revision,
                      thread_id=thread_id)
        out = CompactionOut(id=compaction_id, thread_id=thread_id,
                            **{k: v for k, v in record.items()
                               if k in CompactionOut.model_fields}).model_dump(mode="json")
        await keys.save(thread.id, "compactions", idempotency, 201, out)
        return out, False

    async def _check_run(self, thread_pk: int, ids: list[str]) -> list[Row[Any]]:
        """The sources, if they are a contiguous, in-order run of live messages (else 422)."""
        found = await self.messages.by_ids(thread_pk, ids)
        by_id = {row.message_id: row for row in found}
        missing = [i for i, mid in enumerate(ids) if mid not in by_id]
        if missing:
            raise MessageNotFound(
                "Every source must be a message of this thread.",
                errors=_source_errors(ids, missing, "is not a message of this thread"),
            )
        not_live = [i for i, mid in enumerate(ids) if by_id[mid].status != "live"]
        if not_live:
            raise MessageNotLive(
                "Every source must be live (not already compacted or a reverted summary).",
                errors=_source_errors(ids, not_live, f"is {by_id[ids[not_live[0]]].status}"),
            )
        in_order = [row.message_id for row in found] == ids
        first, last = found[0], found[-1]
        if not in_order or await self.messages.live_count_between(
            thread_pk, (first.position, first.seq), (last.position, last.seq), len(ids) + 1
        ) != len(ids):
            raise CompactionNotContiguous(
                "source_message_ids must be a run of consecutive live messages, in view order, "
                "with nothing left out between them.",
                errors=[{"pointer": "/source_message_ids", "code": "compaction_not_contiguous",
                         "message": "not a contiguous, in-order run of the live view"}],
            )
        return found

    async def revert(self, thread_id: str, compaction_id: str, if_match: ETagList | None) -> None:
        thread_pk = await self.threads.live_pk(thread_id)
        if thread_pk is None:
            await self.thread_service.refuse_write(thread_id, if_match_sent=if_match is not None)
        record = await self.repo.get(thread_pk, compaction_id)
        if record is None:
            raise NotFound(f"Compaction {compaction_id!r} does not exist in thread {thread_id!r}.")
        sources = record.source_message_ids
        locked = await self.threads.advance(thread_id, seqs=0, live_delta=len(sources) - 1,
                                            expected=expected_revisions(if_match))
        if locked is None:
            await self.thread_service.refuse_write(thread_id, if_match_sent=if_match is not None)
        # Read again under the thread's row lock: a concurrent revert or compaction may have
        # committed since the first read.
        record = await self.repo.get(locked.id, compaction_id)
        if record is None:
            raise NotFound(f"Compaction {compaction_id!r} does not exist in thread {thread_id!r}.")
        summary = await self.messages.get(locked.id, record.summary_message_id)
        if summary is None or summary.status != "live":
            raise CompactionCovered(
                f"Its summary is part of compaction {summary.compacted_by if summary else None!r}; "
                "revert that one first."
            )
        await self.messages.set_status(locked.id, sources, "live", None)
        await self.messages.set_status(locked.id, [record.summary_message_id], "reverted", None)
        await self.repo.mark_reverted(locked.id, compaction_id, utcnow())
        events.record(self.session, self.principal, "compaction.reverted",
                      compaction_path(thread_id, compaction_id), revision=locked.revision,
                      thread_id=thread_id)

    async def list(self, thread_id: str, *, limit: int,
                   cursor: str | None) -> tuple[list[CompactionOut], str | None]:
        after = decode_cursor("compactions", cursor, 1)
        if after is not None and type(after[0]) is not int:
            raise InvalidCursor("The cursor is not one this list handed out.")
        thread_pk = await self.thread_service.live_pk(thread_id)
        rows = await self.repo.page(thread_pk, after_seq=after[0] if after else None,
                                    limit=limit + 1)
        page = rows[:limit]
        next_cursor = encode_cursor("compactions", [page[-1].seq]) if len(rows) > limit else None
        return [to_out(row, thread_id) for row in page], next_cursor

    async def get(self, thread_id: str, compaction_id: str) -> CompactionDetail:
        thread_pk = await self.thread_service.live_pk(thread_id)
        record = await self.repo.get(thread_pk, compaction_id)
        if record is None:
            raise NotFound(f"Compaction {compaction_id!r} does not exist in thread {thread_id!r}.")
        sources = await self.messages.by_ids(thread_pk, record.source_message_ids)
        return CompactionDetail(**to_out(record, thread_id).model_dump(),
                                source_messages=[message_out(row) for row in sources])
