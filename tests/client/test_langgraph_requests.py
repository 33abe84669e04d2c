"""What a LangGraph turn costs in requests over `AgentStateSaver`, and what the group commit
(several saver calls stored by one request) keeps: each call returns once its own write is
stored, and one call's refusal stays its own. In-process (httpx over ASGI to the app on each
backend), so not `slow`."""

from __future__ import annotations

import asyncio
import base64
import json
import operator
import re
from typing import Annotated, Any, TypedDict

import httpx
import pytest
from agentstate_client import AsyncAgentStateClient
from agentstate_client.errors import CheckpointExists
from agentstate_client.langgraph import AgentStateSaver
from fastapi import FastAPI
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.message import _messages_delta_reducer

from tests.client.conftest import Counting

pytestmark = pytest.mark.anyio


class DeltaState(TypedDict):
    messages: Annotated[list[Any], DeltaChannel(_messages_delta_reducer, snapshot_frequency=4)]
    turns: Annotated[int, operator.add]


def chat(checkpointer: Any, delta: bool) -> Any:
    def model(state: Any) -> dict[str, Any]:
        answer = {"messages": [AIMessage(content=f"answer {len(state['messages'])}")]}
        return {**answer, "turns": 1} if delta else answer

    graph = StateGraph(DeltaState if delta else MessagesState)  # type: ignore[type-var]
    graph.add_node("model", model)
    graph.add_edge(START, "model")
    return graph.compile(checkpointer=checkpointer)


@pytest.mark.parametrize("delta", [False, True], ids=["MessagesState", "DeltaChannel"])
async def test_requests_per_turn_are_few_and_flat(saver: AgentStateSaver, transport: Counting,
                                                  uid: str, delta: bool) -> None:
    """A one-node chat: the turn's read, then its three checkpoints with the two tasks'
    pending writes, as four requests (six saver calls), the same at turn 1 and turn 24, with
    DeltaChannel too: the first turn that needs the channel's history reads it with one
    request of its own (whatever the distance to its last snapshot); after that, the turn's
    read of the newest checkpoint brings the history along. The answers equal
    InMemorySaver's."""
    ours, reference = chat(saver, delta), chat(InMemorySaver(), delta)
    config = {"configurable": {"thread_id": f"turns-{uid}"}}
    per_turn = []
    for turn in range(1, 25):
        transport.seen.clear()
        got = await ours.ainvoke({"messages": [HumanMessage(f"question {turn}")]}, config)
        per_turn.append([" ".join((seen.split()[0], seen.rsplit("/", 1)[-1]))
                         for seen in transport.seen])
        expected = await reference.ainvoke({"messages": [HumanMessage(f"question {turn}")]},
                                           config)
        assert [(m.type, m.content) for m in got["messages"]] == [
            (m.type, m.content) for m in expected["messages"]]
    alone = [turn for turn, requests in enumerate(per_turn, 1)
             if "GET delta-history" in requests]
    assert alone == ([2] if delta else []), per_turn  # turn 1 has no checkpoint to read
    for requests in per_turn[1:]:
        assert requests[0] == "GET latest", requests
        history = requests[1] == "GET delta-history"
        assert set(requests[1 + history:]) == {"POST batch"}, requests
        assert len(requests) <= 1 + history + (4 if delta else 3), requests
    with_latest = [query for query in transport.queries if "delta_channel" in query]
    assert len(with_latest) == (22 if delta else 0), transport.queries
    # Between two snapshots the seed is the one the saver read last: named by its digest,
    # it is not sent again (the answers above are still InMemorySaver's).
    elided = [json.loads(answer)["delta_history"]["messages"]
              for query, answer in zip(transport.queries, transport.answers, strict=True)
              if "known_seed" in query]
    assert len(elided) >= (10 if delta else 0), transport.queries
    assert all(history["seed_digest"] in query
               for history, query in zip(elided, (q for q in transport.queries
                                                  if "known_seed" in q), strict=True)
               if history["seed"] is None and history["seed_digest"] is not None)
    assert any(history["seed"] is None and history["seed_digest"] for history in elided) \
        == delta
    state = await ours.aget_state(config)
    assert len(state.values["messages"]) == 48


