"""The client's agent-state, MCP-server and event methods, against real servers."""

from __future__ import annotations

import pytest
from agentstate_client import (
    AgentState,
    AgentStateClient,
    AsyncAgentStateClient,
    Event,
    McpServer,
    NotFound,
    PreconditionRequired,
    RevisionMismatch,
)
from agentstate_client.errors import AlreadyExists

from tests.support import ServerProcess

pytestmark = pytest.mark.slow  # every test here talks to the `server` process


def test_agent_state_methods(client: AgentStateClient, uid: str) -> None:
    thread_id = f"as-{uid}"
    created = client.put_agent_state(thread_id, "planner", {"step": 1, "tools": ["search"]})
    assert isinstance(created, AgentState)
    assert (created.thread_id, created.agent_name, created.revision, created.state) == (
        thread_id, "planner", 1, {"step": 1, "tools": ["search"]})
    assert client.get_agent_state(thread_id, "planner") == created

    with pytest.raises(PreconditionRequired):
        client.put_agent_state(thread_id, "planner", {})
    with pytest.raises(AlreadyExists):
        client.put_agent_state(thread_id, "planner", {}, create_only=True)
    replaced = client.put_agent_state(thread_id, "planner", {"step": 2}, if_match=created.etag)
    assert replaced.revision == 2
    with pytest.raises(RevisionMismatch) as stale:
        client.patch_agent_state(thread_id, "planner", {"x": 1}, if_match=1)
    assert stale.value.current_revision == 2
    patched = client.patch_agent_state(thread_id, "planner", {"step": None, "done": True},
                                       if_match=2)
    assert patched.state == {"done": True}

    updated = client.update_agent_state(thread_id, "planner", lambda s: {**s, "n": 1})
    assert updated.state == {"done": True, "n": 1} and updated.revision == 4
    made = client.update_agent_state(thread_id, "critic", lambda s: {"seen": len(s)}, create=True)
    assert made.state == {"seen": 0} and made.revision == 1

    assert [a.agent_name for a in client.list_agent_states(thread_id).data] == ["critic", "planner"]
    assert [a.agent_name for a in client.iter_agent_states(thread_id, limit=1)] == [
        "critic", "planner"]
    found = client.query_agent_states(agent_name="planner", state_contains={"done": True},
                                      thread_id=thread_id)
    assert [(a.thread_id, a.agent_name) for a in found.data] == [(thread_id, "planner")]
    assert client.query_agent_states(thread_id=thread_id, state_contains={"done": False}).data == []

    client.delete_agent_state(thread_id, "critic", if_match="*")
    with pytest.raises(NotFound):
        client.get_agent_state(thread_id, "critic")


def test_events_feed(client: AgentStateClient, uid: str) -> None:
    thread_id = f"ev-{uid}"
    client.create_thread(thread_id)
    client.put_agent_state(thread_id, "a", {"x": 1})
    client.update_thread(thread_id, lambda s: {"y": 2})
    events = list(client.iter_events(thread_id=thread_id, limit=1))
    assert all(isinstance(e, Event) for e in events)
    assert [(e.type, e.revision) for e in events] == [
        ("thread.created", 1), ("agent_state.created", 1), ("thread.updated", 2)]
    assert events[0].resource == f"/v1/threads/{thread_id}" and events[0].actor == "anonymous"
    only = client.list_events(thread_id=thread_id, types=["thread.created", "thread.updated"])
    assert [e.type for e in only.data] == ["thread.created", "thread.updated"]
    after = client.list_events(thread_id=thread_id, after=events[0].seq)
    assert [e.seq for e in after.data] == [e.seq for e in events[1:]]

    feed = client.list_events(thread_id=thread_id)
    assert feed.next_cursor is not None and not feed.has_more
    client.delete_thread(thread_id, if_match="*")
    since = client.list_events(thread_id=thread_id, cursor=feed.next_cursor)
    assert [e.type for e in since.data] == ["thread.deleted"]


def test_mcp_server_methods(client: AgentStateClient, uid: str) -> None:
    name = f"ib-{uid}"
    created = client.put_mcp_server(name, "broker", state={"account": "DU1"},
                                    secrets={"token": "s3cret"},
                                    last_connected_at="2026-11-29T09:00:00Z")
    assert isinstance(created, McpServer)
    assert (created.revision, created.server_type, created.secrets) == (1, "broker",
                                                                      {"token": "***"})
    assert created.last_connected_at is not None
    assert client.get_mcp_server(name).secrets == {"token": "***"}
    assert client.get_mcp_server(name, include_secrets=True).secrets == {"token": "s3cret"}
    patched = client.patch_mcp_server(name, state={"cached": [1]}, if_match=created.revision)
    assert patched.state == {"account": "DU1", "cached": [1]} and patched.revision == 2
    with pytest.raises(RevisionMismatch):
        client.put_mcp_server(name, "broker", if_match=1)
    client.put_mcp_server(f"news-{uid}", "news")
    assert [s.server_name for s in client.iter_mcp_servers(server_type="broker", limit=1)
            if s.server_name == name] == [name]
    assert name not in [s.server_name for s in client.list_mcp_servers(server_type="news").data]
    client.delete_mcp_server(name, if_match="*")
    with pytest.raises(NotFound):
        client.get_mcp_server(name)


@pytest.mark.anyio
async def test_async_agent_states(server: ServerProcess, uid: str) -> None:
    async with AsyncAgentStateClient(server.base_url) as client:
        await client.put_agent_state(f"aas-{uid}", "a", {"n": 0})
        result = await client.update_agent_state(f"aas-{uid}", "a", lambda s: {"n": s["n"] + 1})
        assert result.state == {"n": 1}
        assert [s.agent_name async for s in client.iter_agent_states(f"aas-{uid}")] == ["a"]


@pytest.mark.anyio
async def test_async_mcp_servers_and_events(server: ServerProcess, uid: str) -> None:
    async with AsyncAgentStateClient(server.base_url) as client:
        created = await client.put_mcp_server(f"news-{uid}", "news", state={"feed": "rss"},
                                              create_only=True)
        patched = await client.patch_mcp_server(f"news-{uid}", secrets={"key": "k"},
                                                if_match=created.etag)
        assert patched.secrets == {"key": "***"} and patched.revision == 2
        names = [s.server_name async for s in client.iter_mcp_servers(server_type="news")]
        assert f"news-{uid}" in names
        await client.delete_mcp_server(f"news-{uid}", if_match=2)
        types = [e.type async for e in client.iter_events(types=["mcp_server.created",
                                                                 "mcp_server.deleted"])
                 if e.resource == f"/v1/mcp-servers/news-{uid}"]
        assert types == ["mcp_server.created", "mcp_server.deleted"]
