"""The export format: versioned NDJSON, one record per line, no internal row ids.

The format is declared, not written out by hand: `KINDS` maps every table with tenant data to
a record kind and the natural key that names a row across databases (a thread by
`(tenant_id, thread_id)`, a message by `(tenant_id, thread_id, seq)`, ...). A record's fields
are the table's columns, in table order, minus its internal columns (surrogate ids and the
foreign keys that point at them), plus `thread_id` where a foreign key to `threads` stood. So
a column added to a mapped table is exported and imported without touching this module, and
`tests/test_portability.py` fails while any tenant table has no kind.

A file is:

    {"format": "agentstate-export", "version": 1, "schema": "<alembic head>", "secrets": ...}
    api_key records, mcp_server records
    for each thread, by (tenant_id, thread_id):
        the thread record, then its thread_revision, message, compaction, agent_state,
        idempotency_key, checkpoint, checkpoint_blob, checkpoint_item, checkpoint_write and
        event records, then
        {"kind": "thread_end", "tenant_id": ..., "thread_id": ..., "records": {kind: count}}
    event records that name no thread of the file
    {"kind": "end", "records": <every record line above>}

`docs/export-format.md` is the reader's description; this module is the definition.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from typing import Any, Literal

from sqlalchemy.schema import Column, Table

from app.core.jsonutil import dumps
from app.core.schemas import utc_text
from app.db.models import Base

FORMAT = "agentstate-export"
VERSION = 1
THREAD_TABLE = "threads"
THREAD_KEY = ("tenant_id", "thread_id")
Scope = Literal["global", "tenant", "thread"]
SecretsMode = Literal["ciphertext", "passphrase", "redacted"]


@dataclass(frozen=True)
class Kind:
    """How the rows of one table travel.

    `key`: the fields that name a row in any database (a unique constraint of the table, with
    `thread_id` standing for the foreign key to `threads`). `order`: the order of the rows in
    a file, within their scope. `scope`: "thread" kinds travel inside their thread's bundle
    and are written in its transaction; "tenant" and "global" kinds stand alone.
    """

    name: str
    table_name: str
    key: tuple[str, ...]
    order: tuple[str, ...]
    scope: Scope

    @cached_property
    def table(self) -> Table:
        return Base.metadata.tables[self.table_name]

    @cached_property
    def thread_fk(self) -> str | None:
        """The column that points at `threads.id`, if any: it travels as `thread_id`."""
        for column in self.table.c:
            if any(fk.column.table.name == THREAD_TABLE for fk in column.foreign_keys):
                return column.name
        return None

    @cached_property
    def internal(self) -> frozenset[str]:
        """Columns that never leave the database: surrogate ids and foreign keys to them."""
        names = {column.name for column in self.table.c if column.foreign_keys}
        # A single-column integer primary key that is not part of the natural key is a
        # surrogate id.
        pk = list(self.table.primary_key.columns)
        if len(pk) == 1 and pk[0].type.python_type is int and pk[0].name not in self.key:
            names.add(pk[0].name)
        return frozenset(names)

    @cached_property
    def columns(self) -> tuple[Column[Any], ...]:
        """The table columns a record carries, in table order."""
        return tuple(column for column in self.table.c if column.name not in self.internal)

    @cached_property
    def fields(self) -> tuple[str, ...]:
        """Every field of a record but `kind`, in file order: the key, then the rest."""
        rest = [column.name for column in self.columns if column.name not in self.key]
        return (*self.key, *rest)

    @cached_property
    def sealed(self) -> frozenset[str]:
        return frozenset(name for name in self.fields if f"{self.table_name}.{name}" in SEALED)

    @cached_property
    def virtual(self) -> frozenset[str]:
        """Fields that are no column of the table (`thread_id` for a foreign key)."""
        return frozenset(self.fields) - {column.name for column in self.columns}


KINDS: tuple[Kind, ...] = (
    Kind("api_key", "api_keys", ("key_id",), ("key_id",), "global"),
    Kind("mcp_server", "mcp_servers", ("tenant_id", "server_name"),
         ("tenant_id", "server_name"), "tenant"),
    Kind("thread", "threads", THREAD_KEY, THREAD_KEY, "tenant"),
    Kind("thread_revision", "thread_revisions", (*THREAD_KEY, "revision"), ("revision",),
         "thread"),
    Kind("message", "messages", (*THREAD_KEY, "seq"), ("seq",), "thread"),
    Kind("compaction", "compactions", (*THREAD_KEY, "seq"), ("seq",), "thread"),
    Kind("agent_state", "agent_states", (*THREAD_KEY, "agent_name"), ("agent_name",), "thread"),
    Kind("idempotency_key", "idempotency_keys", (*THREAD_KEY, "endpoint", "key"),
         ("endpoint", "key"), "thread"),
    # Checkpoints and what hangs off them (app/checkpoints): bytes travel as base64.
    Kind("checkpoint", "checkpoints", (*THREAD_KEY, "checkpoint_ns", "checkpoint_id"),
         ("checkpoint_ns", "checkpoint_id"), "thread"),
    Kind("checkpoint_blob", "checkpoint_blobs",
         (*THREAD_KEY, "checkpoint_ns", "channel", "version"),
         ("checkpoint_ns", "channel", "version"), "thread"),
    Kind("checkpoint_item", "checkpoint_items", (*THREAD_KEY, "digest"), ("digest",),
         "thread"),
    Kind("checkpoint_write", "checkpoint_writes",
         (*THREAD_KEY, "checkpoint_ns", "checkpoint_id", "task_id", "idx"),
         ("checkpoint_ns", "checkpoint_id", "task_id", "idx"), "thread"),
    Kind("tenant_idempotency_key", "tenant_idempotency_keys", ("tenant_id", "endpoint", "key"),
         ("tenant_id", "endpoint", "key"), "tenant"),
    # The store (app/store): items and their vectors name their item by address.
    Kind("store_item", "store_items", ("tenant_id", "namespace", "key"),
         ("tenant_id", "namespace", "key"), "tenant"),
    Kind("store_vector", "store_vectors", ("tenant_id", "namespace", "key", "index_name", "field"),
         ("tenant_id", "namespace", "key", "index_name", "field"), "tenant"),
    # Events name their thread by id, not by key: those of a thread in the file travel in its
    # bundle, the others (MCP servers', a purged thread's) after the last bundle.
    Kind("event", "events", ("tenant_id", "seq"), ("seq",), "thread"),
)
BY_NAME = {kind.name: kind for kind in KINDS}
BY_TABLE = {kind.table_name: kind for kind in KINDS}
THREAD = BY_NAME["thread"]
CHILDREN = tuple(kind for kind in KINDS if kind.scope == "thread")
EVENT = BY_NAME["event"]
THREAD_END = "thread_end"
END = "end"
# Columns marked secret travel sealed (the `secrets` object of app/portability/secrets.py) or,
# where what is stored is no secret to whoever reads the file, as stored: an API key's hash
# is sha256 of a 256-bit random token, which no one can invert, and a restored database needs
# it for the key to keep working.
SEALED = frozenset({"mcp_servers.secrets"})
PORTABLE_SECRETS = frozenset({"api_keys.hash"})


def tenant_tables() -> list[Table]:
    """Every table with tenant data: each must have a kind."""
    return [table for table in Base.metadata.sorted_tables if "tenant_id" in table.c]


# --- values ------------------------------------------------------------------------------


def timestamp_text(value: datetime) -> str:
    return utc_text(value.astimezone(UTC))


def parse_timestamp(text: str) -> datetime:
    """RFC 3339 with a time zone, as every timestamp of the format is written."""
    value = datetime.fromisoformat(text)
    if value.tzinfo is None:
        raise ValueError("a timestamp needs a time zone (Z)")
    return value.astimezone(UTC)


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return timestamp_text(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"cannot write {type(value).__name__}")


def encode(record: dict[str, Any]) -> str:
    """One line of the file (without its newline): compact JSON in the record's own order."""
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False, default=_json_default)


