"""An imported record is checked as the API checks what it stores: the column types of its
table, then the API's own request schemas for the fields a client can send (a message is a
`MessageIn`, a thread's metadata has the API's key limit, names follow `NAME_PATTERN`, ...).
A record that would not have been accepted over HTTP is not accepted from a file either.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from functools import cache
from typing import Annotated, Any, get_args

from pydantic import BaseModel, TypeAdapter, ValidationError

from app.agent_states.schemas import AgentStateReplace
from app.compactions.schemas import CompactionIn
from app.core.errors import AppError
from app.core.limits import check_metadata
from app.core.principal import ALL_SCOPES
from app.core.schemas import Name
from app.core.settings import Settings
from app.mcp_servers.schemas import McpServerReplace
from app.messages.schemas import MessageIn, Status
from app.portability.format import Kind, column_kind, parse_timestamp
from app.threads.schemas import ThreadCreate

_HEX16 = re.compile(r"^[0-9a-f]{16}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_NAME = TypeAdapter(Name)


class RecordInvalid(ValueError):
    """A record the API would not have stored; the message names the field."""


def _fail(field: str, message: str) -> RecordInvalid:
    return RecordInvalid(f"{field}: {message}")


@cache
def _adapter(model: type[BaseModel], name: str) -> TypeAdapter[Any]:
    info = model.model_fields[name]
    annotation: Any = info.annotation
    return TypeAdapter(Annotated[annotation, *info.metadata] if info.metadata else annotation)


def _schema_fields(model: type[BaseModel], record: dict[str, Any],
                   renames: dict[str, str] | None = None) -> None:
    """Validate the record's fields that `model` (an API request body) also has."""
    renames = renames or {}
    for field, value in record.items():
        name = renames.get(field, field)
        if name in model.model_fields:
            try:
                _adapter(model, name).validate_python(value)
            except ValidationError as exc:
                raise _fail(field, exc.errors()[0]["msg"]) from None


def _name(record: dict[str, Any], *fields: str) -> None:
    for field in fields:
        value = record[field]
        if value is not None:
            try:
                _NAME.validate_python(value)
            except ValidationError:
                raise _fail(field, f"{value!r} is not a valid name") from None


def _at_least(record: dict[str, Any], minimum: int, *fields: str) -> None:
    for field in fields:
        if record[field] is not None and record[field] < minimum:
            raise _fail(field, f"must be at least {minimum}")


def _metadata(record: dict[str, Any], settings: Settings, field: str = "metadata") -> None:
    try:
        check_metadata(record[field], settings)
    except AppError as exc:
        raise _fail(field, exc.detail) from None


def _thread(record: dict[str, Any], settings: Settings) -> None:
    _name(record, "tenant_id", "thread_id")
    _schema_fields(ThreadCreate, record)
    _metadata(record, settings)
    _at_least(record, 1, "revision")
    _at_least(record, 0, "last_seq", "message_count")
    if record["message_count"] > record["last_seq"]:
        raise _fail("message_count", "more live messages than seqs handed out")
    _name(record, "forked_from_thread_id")
    _at_least(record, 1, "forked_from_revision")
    if (record["forked_from_thread_id"] is None) != (record["forked_from_revision"] is None):
        raise _fail("forked_from_revision", "goes with forked_from_thread_id, or neither")


def _thread_revision(record: dict[str, Any], settings: Settings) -> None:
    _schema_fields(ThreadCreate, record)
    _at_least(record, 1, "revision")


def _message(record: dict[str, Any], settings: Settings) -> None:
    sent = {name: value for name, value in record.items()
            if name in MessageIn.model_fields and value is not None}
    sent["id"] = record["message_id"]
    try:
        MessageIn.model_validate(sent)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"]) or "message"
        raise _fail("message_id" if where == "id" else where, error["msg"]) from None
    _metadata(record, settings)
    if record["status"] not in get_args(Status):
        raise _fail("status", f"must be one of {', '.join(get_args(Status))}")
    _name(record, "compacted_by", "summary_of", "parent_thread_id")
    _at_least(record, 1, "seq", "position", "parent_seq")
    _at_least(record, 0, "revision")
    # A parent link is the id as sent and where it pointed (API.md section 4): all or none.
    link = [record[name] is None for name in ("parent_id", "parent_thread_id", "parent_seq")]
    if len(set(link)) > 1:
        raise _fail("parent_id", "parent_id, parent_thread_id and parent_seq go together")


def _compaction(record: dict[str, Any], settings: Settings) -> None:
    _schema_fields(CompactionIn, record)
    _metadata(record, settings)
    _name(record, "compaction_id", "summary_message_id")
    _at_least(record, 1, "seq", "thread_revision")


def _agent_state(record: dict[str, Any], settings: Settings) -> None:
    _name(record, "agent_name")
    _schema_fields(AgentStateReplace, record)
    _at_least(record, 1, "revision")


def _idempotency_key(record: dict[str, Any], settings: Settings) -> None:
    if not record["endpoint"] or not record["key"]:
        raise _fail("key", "endpoint and key must not be empty")
    if not _HEX64.match(record["request_hash"]):
        raise _fail("request_hash", "must be 64 hex digits")
    if not 100 <= record["status"] <= 599:
        raise _fail("status", "must be an HTTP status")
    if not isinstance(record["response"], dict):
        raise _fail("response", "must be an object")


