from __future__ import annotations

from pydantic import Field

from app.core.schemas import JsonObject, Name, RowModel, Strict, Timestamp
from app.messages.schemas import MessageIn, MessageOut


class ThreadCreate(Strict):
    thread_id: Name | None = Field(None, description="Omit to get a server-generated `thr_...` id.")
    state: JsonObject = Field(default_factory=dict)
    metadata: JsonObject = Field(default_factory=dict)


class ThreadReplace(Strict):
    state: JsonObject
    metadata: JsonObject | None = Field(None, description="Omitted: the stored metadata is kept.")
    append_messages: list[MessageIn] | None = Field(
        None, description="Appended in the same transaction and under the same revision "
        "(events `thread.updated` and `message.appended`).",
    )


class ThreadPatch(Strict):
    """RFC 7396 merge-patch of the representation; only `state` and `metadata` can change."""

    state: JsonObject | None = None
    metadata: JsonObject | None = None


class ThreadOut(RowModel):
    thread_id: str
    revision: int
    state: JsonObject
    metadata: JsonObject
    created_at: Timestamp
    updated_at: Timestamp
    message_count: int


class ThreadWithMessages(ThreadOut):
    """GET with `?include=messages`: the thread plus the first page of its live view."""

    messages: list[MessageOut] | None = None
    messages_next_cursor: str | None = Field(
        None, description="Pass as `cursor` to GET .../messages for the next page."
    )
