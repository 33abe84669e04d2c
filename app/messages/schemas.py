from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    PlainValidator,
    SerializerFunctionWrapHandler,
    StringConstraints,
    ValidationInfo,
    create_model,
    model_serializer,
)

from app.core.errors import Unprocessable
from app.core.jsonutil import json_string
from app.core.limits import check_metadata
from app.core.pagination import RenderedPage, split_rendered
from app.core.schemas import JsonObject, Name, RowModel, Strict, Timestamp, utc_text
from app.core.settings import Settings
from app.messages.errors import MessageExists

# The roles the API knows (and checks content, tool_calls and tool_call_id against).
KnownRole = Literal["system", "user", "assistant", "tool", "developer"]
KNOWN_ROLES = frozenset(("system", "user", "assistant", "tool", "developer"))
# Any short name: frameworks bring their own (ADK's `model`, free-form agent roles).
Role = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[^\x00-\x1f]+$")]
ROLE_MAX = 64
# Pages of both views are keyset-paged on (position, seq); the cursor carries that pair.
MESSAGE_CURSOR = "messages"
Status = Literal["live", "compacted", "reverted"]
ShortText = Annotated[str, StringConstraints(min_length=1, max_length=255)]
_SHORT_MAX = 255


class ContentPart(BaseModel):
    """One part of an array `content` (text, image_url, input_audio, file, ...): an object
    with a string `type`. Other members are kept exactly as sent; providers keep adding them."""

    model_config = {"extra": "allow"}
    type: str


class ToolCall(BaseModel):
    """An assistant's tool call, e.g. `{"id", "type": "function", "function": {...}}`,
    kept exactly as sent."""

    model_config = {"extra": "allow"}
    id: str
    type: str


def _objects_with_strings(value: Any, what: str, keys: tuple[str, ...]) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise ValueError(f"must be an array of {what}")
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            raise ValueError(f"[{index}] must be an object")
        for key in keys:
            if not isinstance(item.get(key), str) or not 0 < len(item[key]) <= _SHORT_MAX:
                raise ValueError(f"[{index}].{key} must be a string of 1-{_SHORT_MAX} characters")
    return value


# Plain validators keep the client's objects untouched (a model would reorder or coerce
# them) and put any error on the member itself (`/content`), not on a union branch.
def _content(value: Any, info: ValidationInfo) -> str | list[dict[str, Any]] | None:
    if value is None or isinstance(value, str):
        return value
    # Parts of a known role's content carry a `type`; other roles' parts are any objects.
    known = info.data.get("role") in KNOWN_ROLES
    return _objects_with_strings(value, "content parts", ("type",) if known else ())


def _tool_calls(value: Any, info: ValidationInfo) -> list[dict[str, Any]] | None:
    if value is None:
        return None
    if info.data.get("role") != "assistant":
        raise ValueError("tool_calls are only allowed on assistant messages")
    return _objects_with_strings(value, "tool calls", ("id", "type"))


def _tool_call_id(value: Any, info: ValidationInfo) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= _SHORT_MAX:
        raise ValueError(f"must be a string of 1-{_SHORT_MAX} characters")
    if info.data.get("role") != "tool":
        raise ValueError("tool_call_id is only allowed on tool messages")
    return value


Content = Annotated[
    str | list[dict[str, Any]] | None,
    PlainValidator(_content, json_schema_input_type=str | list[ContentPart] | None),
]
# A redaction's content: its parts are checked against the message's role by the service
# (the body does not say the role), so the schema promises only objects.
RedactedContent = Annotated[
    str | list[dict[str, Any]] | None,
    PlainValidator(_content, json_schema_input_type=str | list[dict[str, Any]] | None),
]
ToolCalls = Annotated[
    list[dict[str, Any]] | None,
    PlainValidator(_tool_calls, json_schema_input_type=list[ToolCall] | None),
]
ToolCallId = Annotated[str | None, PlainValidator(_tool_call_id, json_schema_input_type=str | None)]


