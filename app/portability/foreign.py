"""Importers for the stores agentstate replaces: their data as records of the export format.

The records go through the same import as an export file (validated as the API validates,
a thread per transaction, idempotent), so an importer only says what becomes what:

- aisuite 0.2.0 `FileStateStore` (a directory of `<quoted thread id>.json` files, each a
  `StoredRunState`) and `PostgresStateStore` (tables `agent_thread_heads`, `agent_messages`,
  `agent_compactions`): a stored run state becomes a thread at the same revision, its
  `RunState` without messages the thread's state, its metadata the thread's metadata, its
  messages the thread's log, stored as `agentstate_client.aisuite.AgentStateStore` stores
  them (members without a field of their own in `metadata["aisuite"]`), so that store loads
  exactly what aisuite's store loaded. Postgres compactions become compactions; messages a
  later save dropped from the context without a compaction are not imported (named in a
  note).
- Colosseum (tables `agent_states`, `conversation_history`, `mcp_server_states` of the seed
  design): a session becomes a thread; its conversation rows its messages, in timestamp
  order with ties in the order they were saved (row id); each agent's state rows the agent's
  state at its latest save; MCP server rows MCP servers (their state as it was, no secrets:
  the design keeps none apart).

Generated message ids are derived from the source (`aisuite-<n>`, `colosseum-<row id>`), so
importing the same data twice writes nothing the second time.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from app.core.settings import normalise_database_url
from app.portability.format import END, THREAD_END, Counts, timestamp_text
from app.portability.reader import Item
from app.portability.repository import AisuiteRepository, ColosseumRepository

AISUITE_KEY = "aisuite"
# Members of an aisuite message that agentstate keeps as fields (besides role and content);
# the same as agentstate_client.aisuite.FIELDS.
AISUITE_FIELDS = ("name", "tool_calls", "tool_call_id")


@dataclass
class ForeignSource:
    """The records of another store, and what could not be carried over (notes)."""

    items: AsyncIterator[Item]
    notes: list[str] = field(default_factory=list)


def foreign_source(fmt: str, source: str, tenant_id: str) -> ForeignSource:
    notes: list[str] = []
    if fmt == "aisuite-files":
        units = _aisuite_files(Path(source), tenant_id, notes)
    elif fmt == "aisuite-postgres":
        units = _aisuite_postgres(source, tenant_id, notes)
    elif fmt == "colosseum":
        units = _colosseum(source, tenant_id)
    else:
        raise ValueError(f"unknown format {fmt!r}")
    return ForeignSource(_items(units), notes)


Unit = tuple[str, list[dict[str, Any]]]


async def _items(units: AsyncIterator[Unit]) -> AsyncIterator[Item]:
    """Records with the thread_end and end lines an export has."""
    total = 0
    async for where, records in units:
        counts = Counts()
        for number, record in enumerate(records):
            yield Item(f"{where}, record {number + 1}" if len(records) > 1 else where, record)
            counts.add(record["kind"])
        total += counts.total
        if records[0]["kind"] == "thread":
            yield Item(where, {"kind": THREAD_END, "tenant_id": records[0]["tenant_id"],
                               "thread_id": records[0]["thread_id"],
                               "records": counts.as_record()})
    yield Item("the end", {"kind": END, "records": total})


def _text(value: Any) -> str:
    """A timestamp as the format writes it (a naive one is UTC, as both stores write them)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return timestamp_text(value)


def _thread(tenant_id: str, thread_id: str, *, revision: int, state: Any, metadata: Any,
            created_at: str, updated_at: str, last_seq: int,
            live: int) -> list[dict[str, Any]]:
    key = {"tenant_id": tenant_id, "thread_id": thread_id}
    return [
        {"kind": "thread", **key, "revision": revision, "state": state, "metadata": metadata,
         "created_at": created_at, "updated_at": updated_at, "deleted_at": None,
         "last_seq": last_seq, "message_count": live, "history_limit": None},
        # The history entry a write of this state leaves.
        {"kind": "thread_revision", **key, "revision": revision, "state": state,
         "metadata": metadata, "updated_at": updated_at},
    ]


def _message(tenant_id: str, thread_id: str, seq: int, message_id: str, fields: dict[str, Any],
             *, created_at: str, revision: int, position: int | None = None,
             status: str = "live", compacted_by: str | None = None,
             summary_of: str | None = None) -> dict[str, Any]:
    return {"kind": "message", "tenant_id": tenant_id, "thread_id": thread_id, "seq": seq,
            "message_id": message_id, "position": position or seq,
            "role": fields.get("role"), "content": fields.get("content"),
            "name": fields.get("name"), "tool_calls": fields.get("tool_calls"),
            "tool_call_id": fields.get("tool_call_id"), "agent_name": fields.get("agent_name"),
            "metadata": fields.get("metadata", {}), "created_at": created_at,
            "status": status, "compacted_by": compacted_by, "summary_of": summary_of,
            "revision": revision}