def _mcp_server(record: dict[str, Any], settings: Settings) -> None:
    _name(record, "tenant_id", "server_name")
    _schema_fields(McpServerReplace, {name: value for name, value in record.items()
                                      if name in ("server_type", "state")})
    names = record["secret_names"]
    if not isinstance(names, list) or len(set(map(str, names))) != len(names):
        raise _fail("secret_names", "must be a list of distinct names")
    for name in names:
        try:
            _NAME.validate_python(name)
        except ValidationError:
            raise _fail("secret_names", f"{name!r} is not a valid name") from None
    _at_least(record, 1, "revision")


def _api_key(record: dict[str, Any], settings: Settings) -> None:
    if not _HEX16.match(record["key_id"]):
        raise _fail("key_id", "must be 16 hex digits")
    _name(record, "tenant_id", "name")
    scopes = set(record["scopes"].split(","))
    if not scopes <= ALL_SCOPES:
        raise _fail("scopes", f"must be a subset of {', '.join(sorted(ALL_SCOPES))}")
    if not _HEX64.match(record["hash"]):
        raise _fail("hash", "must be 64 hex digits (sha256)")


def _event(record: dict[str, Any], settings: Settings) -> None:
    _name(record, "tenant_id", "thread_id", "actor")
    if not record["type"] or not record["resource"].startswith("/"):
        raise _fail("resource", "an event names its type and the path of its resource")
    _at_least(record, 1, "seq")
    _at_least(record, 0, "revision")


def _checkpoint(record: dict[str, Any], settings: Settings) -> None:
    _name(record, "checkpoint_id", "parent_checkpoint_id")
    for field in ("checkpoint", "metadata"):
        if not isinstance(record[field], dict):
            raise _fail(field, "must be an object")
    if not _HEX64.match(record["content_hash"]):
        raise _fail("content_hash", "must be 64 hex digits (sha256)")


def _checkpoint_blob(record: dict[str, Any], settings: Settings) -> None:
    if (record["data"] is None) == (record["items"] is None):
        raise _fail("data", "a value has either data or items")
    if record["items"] is not None and len(record["items"]) % 16:
        raise _fail("items", "must be 16-byte digests")


def _checkpoint_item(record: dict[str, Any], settings: Settings) -> None:
    if len(record["digest"]) != 16:
        raise _fail("digest", "must be 16 bytes")


def _checkpoint_write(record: dict[str, Any], settings: Settings) -> None:
    _name(record, "checkpoint_id")
    if not record["task_id"]:
        raise _fail("task_id", "must not be empty")


def _store_address(record: dict[str, Any]) -> None:
    from app.store.addressing import canonical_text

    segments = [*record["namespace"].split("/"), record["key"]]
    if any(canonical_text(segment) is None for segment in segments) or len(segments) > 11:
        raise _fail("namespace", "namespace and key must be encoded labels (1-10 and a key)")


def _store_item(record: dict[str, Any], settings: Settings) -> None:
    _store_address(record)
    if not isinstance(record["value"], dict):
        raise _fail("value", "must be an object")
    _at_least(record, 1, "revision")


def _store_vector(record: dict[str, Any], settings: Settings) -> None:
    _store_address(record)
    if record["dims"] < 1 or len(record["embedding"]) != 4 * record["dims"]:
        raise _fail("embedding", "must be dims float32 numbers")


CHECKS: dict[str, Callable[[dict[str, Any], Settings], None]] = {
    "thread": _thread, "thread_revision": _thread_revision, "message": _message,
    "compaction": _compaction, "agent_state": _agent_state,
    "idempotency_key": _idempotency_key, "mcp_server": _mcp_server, "api_key": _api_key,
    "event": _event, "checkpoint": _checkpoint, "checkpoint_blob": _checkpoint_blob,
    "checkpoint_item": _checkpoint_item, "checkpoint_write": _checkpoint_write,
    "store_item": _store_item, "store_vector": _store_vector,
    "tenant_idempotency_key": _idempotency_key,
}


def _value(kind: Kind, field: str, value: Any) -> Any:
    if field in kind.sealed:  # its shape depends on the header (SecretsIn.check)
        return value
    column = kind.table.c.get(field)
    if column is None:  # thread_id, where a foreign key to threads stood
        if not isinstance(value, str):
            raise _fail(field, "must be a string")
        return value
    if value is None:
        if not column.nullable:
            raise _fail(field, "must not be null")
        return None
    form = column_kind(column)
    if form == "timestamp":
        if not isinstance(value, str):
            raise _fail(field, "must be an RFC 3339 timestamp")
        try:
            return parse_timestamp(value)
        except ValueError as exc:
            raise _fail(field, str(exc)) from None
    if form == "int" and (type(value) is not int):
        raise _fail(field, "must be an integer")
    if form == "bool" and not isinstance(value, bool):
        raise _fail(field, "must be true or false")
    if form == "bytes":
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise _fail(field, "must be base64") from None
    if form == "str":
        length = getattr(column.type, "length", None)
        if not isinstance(value, str):
            raise _fail(field, "must be a string")
        if length is not None and len(value) > length:
            raise _fail(field, f"at most {length} characters")
    return value


def decode(kind: Kind, raw: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """The record as stored values (timestamps parsed), in the kind's field order; raises
    RecordInvalid naming the first field the API would have refused."""
    unknown = sorted(set(raw) - {"kind", *kind.fields})
    if unknown:
        raise _fail(unknown[0], f"is not a field of {kind.name} records")
    record: dict[str, Any] = {"kind": kind.name}
    for field in kind.fields:
        if field not in raw:
            column = kind.table.c.get(field)
            if column is None or not column.nullable:
                raise _fail(field, "is missing")
        record[field] = _value(kind, field, raw.get(field))
    CHECKS[kind.name](record, settings)
    return record