Form = Literal["timestamp", "int", "bool", "str", "bytes", "json"]


def column_kind(column: Column[Any]) -> Form:
    """How a column's values are written: timestamps as RFC 3339 text, bytes as base64,
    JSON as JSON."""
    sql_type = getattr(column.type, "impl_instance", column.type)  # a TypeDecorator's base
    if sql_type.__visit_name__ == "JSON":
        return "json"
    python_type = sql_type.python_type
    if python_type is datetime:
        return "timestamp"
    if python_type is bool:
        return "bool"
    if python_type is int:
        return "int"
    if python_type is bytes:
        return "bytes"
    if python_type is str:
        return "str"
    raise TypeError(f"{column.table.name}.{column.name}: no format for {column.type!r}")


@dataclass
class Header:
    schema: str | None
    secrets: SecretsMode = "ciphertext"
    # scrypt parameters and salt when secrets are sealed under a passphrase.
    kdf: dict[str, Any] | None = None
    version: int = VERSION

    def line(self) -> str:
        header: dict[str, Any] = {"format": FORMAT, "version": self.version,
                                  "schema": self.schema, "secrets": self.secrets}
        if self.kdf is not None:
            header["kdf"] = self.kdf
        return dumps(header)


@dataclass
class Counts:
    """Records per kind, in KINDS order (the `records` of a `thread_end`)."""

    by_kind: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, n: int = 1) -> None:
        self.by_kind[kind] = self.by_kind.get(kind, 0) + n

    def as_record(self) -> dict[str, int]:
        return {kind.name: self.by_kind[kind.name] for kind in KINDS
                if self.by_kind.get(kind.name)}

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())
