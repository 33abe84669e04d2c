"""The Colosseum drop-in: the seed's helper functions, used the way the seed uses them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

import pytest
from agentstate_client import AgentStateClient, colosseum
from agentstate_client.colosseum import (
    load_agent_state,
    load_conversation_history,
    save_agent_state,
    save_conversation,
)

from tests.support import ServerProcess

pytestmark = pytest.mark.slow  # every test here talks to the `server` process


@pytest.fixture
def configured(server: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Configured from the environment, as an agent process would be."""
    monkeypatch.setenv("AGENTSTATE_URL", server.base_url)
    monkeypatch.setattr(colosseum, "_client", None)
    yield
    if colosseum._client is not None:
        colosseum._client.close()


def test_conversation_round_trip_in_seed_shape(configured: None) -> None:
    session_id = str(uuid.uuid4())
    assert load_conversation_history(session_id) == []
    save_conversation(
        session_id=session_id,
        agent_name="technical_analyst", role="assistant",
        content="AAPL showing bullish divergence on RSI...",
        metadata={"indicators": ["RSI", "MACD"], "timeframe": "1h"},
    )
    save_conversation(session_id, "risk_manager", "assistant",
                      "Position size should not exceed 5% of portfolio...",
                      metadata={"risk_score": 0.3, "max_position": 500})
    save_conversation(session_id, "supervisor", "user", "Proceed?")

    history = load_conversation_history(session_id)
    assert [set(m) for m in history] == [{"agent_name", "role", "content", "metadata",
                                          "timestamp"}] * 3
    assert [(m["agent_name"], m["role"], m["content"][:8]) for m in history] == [
        ("technical_analyst", "assistant", "AAPL sho"), ("risk_manager", "assistant", "Position"),
        ("supervisor", "user", "Proceed?")]
    assert history[0]["metadata"] == {"indicators": ["RSI", "MACD"], "timeframe": "1h"}
    assert history[2]["metadata"] == {}, "metadata=None is stored as {}"
    assert all(isinstance(datetime.fromisoformat(m["timestamp"]), datetime) for m in history)
    assert load_conversation_history(session_id, limit=2) == history[:2]
    assert load_conversation_history(session_id, limit=None) == history


def test_history_keeps_append_order_across_pages(configured: None,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(colosseum, "PAGE", 3)
    session_id = str(uuid.uuid4())
    for i in range(7):
        save_conversation(session_id, "agent", "assistant", f"Message {i}")
    contents = [m["content"] for m in load_conversation_history(session_id)]
    assert contents == [f"Message {i}" for i in range(7)]
    assert [m["content"] for m in load_conversation_history(session_id, limit=5)] == contents[:5]


def test_agent_state_upserts_one_record(configured: None, server: ServerProcess) -> None:
    session_id = str(uuid.uuid4())
    assert load_agent_state("supervisor", session_id) is None
    state = {"tasks_completed": [], "current_analysis": None, "risk_budget": 1.0}
    save_agent_state("supervisor", session_id, state)
    assert load_agent_state("supervisor", session_id) == state
    state["current_analysis"] = "AAPL"
    save_agent_state("supervisor", session_id, state)
    save_agent_state("technical", session_id, {"rsi": 31})
    assert load_agent_state("supervisor", session_id) == state
    assert load_agent_state("technical", session_id) == {"rsi": 31}
    assert load_agent_state("risk_manager", session_id) is None

    with AgentStateClient(server.base_url) as client:
        records = client.list_agent_states(session_id).data
        assert [(r.agent_name, r.revision) for r in records] == [("supervisor", 2),
                                                                 ("technical", 1)]


def test_configure_explicitly(server: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTSTATE_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setattr(colosseum, "_client", None)
    own = AgentStateClient(server.base_url)
    try:
        assert colosseum.configure(client=own) is own
        session_id = str(uuid.uuid4())
        save_conversation(session_id, "a", "user", "hi")
        assert [m["content"] for m in load_conversation_history(session_id)] == ["hi"]
        replaced = colosseum.configure(server.base_url)
        assert replaced is not own and load_conversation_history(session_id)[0]["content"] == "hi"
        own.get_thread(session_id)  # configure() never closes a client it was given
        replaced.close()
    finally:
        own.close()


def test_many_agents_at_once(configured: None, server: ServerProcess) -> None:
    """16 agents (threads of this process) save the same new state and their messages at once:
    every save lands, one record per agent, every message once, in a gap-free order."""
    session_id = str(uuid.uuid4())

    def agent(i: int) -> None:
        save_agent_state("shared", session_id, {"writer": i})
        save_conversation(session_id, f"agent-{i}", "assistant", f"note {i}")
        save_agent_state(f"agent-{i}", session_id, {"done": True})

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(agent, range(16)))

    assert load_agent_state("shared", session_id)["writer"] in range(16)
    history = load_conversation_history(session_id)
    assert sorted(m["content"] for m in history) == sorted(f"note {i}" for i in range(16))
    with AgentStateClient(server.base_url) as client:
        assert [m.seq for m in client.iter_messages(session_id)] == list(range(1, 17))
        states = list(client.iter_agent_states(session_id))
        assert len(states) == 17 and len({s.agent_name for s in states}) == 17
