"""Compaction use cases: API.md section 5.

Every write here first takes one revision of the thread through its aggregate (the same
conditional UPDATE appends use), so compactions, reverts and appends of one thread are
serialised on its row and validate a view no one else is changing.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from app.compactions.errors import (
    CompactionCovered,
    CompactionNotContiguous,
    MessageNotFound,
    MessageNotLive,
)
from app.compactions.repository import CompactionRepository
from app.compactions.schemas import CompactionDetail, CompactionIn, CompactionOut
from app.core.errors import NotFound, Unprocessable
from app.core.ids import new_id
from app.core.limits import check_metadata
from app.core.pagination import Page, bad_cursor, decode_cursor, split_page
from app.core.revisions import Preconditions
from app.db.base import AnyRow, utcnow
from app.db.unit import UnitOfWork
from app.idempotency.service import IdempotencyRequest, IdempotencyService
from app.messages.errors import refuse_taken
from app.messages.repository import MessageRepository
from app.messages.schemas import MessageIn, MessageOut
from app.threads.aggregate import ThreadAggregate, thread_path

CURSOR = "compactions"


def compaction_path(thread_id: str, compaction_id: str) -> str:
    return f"{thread_path(thread_id)}/compactions/{compaction_id}"


def summary_text(summary: MessageIn) -> str | None:
    if isinstance(summary.content, list):
        texts = [part["text"] for part in summary.content
                 if part.get("type") == "text" and isinstance(part.get("text"), str)]
        return "\n".join(texts) if texts else None
    return summary.content


def _source_errors(ids: list[str], indexes: list[int], message: str) -> list[dict[str, str]]:
    return [{"pointer": f"/source_message_ids/{i}", "code": "invalid_source",
             "message": f"{ids[i]!r} {message}"} for i in indexes]


def _repeated(ids: list[str]) -> list[int]:
    """Indexes of ids named earlier in the list."""
    seen: set[str] = set()
    repeated = []
    for index, message_id in enumerate(ids):
        if message_id in seen:
            repeated.append(index)
        seen.add(message_id)
    return repeated


class CompactionService:
    def __init__(self, uow: UnitOfWork) -> None:
        self.uow = uow
        self.settings = uow.settings
        self.repo = CompactionRepository(uow.connection, uow.tenant_id)
        self.messages = MessageRepository(uow.connection, uow.tenant_id)
        self.threads = ThreadAggregate(uow)

    async def create(self, thread_id: str, body: CompactionIn, pre: Preconditions,
                     idempotency: IdempotencyRequest | None) -> tuple[dict[str, Any], bool]:
        """Returns the response body and whether it replays an earlier Idempotency-Key.

        1. Check the body (limits, no source named twice). 2. Answer a replay. 3. Take the
        thread's next revision: the summary gets the next seq, and the run's messages leave
        the live count. 4. Check the run under that lock. 5. Write: sources compacted, the
        summary, the record. 6. Record the event and the idempotency key.
        """
        check_metadata(body.metadata, self.settings)
        check_metadata(body.summary.metadata, self.settings, "/summary/metadata")
        if body.summary.parent_id is not None:
            raise Unprocessable(
                "A summary stands for the run it replaces; it takes no parent_id.",
                errors=[{"pointer": "/summary/parent_id", "code": "parent_not_allowed",
                         "message": "not allowed on a summary"}])
        ids = body.source_message_ids
        repeated = _repeated(ids)
        if repeated:
            raise CompactionNotContiguous("A source message is named twice.",
                                          errors=_source_errors(ids, repeated, "is repeated"))
        keys = IdempotencyService(self.uow, "compactions")
        replay = await keys.begin(thread_id, idempotency)
        if replay is not None:
            return replay.body, True

        thread = await self.threads.advance(thread_id, pre, seqs=1, live_delta=1 - len(ids))
        sources = await self._check_run(thread.id, ids)
        if body.summary.id:
            refuse_taken(await self.messages.taken_id(thread.id, [body.summary.id]))
        record = await self._write(thread, sources, body)
        self.uow.record("compaction.created", compaction_path(thread_id, record.compaction_id),
                        revision=thread.revision, thread_id=thread_id)
        out = CompactionOut.from_row(record, thread_id).model_dump(mode="json")
        await keys.save(thread.id, idempotency, 201, out)
        return out, False

    async def _write(self, thread: AnyRow, sources: list[AnyRow],
                     body: CompactionIn) -> SimpleNamespace:
        """The sources become compacted, the summary is stored where the run stood, and the
        record is written; returns the record."""
        now = utcnow()
        compaction_id = new_id("cmp")
        await self.messages.set_status(thread.id, body.source_message_ids, "compacted",
                                       compaction_id)
        # Standing at the position of the run's last message puts the summary exactly where
        # the run stood in the live view, and right after it in the full view.
        summary = self.messages.row(thread.id, body.summary, seq=thread.last_seq,
                                    position=sources[-1].position, revision=thread.revision,
                                    now=now, summary_of=compaction_id)
        await self.messages.insert([summary])
        record = {
            "thread_pk": thread.id, "seq": thread.last_seq, "compaction_id": compaction_id,
            "source_message_ids": body.source_message_ids,
            "summary_message_id": summary["message_id"],
            "summary_text": summary_text(body.summary), "reason": body.reason,
            "model": body.model, "input_token_count": body.input_token_count,
            "output_token_count": body.output_token_count, "metadata": body.metadata,
            "created_at": now, "thread_revision": thread.revision,
        }
        await self.repo.insert(record)
        return SimpleNamespace(**record)

    async def _check_run(self, thread_pk: int, ids: list[str]) -> list[AnyRow]:
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

    async def revert(self, thread_id: str, compaction_id: str, pre: Preconditions) -> None:
        # The record is read twice: first to know how many sources come back into the live
        # count, then again under the thread's row lock, where a concurrent revert or
        # compaction may have committed since the first read.
        thread_pk = await self.threads.write_target(thread_id, pre)
        record = await self._record(thread_pk, thread_id, compaction_id)
        sources = record.source_message_ids
        locked = await self.threads.advance(thread_id, pre, live_delta=len(sources) - 1)
        record = await self._record(locked.id, thread_id, compaction_id)
        summary = await self.messages.get(locked.id, record.summary_message_id)
        if summary is None or summary.status != "live":
            raise CompactionCovered(
                f"Its summary is part of compaction {summary.compacted_by if summary else None!r}; "
                "revert that one first."
            )
        await self.messages.set_status(locked.id, sources, "live", None)
        await self.messages.set_status(locked.id, [record.summary_message_id], "reverted", None)
        await self.repo.mark_reverted(locked.id, compaction_id, locked.revision, utcnow())
        self.uow.record("compaction.reverted", compaction_path(thread_id, compaction_id),
                        revision=locked.revision, thread_id=thread_id)

    async def _record(self, thread_pk: int, thread_id: str, compaction_id: str) -> AnyRow:
        record = await self.repo.get(thread_pk, compaction_id)
        if record is None:
            raise NotFound(f"Compaction {compaction_id!r} does not exist in thread {thread_id!r}.")
        return record

    async def list(self, thread_id: str, *, limit: int,
                   cursor: str | None) -> Page[CompactionOut]:
        after = decode_cursor(CURSOR, cursor, 1)
        if after is not None and type(after[0]) is not int:
            raise bad_cursor()
        thread_pk = await self.threads.live_pk(thread_id)
        rows = await self.repo.page(thread_pk, after_seq=after[0] if after else None,
                                    limit=limit + 1)
        return split_page(CURSOR, rows, limit, lambda row: [row.seq],
                          lambda row: CompactionOut.from_row(row, thread_id),
                          max_bytes=self.settings.max_page_bytes)

    async def get(self, thread_id: str, compaction_id: str) -> CompactionDetail:
        thread_pk = await self.threads.live_pk(thread_id)
        record = await self._record(thread_pk, thread_id, compaction_id)
        sources = await self.messages.by_ids(thread_pk, record.source_message_ids)
        return CompactionDetail(**CompactionOut.from_row(record, thread_id).model_dump(),
                                source_messages=[MessageOut.from_row(row) for row in sources])
