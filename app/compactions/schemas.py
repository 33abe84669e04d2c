from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field

from app.core.schemas import INT64_MAX, JsonObject, Name, Strict, Timestamp
from app.messages.schemas import MessageIn, MessageOut, ShortText

MAX_SOURCES = 10_000


class CompactionIn(Strict):
    source_message_ids: Annotated[list[Name], Field(min_length=1, max_length=MAX_SOURCES)] = Field(
        description="A contiguous, in-order run of live messages of this thread "
        f"(at most {MAX_SOURCES})."
    )
    summary: MessageIn = Field(description="Stored as a message standing where the run stood.")
    reason: Annotated[str, Field(max_length=4096)] | None = None
    model: ShortText | None = None
    input_token_count: Annotated[int, Field(ge=0, le=INT64_MAX, strict=True)] | None = None
    output_token_count: Annotated[int, Field(ge=0, le=INT64_MAX, strict=True)] | None = None
    metadata: JsonObject = Field(default_factory=dict)


class CompactionOut(BaseModel):
    id: str
    thread_id: str
    source_message_ids: list[str]
    summary_message_id: str
    summary_text: str | None = Field(
        description="The summary's text: its string content, or the text of its text parts."
    )
    reason: str | None
    model: str | None
    input_token_count: int | None
    output_token_count: int | None
    metadata: JsonObject
    created_at: Timestamp
    thread_revision: int = Field(description="The thread revision the compaction produced.")

    @classmethod
    def from_row(cls, row: Any, thread_id: str) -> CompactionOut:
        """From a compaction record, which names its thread by key, not by id."""
        return cls(
            id=row.compaction_id, thread_id=thread_id,
            source_message_ids=row.source_message_ids,
            summary_message_id=row.summary_message_id, summary_text=row.summary_text,
            reason=row.reason, model=row.model, input_token_count=row.input_token_count,
            output_token_count=row.output_token_count, metadata=row.metadata,
            created_at=row.created_at, thread_revision=row.thread_revision,
        )


class CompactionDetail(CompactionOut):
    source_messages: list[MessageOut] = Field(description="The compacted messages, in order.")