class MessageIn(Strict):
    """A message to append. Only these members exist; anything else is `unknown_field`."""

    id: Name | None = Field(None, description="Omit to get a server-generated `msg_...` id.")
    role: Role
    content: Content = Field(
        None, description="A string, an array of content parts (objects; with a `type` for the "
        "known roles), or null.",
    )
    item: Any = Field(
        None, description="Any JSON value, stored verbatim and read back with the same keys in "
        "the same order (a framework's own item: a Responses API item, an ADK event).",
    )
    name: ShortText | None = None
    tool_calls: ToolCalls = Field(None, description="Assistant messages only.")
    tool_call_id: ToolCallId = Field(None, description="Tool messages only.")
    agent_name: Name | None = None
    metadata: JsonObject = Field(default_factory=dict)
    parent_id: Name | None = Field(
        None, description="The message this one continues: the id of a message of any of the "
        "tenant's threads, or of an earlier message of this request. It must name exactly one "
        "message (else 422 `parent_not_found` or 409 `message_ambiguous`). "
        "`GET /v1/messages/{id}/lineage` walks these links.")


class MessageBatch(Strict):
    messages: list[MessageIn] = Field(min_length=1)


def check_batch(messages: list[MessageIn], settings: Settings, pointer: str) -> None:
    """The limits a static schema cannot know (they come from settings), and ids that
    repeat inside the batch, checked before anything is written."""
    if len(messages) > settings.max_batch_messages:
        raise Unprocessable(
            f"At most {settings.max_batch_messages} messages per request.",
            errors=[{"pointer": pointer, "code": "too_many_messages",
                     "message": f"at most {settings.max_batch_messages} messages"}],
        )
    seen: set[str] = set()
    for index, message in enumerate(messages):
        check_metadata(message.metadata, settings, f"{pointer}/{index}/metadata")
        if message.id is not None:
            if message.id in seen:
                raise MessageExists(
                    f"Message id {message.id!r} appears twice in the request; nothing was written."
                )
            seen.add(message.id)


# Omitted from a message when absent, so a message reads back with the members it was sent with.
_OPTIONAL = ("item", "name", "tool_calls", "tool_call_id", "agent_name", "compaction_id",
             "parent_id")


def messages_path(thread_id: str) -> str:
    return f"/v1/threads/{thread_id}/messages"


def page_key(row: Any) -> list[int]:
    return [row.position, row.seq]


class MessageOut(RowModel):
    id: str
    seq: int = Field(description="Append order in the thread: unique, increasing, never reused "
                     "(handed out without gaps; removed messages leave theirs unused).")
    position: int = Field(description="Views sort by (position, seq).")
    role: str
    content: str | list[dict[str, Any]] | None
    item: Any = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    agent_name: str | None = None
    metadata: JsonObject
    created_at: Timestamp
    status: Status
    compaction_id: str | None = Field(
        None, description="Compacted: the compaction that replaced it. "
        "A summary: the compaction that wrote it.",
    )
    parent_id: str | None = Field(
        None, description="The message this one continues, as sent on append.")

    @classmethod
    def from_row(cls, row: Any) -> MessageOut:
        return cls(**cls._fields_of(row))

    @staticmethod
    def _fields_of(row: Any) -> dict[str, Any]:
        compacted = row.status == "compacted"
        return {
            "id": row.message_id, "seq": row.seq, "position": row.position, "role": row.role,
            "content": row.content, "item": row.item, "name": row.name,
            "tool_calls": row.tool_calls, "tool_call_id": row.tool_call_id,
            "agent_name": row.agent_name, "metadata": row.metadata,
            "created_at": row.created_at, "status": row.status,
            "compaction_id": row.compacted_by if compacted else row.summary_of,
            "parent_id": row.parent_id,
        }

    @model_serializer(mode="wrap")
    def _drop_absent(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]  # unannotated: keeps the fields in the OpenAPI schema
        data = handler(self)
        for key in _OPTIONAL:
            if data.get(key) is None:
                data.pop(key, None)
        return data


if TYPE_CHECKING:
    MessageMembersOut = MessageOut
else:  # every member of MessageOut, none required: made from it, so the two never part
    MessageMembersOut = create_model(
        "MessageMembersOut",
        __doc__="A message of a page asked for with `fields` (or `messages_fields`): only the "
                "members named, each as in `MessageOut`.",
        **{name: (info.annotation, Field(None, description=info.description))
           for name, info in MessageOut.model_fields.items()})