@pytest.mark.parametrize("delta", [False, True], ids=["MessagesState", "DeltaChannel"])
async def test_a_saver_resuming_a_thread_reads_it_in_one_request_and_sends_what_is_new(
        saver: AgentStateSaver, transport: Counting, uid: str, delta: bool) -> None:
    """A saver that has not seen the thread (a new process) reads its checkpoint with the
    items in one request (with DeltaChannel, the channel's history in a second, its seed's
    items inline too); its next turn is the usual read and batches, and its checkpoints send
    the new messages only (the list as what it gained since the one read), not the whole
    conversation again. The answers equal InMemorySaver's."""
    config = {"configurable": {"thread_id": f"resume-{uid}"}}
    first, reference = chat(saver, delta), chat(InMemorySaver(), delta)
    for turn in range(5):  # ten updates: DeltaChannel's last snapshot (every fourth) is two back
        for made in (first, reference):
            await made.ainvoke({"messages": [HumanMessage(f"earlier question {turn}")]}, config)
    resumed = AgentStateSaver(base_url="http://unused.invalid", async_client=saver._aclient())
    transport.seen.clear()
    state = await chat(resumed, delta).aget_state(config)
    assert [seen.rsplit("/", 1)[-1] for seen in transport.seen] == (
        ["latest", "delta-history"] if delta else ["latest"]), transport.seen
    assert len(state.values["messages"]) == 10
    transport.seen.clear()
    transport.bodies.clear()
    got = await chat(resumed, delta).ainvoke(
        {"messages": [HumanMessage("the question after a restart")]}, config)
    expected = await reference.ainvoke(
        {"messages": [HumanMessage("the question after a restart")]}, config)
    assert [(m.type, m.content) for m in got["messages"]] == [
        (m.type, m.content) for m in expected["messages"]]
    # The turn's read, then its writes by group commit: how many requests they share
    # depends on timing (under load DeltaChannel's take four), as in the test above.
    assert transport.seen[0].endswith("/latest"), transport.seen
    assert {seen.rsplit("/", 1)[-1] for seen in transport.seen[1:]} == {"batch"}, transport.seen
    assert len(transport.seen) <= 1 + (4 if delta else 3), transport.seen
    if delta:  # this turn's checkpoints store a snapshot: the whole list, once
        return
    sent = b"".join(transport.bodies)
    assert sent.count(b'"base_version"') >= 2, sent[:500]
    assert b"earlier question" not in b"".join(
        base64.b64decode(data) for data in re.findall(rb'"data":"([A-Za-z0-9+/=]*)"', sent))


class DroppingSeeds(Counting):
    """Drops the saver's held seeds while a request that names one is in flight, as another
    call evicting them would."""

    saver: AgentStateSaver

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if b"known_seed" in request.url.query:
            self.saver._seeds.clear()
        return await super().handle_async_request(request)


async def test_a_seed_named_by_digest_but_no_longer_held_is_read_again(app: FastAPI,
                                                                      uid: str) -> None:
    """The server names a seed by its digest only because the saver said it held it; if the
    saver dropped it meanwhile, it asks for that history again with the seed in full, and
    answers what it answered the first time (and InMemorySaver's walk)."""
    transport = DroppingSeeds(app)
    async with AsyncAgentStateClient("http://agentstate.test", transport=transport) as api:
        saver = transport.saver = AgentStateSaver(base_url="http://unused.invalid",
                                                  async_client=api)
        reference = InMemorySaver()
        config = {"configurable": {"thread_id": f"dropped-{uid}"}}
        for made in (chat(saver, True), chat(reference, True)):
            for turn in range(5):
                await made.ainvoke({"messages": [HumanMessage(f"question {turn}")]}, config)
        newest = (await saver.aget_tuple(config)).config  # type: ignore[union-attr]
        first = await saver.aget_delta_channel_history(config=newest, channels=["messages"])
        assert first["messages"].get("seed"), first  # a snapshot lies behind it
        transport.seen.clear()
        transport.queries.clear()
        again = await saver.aget_delta_channel_history(config=newest, channels=["messages"])
        assert again == first
        assert [seen.rsplit("/", 1)[-1] for seen in transport.seen] == [
            "delta-history", "delta-history"], transport.seen
        assert "known_seed" in transport.queries[0] and "known_seed" not in transport.queries[1]
        theirs = (await reference.aget_tuple(config)).config  # type: ignore[union-attr]
        expected = await reference.aget_delta_channel_history(config=theirs,
                                                              channels=["messages"])
        assert [(m.type, m.content) for m in again["messages"]["seed"].value] == [
            (m.type, m.content) for m in expected["messages"]["seed"].value]
        saver.close()