def aisuite_message(message: dict[str, Any]) -> dict[str, Any]:
    """An aisuite message as agentstate message fields, exactly as
    `agentstate_client.aisuite.to_log_message` stores it (tests/test_import_from_other_stores.py
    loads the import back through that store)."""
    stored: dict[str, Any] = {"role": message.get("role"), "content": message.get("content")}
    extra: dict[str, Any] = {}
    for key, value in message.items():
        if key in AISUITE_FIELDS and value is not None:
            stored[key] = value
        elif key not in ("role", "content"):
            extra[key] = value
    kept: dict[str, Any] = {}
    if extra:
        kept["fields"] = extra
    if "content" not in message:
        kept["no_content"] = True
    stored["metadata"] = {AISUITE_KEY: kept} if kept else {}
    return stored


def _run_state(state: dict[str, Any]) -> dict[str, Any]:
    """A RunState dict without its messages: the thread's state (as AgentStateStore keeps)."""
    return {key: value for key, value in state.items() if key != "messages"}


# --- aisuite FileStateStore --------------------------------------------------------------


async def _aisuite_files(root: Path, tenant_id: str, notes: list[str]) -> AsyncIterator[Unit]:
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory")
    # FileStateStore writes `<quote(thread_id, safe='')>.json`, through a `.<name>.<id>.tmp`
    # file it renames into place: those are left over from an interrupted save.
    for path in sorted(root.glob("*.json")):
        if path.name.startswith("."):
            continue
        where = f"{path.name}"
        stored = json.loads(path.read_text(encoding="utf-8"))
        if stored.get("schema_version", 1) != 1:
            notes.append(f"{where}: schema_version {stored.get('schema_version')} is not 1; "
                         "not imported")
            continue
        thread_id = stored["thread_id"]
        if unquote(path.stem) != thread_id:
            notes.append(f"{where}: holds thread {thread_id!r}, not the one its name says")
        revision, updated = int(stored["revision"]), _text(stored["updated_at"])
        messages = list(stored["state"].get("messages") or [])
        records = _thread(tenant_id, thread_id, revision=revision,
                          state=_run_state(stored["state"]),
                          metadata=stored.get("metadata") or {},
                          created_at=_text(stored["created_at"]), updated_at=updated,
                          last_seq=len(messages), live=len(messages))
        records += [_message(tenant_id, thread_id, seq, f"aisuite-{seq}", aisuite_message(m),
                             created_at=updated, revision=revision)
                    for seq, m in enumerate(messages, start=1)]
        yield where, records


# --- aisuite PostgresStateStore ----------------------------------------------------------


async def _aisuite_postgres(url: str, tenant_id: str, notes: list[str]) -> AsyncIterator[Unit]:
    engine = create_async_engine(normalise_database_url(url))
    try:
        async with engine.connect() as connection, connection.begin():
            repo = AisuiteRepository(connection)
            async for head in repo.heads():
                rows = {row.message_id: row for row in await repo.messages(head.thread_id)}
                compactions = await repo.compactions(head.thread_id)
                try:
                    records, dropped = _aisuite_thread(tenant_id, head, rows, compactions)
                except ValueError as exc:  # this thread only: the others still go in
                    notes.append(str(exc))
                    continue
                if dropped:
                    notes.append(f"thread {head.thread_id}: {dropped} messages that a later "
                                 "save replaced (no longer in its context, not compacted) "
                                 "were not imported")
                yield f"thread {head.thread_id}", records
    finally:
        await engine.dispose()