# A page's message, with or without `fields` (the OpenAPI document's; nothing is built of it).
PageMessage = MessageOut | MessageMembersOut


# The columns `render_message` reads, in this order (a row unpacks by position ten times
# faster than its attributes are read by name).
RENDERED_COLUMNS = ("message_id", "seq", "position", "role", "content", "item", "name",
                    "tool_calls", "tool_call_id", "agent_name", "metadata", "created_at",
                    "status", "compacted_by", "summary_of", "parent_id")


def render_message(row: Any) -> str:
    """`MessageOut.from_row(row)` as JSON text, the same members in the same order, from a
    row of `RENDERED_COLUMNS` with the JSON ones as their stored text and `created_at` as a
    datetime or as `utc_text` writes it (`MessageRepository.page(..., as_stored=True)`): a
    page of 1,000 messages is rendered without parsing and re-serialising each one.
    tests/test_messages.py holds the two renderings equal."""
    (message_id, seq, position, role, content, item, name, tool_calls, tool_call_id,
     agent_name, metadata, created_at, status, compacted_by, summary_of, parent_id) = row
    parts = [(f'{{"id":{json_string(message_id)},"seq":{seq},"position":{position},'
              f'"role":{json_string(role)},"content":{content or "null"}')]
    if item is not None and item != "null":
        parts.append(f',"item":{item}')
    if name is not None:
        parts.append(f',"name":{json_string(name)}')
    if tool_calls is not None and tool_calls != "null":
        parts.append(f',"tool_calls":{tool_calls}')
    if tool_call_id is not None:
        parts.append(f',"tool_call_id":{json_string(tool_call_id)}')
    if agent_name is not None:
        parts.append(f',"agent_name":{json_string(agent_name)}')
    created = created_at if type(created_at) is str else utc_text(created_at)
    parts.append(f',"metadata":{metadata},"created_at":"{created}","status":"{status}"')
    compaction = compacted_by if status == "compacted" else summary_of
    if compaction is not None:
        parts.append(f',"compaction_id":{json_string(compaction)}')
    if parent_id is not None:
        parts.append(f',"parent_id":{json_string(parent_id)}')
    parts.append("}")
    return "".join(parts)


class LineageMessageOut(MessageOut):
    """A message of a lineage, which may cross threads: it names its thread."""

    thread_id: str

    @classmethod
    def from_row(cls, row: Any) -> LineageMessageOut:
        return cls(**cls._fields_of(row), thread_id=row.thread_id)


LINEAGE_CURSOR = "lineage"


def _text(value: Any) -> str | None:
    return None if value is None else json_string(value)


def _time(value: Any) -> str:
    return f'"{value if type(value) is str else utc_text(value)}"'


def _json(value: str | None) -> str | None:
    return None if value is None or value == "null" else value


# Each member of a rendered message as its JSON text from a row of RENDERED_COLUMNS, or
# None where `render_message` leaves it out.
_MEMBER_TEXT: dict[str, Callable[[Any], str | None]] = {
    "id": lambda row: json_string(row.message_id),
    "seq": lambda row: str(row.seq),
    "position": lambda row: str(row.position),
    "role": lambda row: json_string(row.role),
    "content": lambda row: row.content or "null",
    "item": lambda row: _json(row.item),
    "name": lambda row: _text(row.name),
    "tool_calls": lambda row: _json(row.tool_calls),
    "tool_call_id": lambda row: _text(row.tool_call_id),
    "agent_name": lambda row: _text(row.agent_name),
    "metadata": lambda row: row.metadata,
    "created_at": lambda row: _time(row.created_at),
    "status": lambda row: f'"{row.status}"',
    "compaction_id": lambda row: _text(
        row.compacted_by if row.status == "compacted" else row.summary_of),
    "parent_id": lambda row: _text(row.parent_id),
}
# The members a page's `fields` may name, in the order a message has them.
MESSAGE_FIELDS = tuple(MessageOut.model_fields)
assert set(MESSAGE_FIELDS) == set(_MEMBER_TEXT)
# The columns each member reads, where they are not its own name.
_MEMBER_COLUMNS = {"id": ("message_id",), "compaction_id": ("status", "compacted_by",
                                                           "summary_of")}


