"""The client's message and compaction methods, against real servers."""

from __future__ import annotations

import json

import pytest
from agentstate_client import AgentStateClient, AppendResult, AsyncAgentStateClient, Message
from agentstate_client.errors import (
    CompactionNotContiguous,
    IdempotencyKeyReused,
    MessageExists,
    NotFound,
    RevisionMismatch,
)

from tests.support import ServerProcess

pytestmark = pytest.mark.slow  # every test here talks to the `server` process


def test_append_list_get(client: AgentStateClient, uid: str) -> None:
    thread_id = f"m-{uid}"
    first = client.append_message(thread_id, "user", "Hello", agent_name="planner",
                                  metadata={"lang": "en"}, id=f"hello-{uid}")
    assert isinstance(first, Message)
    assert (first.id, first.seq, first.role, first.content, first.agent_name, first.metadata,
            first.status) == (f"hello-{uid}", 1, "user", "Hello", "planner", {"lang": "en"}, "live")
    thread = client.get_thread(thread_id)
    assert thread.revision == 2, "the append created the thread (1) then appended (2)"

    batch = client.append_messages(thread_id, [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "42", "tool_call_id": "call_1"},
    ], if_match=thread.revision)
    assert isinstance(batch, AppendResult) and batch.thread_revision == 3
    assert [m.seq for m in batch.data] == [2, 3]
    assert batch.data[0].tool_calls[0]["id"] == "call_1"
    assert batch.data[1].tool_call_id == "call_1"

    with pytest.raises(RevisionMismatch) as stale:
        client.append_message(thread_id, "user", "late", if_match=thread.revision)
    assert stale.value.current_revision == 3
    with pytest.raises(MessageExists):
        client.append_message(thread_id, "user", "again", id=f"hello-{uid}")

    page = client.list_messages(thread_id, limit=2)
    assert [m.seq for m in page.data] == [1, 2] and page.has_more
    assert [m.seq for m in client.iter_messages(thread_id, limit=2)] == [1, 2, 3]
    assert [m.seq for m in client.list_messages(thread_id, order="desc").data] == [3, 2, 1]
    assert [m.seq for m in client.list_messages(thread_id, after_seq=1, before_seq=3).data] == [2]
    assert [m.seq for m in client.list_messages(thread_id, role="tool").data] == [3]
    assert [m.seq for m in client.list_messages(thread_id, agent_name="planner").data] == [1]
    assert client.get_message(thread_id, first.id) == first
    raw = json.loads(client.list_messages_json(thread_id, order="desc", limit=2,
                                               fields=["id", "tool_call_id"]))
    assert raw["data"] == [{"id": batch.data[1].id, "tool_call_id": "call_1"},
                           {"id": batch.data[0].id}] and raw["has_more"]

    with_messages = client.get_thread(thread_id, include_messages=True, messages_limit=2)
    assert [m.seq for m in with_messages.messages] == [1, 2]
    rest = client.list_messages(thread_id, cursor=with_messages.messages_next_cursor)
    assert [m.seq for m in rest.data] == [3]
    listed = client.list_threads(thread_ids=[thread_id], include_messages=True,
                                 messages_limit=2)
    assert listed.data == [with_messages]
    with pytest.raises(NotFound):
        client.get_message(thread_id, "msg_missing")


def test_idempotency_key_replays_the_original(client: AgentStateClient, uid: str) -> None:
    thread_id = f"idem-{uid}"
    once = client.append_message(thread_id, "user", "pay", idempotency_key=f"k-{uid}")
    again = client.append_message(thread_id, "user", "pay", idempotency_key=f"k-{uid}")
    assert again == once
    assert client.get_thread(thread_id).message_count == 1
    with pytest.raises(IdempotencyKeyReused):
        client.append_message(thread_id, "user", "different", idempotency_key=f"k-{uid}")


def test_compactions(client: AgentStateClient, uid: str) -> None:
    thread_id = f"c-{uid}"
    stored = client.append_messages(thread_id, [
        {"role": "user", "content": f"m{i}"} for i in range(4)]).data
    compaction = client.create_compaction(
        thread_id, [stored[0].id, stored[1].id], {"role": "assistant", "content": "summary"},
        reason="too long", model="tiny", input_token_count=10, output_token_count=2,
        metadata={"by": "test"})
    assert compaction.source_message_ids == [stored[0].id, stored[1].id]
    assert compaction.summary_text == "summary" and compaction.thread_revision is not None
    assert [m.content for m in client.iter_messages(thread_id)] == ["summary", "m2", "m3"]
    assert len(list(client.iter_messages(thread_id, view="full"))) == 5

    detail = client.get_compaction(thread_id, compaction.id)
    assert [m.id for m in detail.source_messages] == [stored[0].id, stored[1].id]
    assert all(m.status == "compacted" for m in detail.source_messages)
    assert [c.id for c in client.list_compactions(thread_id).data] == [compaction.id]
    assert [c.id for c in client.iter_compactions(thread_id)] == [compaction.id]

    with pytest.raises(CompactionNotContiguous):
        client.create_compaction(thread_id, [stored[2].id, stored[3].id, stored[2].id],
                                 {"role": "assistant", "content": "x"})

    client.revert_compaction(thread_id, compaction.id, if_match="*")
    assert [m.content for m in client.iter_messages(thread_id)] == ["m0", "m1", "m2", "m3"]
    assert client.list_compactions(thread_id).data == []


@pytest.mark.anyio
async def test_async_messages(server: ServerProcess, uid: str) -> None:
    async with AsyncAgentStateClient(server.base_url) as client:
        result = await client.append_messages(f"am-{uid}", [{"role": "user", "content": "a"},
                                                            {"role": "user", "content": "b"}])
        assert [m.seq for m in result.data] == [1, 2]
        assert [m.content async for m in client.iter_messages(f"am-{uid}", limit=1)] == ["a", "b"]
        assert (await client.get_message(f"am-{uid}", result.data[1].id)).content == "b"