def _aisuite_thread(tenant_id: str, head: Any, rows: dict[str, Any],
                    compactions: list[Any]) -> tuple[list[dict[str, Any]], int]:
    """One thread head with its messages and compactions; and how many messages were left
    out because a save dropped them without a compaction."""
    context = list(head.model_context_message_ids or [])
    compacted = set(head.compacted_from_message_ids or [])
    summaries = [c.summary_message_id for c in compactions]
    wanted = set(context) | compacted | set(summaries)
    full = [m for m in head.full_history_message_ids or [] if m in rows]
    # Append order: the history's order, each summary after the messages stored before its
    # compaction (saves and compactions are separate transactions with their own now()).
    order: list[str] = []
    pending = list(compactions)
    for message_id in full:
        while pending and pending[0].created_at < rows[message_id].created_at:
            order.append(pending.pop(0).summary_message_id)
        order.append(message_id)
    order += [c.summary_message_id for c in pending]
    kept = [m for m in order if m in wanted and m in rows]
    dropped = len([m for m in full if m not in wanted])
    seq_of = {message_id: seq for seq, message_id in enumerate(kept, start=1)}
    position = dict(seq_of)
    by = {}  # message id -> the compaction that replaced it
    made = {}  # summary id -> its compaction
    for compaction in compactions:
        made[compaction.summary_message_id] = compaction.compaction_id
        for source in compaction.source_message_ids:
            by[source] = compaction.compaction_id
        sources = [s for s in compaction.source_message_ids if s in position]
        if sources and compaction.summary_message_id in position:
            position[compaction.summary_message_id] = position[sources[-1]]
    revision, thread_id = int(head.revision), head.thread_id
    updated = _text(head.updated_at)
    live = [m for m in kept if m not in by]
    records = _thread(tenant_id, thread_id, revision=revision, state=_run_state(head.state),
                      metadata=head.metadata or {}, created_at=_text(head.created_at),
                      updated_at=updated, last_seq=len(kept), live=len(live))
    for message_id in kept:
        records.append(_message(
            tenant_id, thread_id, seq_of[message_id], message_id,
            aisuite_message(rows[message_id].message), created_at=_text(
                rows[message_id].created_at), revision=revision,
            position=position[message_id],
            status="compacted" if message_id in by else "live",
            compacted_by=by.get(message_id), summary_of=made.get(message_id)))
    for compaction in compactions:
        records.append({
            "kind": "compaction", "tenant_id": tenant_id, "thread_id": thread_id,
            "seq": seq_of.get(compaction.summary_message_id, 0),
            "compaction_id": compaction.compaction_id,
            "source_message_ids": list(compaction.source_message_ids),
            "summary_message_id": compaction.summary_message_id,
            "summary_text": compaction.summary_text, "reason": compaction.reason,
            "model": compaction.model, "input_token_count": compaction.input_token_count,
            "output_token_count": compaction.output_token_count,
            "metadata": compaction.metadata or {}, "created_at": _text(compaction.created_at),
            "thread_revision": revision, "reverted_at": None, "reverted_revision": None})
    # The live view (position, seq) must be aisuite's model context, in its order.
    view = sorted(live, key=lambda m: (position[m], seq_of[m]))
    if view != [m for m in context if m in rows]:
        raise ValueError(f"thread {thread_id}: its context cannot be ordered as agentstate "
                         "orders a live view")
    return records, dropped


# --- Colosseum ---------------------------------------------------------------------------


def _colosseum_url(source: str) -> str:
    if "://" in source:
        return normalise_database_url(source)
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"{source} does not exist")
    return f"sqlite+aiosqlite:///{path}"


async def _colosseum(source: str, tenant_id: str) -> AsyncIterator[Unit]:
    url = _colosseum_url(source)
    engine = create_async_engine(url)
    label = make_url(url).render_as_string(hide_password=True)
    try:
        async with engine.connect() as connection, connection.begin():
            repo = ColosseumRepository(connection)
            latest = await repo.latest()
            async for session_id in repo.sessions():
                yield (f"{label} session {session_id}",
                       _colosseum_thread(tenant_id, session_id, await repo.history(session_id),
                                         await repo.states(session_id)))
            for server in await repo.servers():
                stamp = _text(server.last_connected or latest or datetime(1970, 1, 1))
                yield f"{label} MCP server {server.server_name}", [{
                    "kind": "mcp_server", "tenant_id": tenant_id,
                    "server_name": server.server_name, "server_type": server.server_type,
                    "revision": 1, "state": server.state_data if server.state_data is not None
                    else {}, "secret_names": [], "secrets": None,
                    "last_connected_at": (_text(server.last_connected)
                                          if server.last_connected else None),
                    "created_at": stamp, "updated_at": stamp, "deleted_at": None}]
    finally:
        await engine.dispose()


def _colosseum_thread(tenant_id: str, session_id: str, history: list[Any],
                      states: list[Any]) -> list[dict[str, Any]]:
    latest: dict[str, Any] = {}
    first: dict[str, Any] = {}
    for row in states:  # per agent oldest first: the last one is the latest save
        first.setdefault(row.agent_name, row)
        latest[row.agent_name] = row
    stamps = [row.timestamp for row in history] + [row.created_at for row in states] + [
        row.updated_at for row in states if row.updated_at is not None]
    created, updated = _text(min(stamps)), _text(max(stamps))
    records = _thread(tenant_id, session_id, revision=1, state={}, metadata={},
                      created_at=created, updated_at=created, last_seq=len(history),
                      live=len(history))
    records[0]["updated_at"] = updated
    for seq, row in enumerate(history, start=1):
        records.append(_message(
            tenant_id, session_id, seq, f"colosseum-{row.id}",
            {"role": row.role, "content": row.content, "agent_name": row.agent_name,
             "metadata": row.metadata if row.metadata is not None else {}},
            created_at=_text(row.timestamp), revision=1))
    for agent_name, row in latest.items():
        records.append({
            "kind": "agent_state", "tenant_id": tenant_id, "thread_id": session_id,
            "agent_name": agent_name, "revision": 1, "state": row.state_data,
            "created_at": _text(first[agent_name].created_at),
            "updated_at": _text(row.updated_at or row.created_at), "deleted_at": None})
    return records