def _known_members(fields: str) -> str:
    unknown = [name for name in fields.split(",") if name not in MESSAGE_FIELDS]
    if unknown:
        raise ValueError(f"no message member {unknown[0]!r}; the members are "
                         f"{', '.join(MESSAGE_FIELDS)} (comma-separated, no spaces)")
    return fields


_FIELD = "(?:" + "|".join(MESSAGE_FIELDS) + ")"
# A query parameter naming message members, comma-separated (`fields`, `messages_fields`):
# 422 for a name that is not one; `member_set` reads it.
MessageMembers = Annotated[str, AfterValidator(_known_members)]
MEMBERS_SCHEMA = {"pattern": f"^{_FIELD}(?:,{_FIELD})*$"}
MEMBERS_DOC = ("Only these members of each message, comma-separated (e.g. `item`, or "
               "`id,role,content`); the others are left out of the page, which is paged and "
               "limited as without. Members: "
               + ", ".join(f"`{name}`" for name in MESSAGE_FIELDS) + ".")


def member_set(fields: str | None) -> frozenset[str] | None:
    return None if fields is None else frozenset(fields.split(","))


def columns_of(fields: Collection[str] | None) -> set[str] | None:
    """The columns of RENDERED_COLUMNS that `render_fields(fields)` reads (None: all)."""
    if fields is None:
        return None
    return {column for name in fields for column in _MEMBER_COLUMNS.get(name, (name,))}


def render_fields(fields: Collection[str]) -> Callable[[Any], str]:
    """`render_message` with only the members in `fields` (in the message's own order), from
    a row that needs only `columns_of(fields)`."""
    members = [(f'"{name}":', _MEMBER_TEXT[name]) for name in MESSAGE_FIELDS if name in fields]
    if len(members) == 1:  # an adapter's `item` alone: without the join's generator
        (key, member), = members

        def render_one(row: Any) -> str:
            text = member(row)
            return "{}" if text is None else "{" + key + text + "}"

        return render_one

    def render(row: Any) -> str:
        return "{" + ",".join(key + text for key, member in members
                              if (text := member(row)) is not None) + "}"

    return render


def renderer(fields: Collection[str] | None) -> Callable[[Any], str]:
    """How a page renders each message: whole, or only the members in `fields`."""
    return render_message if fields is None else render_fields(fields)


def message_page(rows: Sequence[Any], limit: int, max_bytes: int,
                 render: Callable[[Any], str] = render_message) -> RenderedPage:
    """A page of messages read `as_stored` with `limit + 1` rows: each rendered by `render`
    (see `renderer`), with the cursor after it if there is more (`AGENTSTATE_MAX_PAGE_BYTES`
    may end it early)."""
    return split_rendered(MESSAGE_CURSOR, rows, limit, page_key, render, max_bytes=max_bytes)


class AppendOut(BaseModel):
    data: list[MessageOut]
    thread_revision: int


class MessageRedaction(Strict):
    """PATCH of one message: the members sent replace the stored ones (the old values are
    overwritten in the database, not kept aside). `id`, `role`, `seq` and times never change."""

    content: RedactedContent = Field(
        None, description="The new content: a string, an array of content parts (objects; for "
        "the known roles each with a `type`, checked against the message's role), or null.")
    item: Any = Field(None, description="The new item; null removes it.")
    metadata: JsonObject | None = Field(None, description="The new metadata; null: empty.")


class MessageRemoval(Strict):
    """Which messages `POST .../messages:remove` deletes: `ids`, or the last `last` of the
    live view, or those whose position lies after `after_seq` and/or before `before_seq`."""

    ids: list[Name] | None = Field(None, min_length=1, max_length=1000)
    last: Annotated[int, Field(ge=1, le=1000)] | None = Field(
        None, description="The last n messages of the live view (pop).")
    after_seq: Annotated[int, Field(ge=0, le=2**62)] | None = Field(
        None, description="Remove every message whose position is above it.")
    before_seq: Annotated[int, Field(ge=1, le=2**62)] | None = Field(
        None, description="Remove every message whose position is below it.")


class RemoveOut(BaseModel):
    data: list[MessageOut] = Field(description="The removed messages, in view order.")
    thread_revision: int
