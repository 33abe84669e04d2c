"""Typed representations of the API's resources (plain dataclasses, no pydantic).

Timestamps are timezone-aware `datetime`s. Members the server adds in later versions are
ignored, so an older client keeps working against a newer server.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

__all__ = [
    "AgentState", "AppendResult", "Compaction", "Event", "ForkedFrom", "JsonObject",
    "McpServer", "Message",
    "Page", "RemoveResult", "StoreItem", "Thread", "ThreadRevision",
]

JsonObject = dict[str, Any]
Role = Literal["system", "user", "assistant", "tool", "developer"]
T = TypeVar("T")
M = TypeVar("M", bound="_Model")
W = TypeVar("W", bound="_MessagesWritten")

_TIMESTAMPS = frozenset({"created_at", "updated_at", "at", "last_connected_at", "expires_at"})


def parse_timestamp(value: str) -> datetime:
    """RFC 3339 as the server writes it (`...Z`), on every Python this package supports."""
    return datetime.fromisoformat(value.replace("Z", "+00:00"))  # noqa: FURB162 - 3.10


class _Model:
    @classmethod
    def from_json(cls: type[M], data: dict[str, Any]) -> M:
        """Build from a response body, ignoring members this version does not know."""
        values = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name in data:
                value = data[f.name]
                if f.name in _TIMESTAMPS and isinstance(value, str):
                    value = parse_timestamp(value)
                values[f.name] = value
        return cls(**values)


class _Revisioned(_Model):
    revision: int

    @property
    def etag(self) -> str:
        """The strong ETag of this revision, e.g. for `If-Match`."""
        return f'"{self.revision}"'


@dataclass(frozen=True)
class Message(_Model):
    """One message of a thread's log. `seq` is its append order; `position` orders views."""

    id: str
    seq: int
    position: int
    role: str
    content: str | list[Any] | None
    created_at: datetime
    status: Literal["live", "compacted", "reverted"] = "live"
    name: str | None = None
    tool_calls: list[Any] | None = None
    tool_call_id: str | None = None
    agent_name: str | None = None
    metadata: JsonObject = field(default_factory=dict)
    compaction_id: str | None = None
    item: Any = None
    parent_id: str | None = None
    # Set on the messages of a lineage (`get_lineage`), which may span threads.
    thread_id: str | None = None


@dataclass(frozen=True)
class ForkedFrom(_Model):
    """Where a fork came from: the source thread's id and the revision it was forked at."""

    thread_id: str
    revision: int


@dataclass(frozen=True)
class Thread(_Revisioned):
    """A thread: shared run state plus (optionally, see `get_thread`) its first messages."""

    thread_id: str
    revision: int
    state: JsonObject
    metadata: JsonObject
    created_at: datetime
    updated_at: datetime
    message_count: int = 0
    history_limit: int | None = None  # None: the server's setting
    ttl_seconds: int | None = None  # None: no time to live
    forked_from: ForkedFrom | None = None  # None: no fork made this thread
    messages: list[Message] | None = None
    messages_next_cursor: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Thread:
        thread = super().from_json(data)
        if isinstance(data.get("forked_from"), dict):
            thread = dataclasses.replace(
                thread, forked_from=ForkedFrom.from_json(data["forked_from"]))
        if thread.messages is None:
            return thread
        return dataclasses.replace(
            thread, messages=[Message.from_json(m) for m in data["messages"]]
        )


@dataclass(frozen=True)
class ThreadRevision(_Model):
    """A thread's state and metadata as they were at `revision` (`state_revision` is the
    write that set them: appends and compactions do not change the state)."""

    revision: int
    state_revision: int
    state: JsonObject
    metadata: JsonObject
    updated_at: datetime


@dataclass(frozen=True)
class _MessagesWritten(_Model):
    """Messages a write touched and the thread's new revision (`{"data", "thread_revision"}`)."""

    data: list[Message]
    thread_revision: int

    @classmethod
    def from_json(cls: type[W], data: dict[str, Any]) -> W:
        return cls(data=[Message.from_json(m) for m in data["data"]],
                   thread_revision=data["thread_revision"])


@dataclass(frozen=True)
class AppendResult(_MessagesWritten):
    """What an append stored: the messages (with ids and seqs) and the thread's new revision."""


@dataclass(frozen=True)
class RemoveResult(_MessagesWritten):
    """What a removal deleted (the messages as they were) and the thread's new revision."""


@dataclass(frozen=True)
class Compaction(_Model):
    """A compaction record. `source_messages` is filled by `get_compaction` only;
    `thread_revision` by `create_compaction` only."""

    id: str
    thread_id: str
    source_message_ids: list[str]
    summary_message_id: str
    summary_text: str | None
    created_at: datetime
    reason: str | None = None
    model: str | None = None
    input_token_count: int | None = None
    output_token_count: int | None = None
    metadata: JsonObject = field(default_factory=dict)
    thread_revision: int | None = None
    source_messages: list[Message] | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Compaction:
        record = super().from_json(data)
        if record.source_messages is None:
            return record
        return dataclasses.replace(
            record, source_messages=[Message.from_json(m) for m in data["source_messages"]]
        )


@dataclass(frozen=True)
class AgentState(_Revisioned):
    """One agent's private state inside a thread."""

    thread_id: str
    agent_name: str
    revision: int
    state: JsonObject
    created_at: datetime
    updated_at: datetime



@dataclass(frozen=True)
class McpServer(_Revisioned):
    """Cached state of an MCP server. `secrets` values are `"***"` unless asked for."""

    server_name: str
    server_type: str
    revision: int
    state: JsonObject
    created_at: datetime
    updated_at: datetime
    secrets: dict[str, str] = field(default_factory=dict)
    last_connected_at: datetime | None = None



@dataclass(frozen=True)
class Event(_Model):
    """One committed change in the audit trail."""

    seq: int
    at: datetime
    type: str
    resource: str
    revision: int | None
    actor: str
    thread_id: str | None = None


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list. Pass `next_cursor` back as `cursor` for the next page."""

    data: list[T]
    next_cursor: str | None
    has_more: bool


@dataclass(frozen=True)
class StoreItem(_Revisioned):
    """One item of the store: a JSON value under a namespace (labels) and a key. `score` is
    its relevance in a search with a query or a vector (None otherwise)."""

    namespace: tuple[str, ...]
    key: str
    value: JsonObject
    revision: int
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None = None
    ttl_seconds: float | None = None
    index: list[str] | Literal[False] | None = None
    score: float | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StoreItem:
        item = super().from_json(data)
        return dataclasses.replace(item, namespace=tuple(item.namespace))