async def test_each_call_returns_once_stored_and_refusals_stay_their_own(
        saver: AgentStateSaver, transport: Counting, uid: str) -> None:
    """Saver calls issued together go as one request; each returns after the commit (a
    fresh read sees it), and a checkpoint refused (other content under a stored id) fails
    its own call only: the writes sent beside it are stored."""
    config = {"configurable": {"thread_id": f"group-{uid}", "checkpoint_ns": ""}}
    first = empty_checkpoint()
    stored = await saver.aput(config, first, {"step": -1}, {})
    transport.seen.clear()
    changed = {**first, "ts": "another time"}
    calls = [saver.aput_writes(stored, [("a", n)], f"task-{n}") for n in range(3)]
    results = await asyncio.gather(saver.aput(config, changed, {"step": 9}, {}), *calls,
                                   return_exceptions=True)
    assert isinstance(results[0], CheckpointExists) and results[1:] == [None] * 3
    # One batch of all four, refused whole (409), then each alone.
    assert [seen.rsplit("/", 1)[-1] for seen in transport.seen] == ["batch"] * 5, transport.seen
    fresh = AgentStateSaver(base_url="http://unused.invalid", async_client=saver._aclient())
    found = await fresh.aget_tuple(stored)
    assert found is not None
    assert sorted(found.pending_writes or []) == [(f"task-{n}", "a", n) for n in range(3)]


async def test_lists_and_writes_of_every_kind_read_back_as_stored(
        saver: AgentStateSaver, uid: str) -> None:
    """Lists of messages (one of 300, across the server's chunks of 64 items), lists and
    pending writes that mix msgpack with values LangGraph's serializer types otherwise
    (None, bytes) read back as they were stored, by a fresh saver (items inline) and by
    the saver that wrote them (items by digest), as InMemorySaver has them."""
    config = {"configurable": {"thread_id": f"kinds-{uid}", "checkpoint_ns": ""}}
    messages = [HumanMessage(f"m{n}", id=f"id-{n}") for n in range(300)]
    mixed = [messages[0], None, b"raw", "text", 7, {"k": [1, 2]}]
    values = {"m15": messages[:15], "m16": messages[:16], "m17": messages[:17],
              "m300": messages, "mixed": mixed, "none": [None, None], "one": [messages[1]]}
    checkpoint = {**empty_checkpoint(), "channel_values": values,
                  "channel_versions": {channel: 1 for channel in values}}
    writes = [("a", messages[2]), ("b", None), ("c", b"raw"), ("d", mixed)]
    reference = InMemorySaver()
    for made in (saver, reference):
        stored = await made.aput(config, checkpoint, {"step": 0},
                                 checkpoint["channel_versions"])
        await made.aput_writes(stored, writes, "task")
    expected = await reference.aget_tuple(stored)
    assert expected is not None
    fresh = AgentStateSaver(base_url="http://unused.invalid", async_client=saver._aclient())
    for reader in (fresh, saver):
        found = await reader.aget_tuple(stored)
        assert found is not None
        assert found.checkpoint["channel_values"] == values
        assert found.checkpoint["channel_values"] == expected.checkpoint["channel_values"]
        assert found.pending_writes == expected.pending_writes == [
            ("task", channel, value) for channel, value in writes]


async def test_list_limits(saver: AgentStateSaver, uid: str) -> None:
    """`list(limit=)` yields at most that many, newest first, as InMemorySaver does; 0
    yields none."""
    graph, reference = chat(saver, False), chat(InMemorySaver(), False)
    config = {"configurable": {"thread_id": f"limits-{uid}"}}
    for made in (graph, reference):
        for turn in range(3):
            await made.ainvoke({"messages": [HumanMessage(f"q{turn}")]}, config)
    for limit in (0, 1, 4, None):
        ours = [t.metadata["step"] async for t in saver.alist(config, limit=limit)]
        theirs = [t.metadata["step"] async for t in reference.checkpointer.alist(
            config, limit=limit)]
        assert ours == theirs, limit
        assert len(ours) == (9 if limit is None else limit)
