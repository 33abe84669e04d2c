"""Importers of other stores, each reading what the real library wrote: aisuite 0.2.0's
FileStateStore directory and PostgresStateStore tables, and a Colosseum SQLite database made
with the seed design's three models. What the importer stored is read back through the API
and, for aisuite, rebuilt as agentstate_client.aisuite.AgentStateStore rebuilds it."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from agentstate_client.aisuite import from_log_message
from agentstate_client.models import Message
from aisuite.agents.postgres_state_store import PostgresStateStore
from aisuite.agents.state_store import FileStateStore, StoredRunState
from aisuite.agents.types import RunState
from sqlalchemy import JSON, Column, DateTime, Index, Integer, String, Text, create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, declarative_base

from tests.support import create_postgres_database, drop_postgres_database
from tests.test_portability import cli, read_all

pytestmark = pytest.mark.anyio

TOOL_CALL = {"id": "call_1", "type": "function",
             "function": {"name": "lookup", "arguments": "{\"q\": \"AAPL\"}"}}
TURN_1: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": [{"type": "text", "text": "Price of AAPL?"}]},
    # As aisuite stores a model's message: no content member, extra provider members.
    {"role": "assistant", "tool_calls": [TOOL_CALL], "refusal": None, "annotations": []},
    {"role": "tool", "tool_call_id": "call_1", "name": "lookup", "content": "189.1"},
]
TURN_2: list[dict[str, Any]] = [
    {"role": "assistant", "content": "189.1", "artifact_refs": [{"artifact_id": "a1"}]},
    {"role": "user", "content": "And MSFT?"},
]


def run_state(messages: list[dict[str, Any]], **changes: Any) -> RunState:
    fields = {"status": "requires_input", "run_name": "r", "trace_id": "trace_1",
              "tags": ["desk"], "metadata": {"k": 1}, "max_turns": 7, **changes}
    return RunState(agent_name="analyst", messages=[dict(m) for m in messages], **fields)


async def loaded(client: httpx.AsyncClient, thread_id: str) -> tuple[int, dict, dict]:
    """(revision, RunState dict, metadata) as AgentStateStore.load_state rebuilds them."""
    thread = (await client.get(f"/v1/threads/{thread_id}")).json()
    messages = await read_all(client, f"/v1/threads/{thread_id}/messages")
    state = RunState.from_dict({**thread["state"], "messages": [
        from_log_message(Message.from_json(m)) for m in messages]})
    return thread["revision"], state.to_dict(), thread["metadata"]


def as_loaded(stored: StoredRunState) -> tuple[int, dict, dict]:
    return stored.revision, stored.state.to_dict(), stored.metadata


async def test_aisuite_file_state_store(database_url: str, client: httpx.AsyncClient,
                                        tmp_path: Path, uid: str) -> None:
    root = tmp_path / "state"
    store = FileStateStore(root)
    first, second, bad = f"chat-{uid}", f"other:{uid}", f"has space {uid}"
    store.save_state(first, run_state(TURN_1), metadata={"user": "ana"})
    store.save_state(first, run_state(TURN_1 + TURN_2, status="completed"), revision=1)
    store.save_state(second, run_state([]))
    store.save_state(bad, run_state(TURN_1[:1]))
    (root / f".{first}.json.tmp_0.tmp").write_text("{")  # an interrupted save's leftover

    code, _, err = await cli(database_url, "import", "--format", "aisuite-files", str(root))
    assert code == 1, err
    assert "threads: 2 created, 1 refused" in err, err
    assert "has%20space" in err and "thread.thread_id: 'has space" in err, err
    for thread_id in (first, second):
        assert await loaded(client, thread_id) == as_loaded(store.load_state(thread_id))
    thread = (await client.get(f"/v1/threads/{first}")).json()
    assert thread["revision"] == 2 and thread["message_count"] == 6

    code, _, err = await cli(database_url, "import", "--format", "aisuite-files", str(root))
    assert "threads: 2 unchanged, 1 refused" in err and "0 rows written" in err, err


@pytest.fixture
def aisuite_postgres() -> Any:
    url = create_postgres_database()
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    store = PostgresStateStore.from_dsn(dsn, create_schema=True)
    yield store, dsn
    store.connection.close()
    drop_postgres_database(url)


async def test_aisuite_postgres_state_store(database_url: str, client: httpx.AsyncClient,
                                            aisuite_postgres: Any, uid: str) -> None:
    store, dsn = aisuite_postgres
    chat, edited = f"chat-{uid}", f"edited-{uid}"

    def write() -> None:
        store.save_state(chat, run_state(TURN_1), metadata={"user": "ana"})  # 1
        state = store.load_state(chat).state
        store.save_state(chat, run_state(state.messages + TURN_2), revision=1)  # 2
        ids = store.get_thread_head(chat)["model_context_message_ids"]
        store.compact_state(chat, ids[1:3], {"role": "system", "content": "asked AAPL"},
                            revision=2, reason="length", model="m", input_token_count=10,
                            output_token_count=3, metadata={"by": "test"})  # 3
        state = store.load_state(chat).state
        store.save_state(chat, run_state(state.messages + [
            {"role": "assistant", "content": "410.2"}]), revision=3)  # 4
        ids = store.get_thread_head(chat)["model_context_message_ids"]
        store.compact_state(chat, ids[1:4], {"role": "system", "content": "nested"})  # 5
        store.save_state(edited, run_state(TURN_1))
        store.save_state(edited, run_state([TURN_1[0], {"role": "user", "content": "no"}]))

    await anyio.to_thread.run_sync(write)
    code, _, err = await cli(database_url, "import", "--format", "aisuite-postgres", dsn)
    assert "threads: 2 created" in err, err
    assert code == 1 and f"not imported: thread {edited}: 3 messages that a later save " \
        "replaced" in err, err
    for thread_id in (chat, edited):
        assert await loaded(client, thread_id) == as_loaded(store.load_state(thread_id))

    head = store.get_thread_head(chat)
    full = await read_all(client, f"/v1/threads/{chat}/messages", view="full")
    by_id = {m["id"]: m for m in full}
    records = store.list_compactions(chat)
    compactions = await read_all(client, f"/v1/threads/{chat}/compactions")
    assert [c["id"] for c in compactions] == [r.compaction_id for r in records]
    for record, compaction in zip(records, compactions, strict=True):
        assert compaction["source_message_ids"] == record.source_message_ids
        assert compaction["summary_message_id"] == record.summary_message_id
        assert compaction["summary_text"] == record.summary_text
        for source in record.source_message_ids:
            assert by_id[source]["status"] == "compacted"
            assert by_id[source]["compaction_id"] == record.compaction_id
        summary = by_id[record.summary_message_id]
        if summary["status"] == "live":  # else it shows the compaction that replaced it
            assert summary["compaction_id"] == record.compaction_id
    assert by_id[records[0].summary_message_id]["compaction_id"] == records[1].compaction_id
    assert compactions[0]["reason"] == "length" and compactions[0]["metadata"] == {"by": "test"}
    assert sorted(m["seq"] for m in full) == list(range(1, len(full) + 1))
    assert {m["id"] for m in full} == set(head["full_history_message_ids"]) | {
        r.summary_message_id for r in records}
    code, _, err = await cli(database_url, "import", "--format", "aisuite-postgres", dsn)
    assert "threads: 2 unchanged" in err and "0 rows written" in err, err


# The Colosseum design's models, as the seed writes them ("Schema Design"), with the
# composite index it recommends. `metadata` is reserved on declarative classes, so the
# conversation's column is mapped under another attribute name, same column name.
Seed = declarative_base()


class AgentState(Seed):  # type: ignore[misc, valid-type]
    __tablename__ = "agent_states"
    __table_args__ = (Index("ix_agent_session", "agent_name", "session_id"),)
    id = Column(Integer, primary_key=True)
    agent_name = Column(String(255), nullable=False, index=True)
    session_id = Column(String(255), nullable=False, index=True)
    state_data = Column(JSON, nullable=False, default=dict)
    created_at = Column(DateTime, default=datetime.utcnow, nullable=False)
    updated_at = Column(DateTime, default=datetime.utcnow, onupdate=datetime.utcnow)


class ConversationHistory(Seed):  # type: ignore[misc, valid-type]
    __tablename__ = "conversation_history"
    id = Column(Integer, primary_key=True)
    session_id = Column(String(255), nullable=False, index=True)
    agent_name = Column(String(255), nullable=False)
    role = Column(String(50), nullable=False)
    content = Column(Text, nullable=False)
    metadata_ = Column("metadata", JSON, nullable=True, default=dict)
    timestamp = Column(DateTime, default=datetime.utcnow, nullable=False, index=True)


class MCPServerState(Seed):  # type: ignore[misc, valid-type]
    __tablename__ = "mcp_server_states"
    id = Column(Integer, primary_key=True)
    server_name = Column(String(255), nullable=False, unique=True, index=True)
    server_type = Column(String(100), nullable=False)
    state_data = Column(JSON, nullable=False, default=dict)
    last_connected = Column(DateTime, nullable=True)


async def test_colosseum_sqlite(database_url: str, client: httpx.AsyncClient, tmp_path: Path,
                                uid: str) -> None:
    path = tmp_path / "colosseum.db"
    engine = create_engine(f"sqlite:///{path}")
    Seed.metadata.create_all(engine)  # the design's own DDL
    session_id, only_states = f"session_{uid}", f"quiet_{uid}"
    t0 = datetime(2025, 11, 20, 9, 0, 0)
    with Session(engine) as db:
        db.add_all([
            # Saved out of order, two at the same instant: timestamp order, ties as saved.
            ConversationHistory(session_id=session_id, agent_name="risk_manager",
                                role="assistant", content="Position size <= 5%",
                                metadata_={"risk_score": 0.3}, timestamp=t0 + timedelta(1)),
            ConversationHistory(session_id=session_id, agent_name="technical_analyst",
                                role="assistant", content="AAPL bullish divergence",
                                metadata_={"indicators": ["RSI"]}, timestamp=t0),
            ConversationHistory(session_id=session_id, agent_name="supervisor", role="user",
                                content="Analyse AAPL", metadata_=None, timestamp=t0),
            # The public helpers insert a new row per save: the latest one wins.
            AgentState(agent_name="supervisor", session_id=session_id,
                       state_data={"current_analysis": None}, created_at=t0, updated_at=t0),
            AgentState(agent_name="supervisor", session_id=session_id,
                       state_data={"current_analysis": "AAPL"}, created_at=t0,
                       updated_at=t0 + timedelta(hours=2)),
            AgentState(agent_name="risk_manager", session_id=only_states,
                       state_data={"risk_budget": 1.0}, created_at=t0),
            MCPServerState(server_name=f"ib_{uid}", server_type="broker",
                           state_data={"account_id": "DU123456"},
                           last_connected=t0 + timedelta(hours=1)),
        ])
        db.commit()
    engine.dispose()
    with sqlite3.connect(path) as check:  # what the design wrote: naive UTC text
        assert check.execute("SELECT timestamp FROM conversation_history LIMIT 1").fetchone()

    code, _, err = await cli(database_url, "import", "--format", "colosseum", str(path))
    assert code == 0, err
    assert "threads: 2 created" in err and "mcp_servers: 1 created" in err, err
    messages = await read_all(client, f"/v1/threads/{session_id}/messages")
    assert [(m["agent_name"], m["role"], m["content"], m["metadata"], m["created_at"])
            for m in messages] == [
        ("technical_analyst", "assistant", "AAPL bullish divergence", {"indicators": ["RSI"]},
         "2025-11-20T09:00:00.000000Z"),
        ("supervisor", "user", "Analyse AAPL", {}, "2025-11-20T09:00:00.000000Z"),
        ("risk_manager", "assistant", "Position size <= 5%", {"risk_score": 0.3},
         "2025-11-21T09:00:00.000000Z")]
    assert [m["seq"] for m in messages] == [1, 2, 3]
    state = (await client.get(f"/v1/threads/{session_id}/agents/supervisor/state")).json()
    assert state["state"] == {"current_analysis": "AAPL"} and state["revision"] == 1
    assert state["updated_at"] == "2025-11-20T11:00:00.000000Z"
    quiet = (await client.get(f"/v1/threads/{only_states}/agents/risk_manager/state")).json()
    assert quiet["state"] == {"risk_budget": 1.0}
    server = (await client.get(f"/v1/mcp-servers/ib_{uid}")).json()
    assert server["state"] == {"account_id": "DU123456"} and server["server_type"] == "broker"
    assert server["last_connected_at"] == "2025-11-20T10:00:00.000000Z"

    code, _, err = await cli(database_url, "import", "--format", "colosseum", str(path))
    assert code == 0 and "threads: 2 unchanged" in err and "0 rows written" in err, err
