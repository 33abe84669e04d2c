from __future__ import annotations

from typing import Annotated, Any, NamedTuple

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer

from app.core.jsonutil import json_string
from app.core.pagination import RenderedPage
from app.core.schemas import (
    INT64_MAX,
    JsonObject,
    Name,
    RowModel,
    Strict,
    Timestamp,
    utc_text,
)
from app.messages.schemas import MessageIn, PageMessage

HistoryLimit = Annotated[int, Field(
    ge=0, le=100_000, strict=True,
    description="How many revisions of state history this thread keeps (0: none); null or "
                "omitted on create: the server's setting (`AGENTSTATE_THREAD_HISTORY`).",
)]

TtlSeconds = Annotated[int, Field(
    ge=1, le=10 * 365 * 86400,
    description="Seconds after its last write the server deletes the thread (a normal "
                "delete: tombstone and `thread.deleted` event), within a sweep interval; "
                "null or omitted: kept until deleted.",
)]


class ThreadCreate(Strict):
    thread_id: Name | None = Field(None, description="Omit to get a server-generated `thr_...` id.")
    state: JsonObject = Field(default_factory=dict)
    metadata: JsonObject = Field(default_factory=dict)
    history_limit: HistoryLimit | None = None
    ttl_seconds: TtlSeconds | None = None


class ThreadReplace(Strict):
    state: JsonObject
    metadata: JsonObject | None = Field(None, description="Omitted: the stored metadata is kept.")
    history_limit: HistoryLimit | None = Field(
        None, description="Omitted: the stored value is kept; null: the server's setting.")
    ttl_seconds: TtlSeconds | None = Field(
        None, description="Omitted: the stored value is kept; null: no time to live.")
    append_messages: list[MessageIn] | None = Field(
        None, description="Appended in the same transaction and under the same revision "
        "(events `thread.updated` and `message.appended`).",
    )


class ThreadPatch(Strict):
    """RFC 7396 merge-patch of the representation; `state`, `metadata`, `history_limit` and
    `ttl_seconds` can change (`"history_limit": null` goes back to the server's setting,
    `"ttl_seconds": null` removes the time to live)."""

    state: JsonObject | None = None
    metadata: JsonObject | None = None
    history_limit: HistoryLimit | None = None
    ttl_seconds: TtlSeconds | None = None
    append_messages: list[MessageIn] | None = Field(
        None, description="Not a member of the thread: messages appended in the same "
        "transaction and under the same revision, as with PUT.")


class ForkedFrom(BaseModel):
    """Where a fork came from: its source thread, by id, and the revision it was forked at."""

    thread_id: str = Field(description="The source thread (it may have been deleted since).")
    revision: int = Field(description="The source's revision the fork was made from.")


# A thread as every route sends it: the schema of the OpenAPI document (no docstring: it
# would be the schema's description); `render_thread` writes the body.
class ThreadOut(BaseModel):
    thread_id: str
    revision: int
    state: JsonObject
    metadata: JsonObject
    created_at: Timestamp
    updated_at: Timestamp
    message_count: int
    history_limit: int | None = Field(
        None, description="Revisions of state history kept; absent: the server's setting.")
    ttl_seconds: int | None = Field(
        None, description="Deleted this many seconds after `updated_at`; absent: no time to "
                          "live.")
    forked_from: ForkedFrom | None = Field(
        None, description="The thread and revision a fork made this thread from "
                          "(`POST .../fork`); null for a thread no fork made.")

    @model_serializer(mode="wrap")
    def _drop_default_history(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]  # unannotated: keeps the fields in the OpenAPI schema
        data = handler(self)
        for name in ("history_limit", "ttl_seconds"):
            if data.get(name) is None:
                data.pop(name, None)
        return data


class ThreadWithMessages(ThreadOut):
    """GET with `?include=messages`: the thread plus the first page of its live view."""

    messages: list[PageMessage] | None = None
    messages_next_cursor: str | None = Field(
        None, description="Pass as `cursor` to GET .../messages for the next page."
    )


# The columns `render_thread` reads, in this order.
RENDERED_COLUMNS = ("thread_id", "revision", "state", "metadata", "created_at", "updated_at",
                    "message_count", "history_limit", "ttl_seconds", "forked_from_thread_id",
                    "forked_from_revision")


def render_thread(row: Any) -> str:
    """A thread as JSON text, `ThreadOut`'s members in its order (`history_limit` and
    `ttl_seconds` only when set, `forked_from` always), from a row of `RENDERED_COLUMNS`
    with `state` and `metadata` as the text they are stored as (the "stored" columns
    `ThreadRepository`'s reads and writes return), so no route parses the state to
    serialise it again. Numbers read as they were written (the stored text is
    `app.core.jsonutil.dumps`'s), as messages do. tests/test_threads.py holds what every
    route sends equal to what `ThreadOut` renders from it."""
    (thread_id, revision, state, metadata, created_at, updated_at, message_count,
     history_limit, ttl_seconds, source, source_revision, *_) = row
    parts = [f'{{"thread_id":{json_string(thread_id)},"revision":{revision}',
             f',"state":{state},"metadata":{metadata}',
             f',"created_at":"{utc_text(created_at)}","updated_at":"{utc_text(updated_at)}"',
             f',"message_count":{message_count}']
    if history_limit is not None:
        parts.append(f',"history_limit":{history_limit}')
    if ttl_seconds is not None:
        parts.append(f',"ttl_seconds":{ttl_seconds}')
    parts.append(',"forked_from":null}' if source is None else
                 f',"forked_from":{{"thread_id":{json_string(source)},'
                 f'"revision":{source_revision}}}}}')
    return "".join(parts)


class RenderedThread(NamedTuple):
    """A thread's representation as JSON text (`render_thread`), with what a route sends
    beside it: its id (`Location`) and its revision (`ETag`)."""

    thread_id: str
    revision: int
    json: str

    @classmethod
    def of(cls, row: Any) -> RenderedThread:
        """From a row of `RENDERED_COLUMNS`."""
        return cls(row.thread_id, row.revision, render_thread(row))


def with_messages_json(thread: str, page: RenderedPage) -> str:
    """`ThreadWithMessages` as JSON text, from the thread as `render_thread` renders it and
    its messages rendered ahead (`render_message`)."""
    return (f'{thread[:-1]},"messages":{page.data_json()},'
            f'"messages_next_cursor":{page.cursor_json()}}}')


class ThreadRevisionOut(RowModel):
    """The state and metadata of a thread as they were at `revision`."""

    revision: int = Field(description="The revision asked for.")
    state_revision: int = Field(
        description="The write that set this state and metadata: `revision` itself, or the "
                    "last one before it (appends and compactions do not change the state).")
    state: JsonObject
    metadata: JsonObject
    updated_at: Timestamp = Field(description="When `state_revision` was written.")

    @classmethod
    def from_row(cls, row: Any, revision: int | None = None) -> ThreadRevisionOut:
        return cls(revision=row.revision if revision is None else revision,
                   state_revision=row.revision, state=row.state, metadata=row.metadata,
                   updated_at=row.updated_at)


class ThreadFork(Strict):
    thread_id: Name = Field(description="The new thread's id; it must not exist (as "
                            "`If-None-Match: *`): a deleted id is started afresh.")
    revision: Annotated[int, Field(ge=1, le=INT64_MAX, strict=True)] | None = Field(
        None, description="The revision of the source to fork from; default: the current one. "
                          "It must be within the source's kept history.")
