"""pydantic-ai's `ConversationStore` on agentstate: differential against pydantic-ai's own
`InMemoryConversationStore` over seeded random sequences, under a real `Agent` run (a
`TestModel`, no network), concurrent saves, and deletes that forks reach.

In-process (httpx over ASGI to the app on each backend), so not `slow`.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import random
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from agentstate_client import AsyncAgentStateClient
from agentstate_client.errors import NotFound
from agentstate_client.pydantic_ai import AgentStateConversationStore
from fastapi import FastAPI
from pydantic_ai import Agent
from pydantic_ai.conversation import Conversation
from pydantic_ai.conversation_store import (
    ConversationConflict,
    ConversationEntry,
    ConversationRecord,
    ConversationStore,
    InMemoryConversationStore,
)
from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.test import TestModel
from pydantic_ai.usage import RunUsage

pytestmark = pytest.mark.anyio

AT = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def turn(n: int, tool: bool) -> list[ModelMessage]:
    """One turn: a prompt and an answer, with a tool call and its result when `tool`."""
    messages: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart(content=f"question {n}", timestamp=AT)])]
    if tool:
        messages += [
            ModelResponse(parts=[ToolCallPart(tool_name="lookup", args={"q": n},
                                              tool_call_id=f"call-{n}")], timestamp=AT),
            ModelRequest(parts=[ToolReturnPart(tool_name="lookup", content={"price": n * 1.5},
                                               tool_call_id=f"call-{n}", timestamp=AT)])]
    messages.append(ModelResponse(parts=[TextPart(content=f"answer {n}")], timestamp=AT))
    return messages


class Labels:
    """Entry ids are minted per store; both stores mint them in the same order, so the k-th
    id a store mints is labelled k and answers compare by label."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def minted(self, entries: list[ConversationEntry]) -> None:
        for entry in entries:
            self.ids.setdefault(entry.id, len(self.ids))

    def __call__(self, entry_id: str | None) -> Any:
        return None if entry_id is None else self.ids.get(entry_id, f"unknown:{entry_id}")


def record_view(record: ConversationRecord, label: Labels) -> tuple[Any, ...]:
    return (record.conversation_id, label(record.head_id), record.usage, record.scope,
            record.forked_from, label(record.forked_at), [label(b) for b in record.branches],
            record.deferred_tool_requests, record.format_version)


def entries_view(entries: list[ConversationEntry] | None, label: Labels) -> Any:
    if entries is None:
        return None
    return [(label(e.id), label(e.parent_id), e.kind, e.message) for e in entries]


class Side:
    """One store under test and what its caller holds: conversations loaded earlier."""

    def __init__(self, store: ConversationStore) -> None:
        self.store = store
        self.label = Labels()
        self.held: dict[str, Conversation] = {}


async def outcome(action: Callable[[], Awaitable[Any]]) -> tuple[str, Any]:
    try:
        return "ok", await action()
    except ConversationConflict:
        return "conflict", None
    except UserError as exc:
        return "user_error", type(exc).__name__


async def step(side: Side, rng: random.Random, n: int) -> Any:
    """One random operation (rng drawn identically for both sides); its comparable answer."""
    store, label = side.store, side.label
    # c0-c3 are started by saves, c4-c6 by forks too; any of them is saved, forked, deleted.
    cid = f"c{rng.randrange(7)}"
    scope = rng.choice([None, None, "alice", "bob"])
    op = rng.choice(["save", "save", "save", "save_held", "rewrite", "load", "load_entries",
                     "branch", "branch_entry", "fork", "fork", "delete", "list"])
    if op == "save":  # load (or start), continue with a turn, save
        tool = rng.random() < 0.5
        usage = RunUsage(requests=rng.randrange(1, 9), input_tokens=rng.randrange(100))

        async def save() -> Any:
            conversation = await store.load(cid, scope=scope) or Conversation(
                conversation_id=cid)
            conversation.messages = [*conversation.messages, *turn(n, tool)]
            conversation.usage = usage
            entries = await store.save(conversation, scope=scope)
            label.minted(entries)
            side.held[cid] = conversation
            return entries_view(entries, label)
        return op, await outcome(save)
    if op == "save_held":  # a conversation loaded earlier, maybe overtaken since
        held = side.held.get(cid)
        if held is None:
            return op, None

        async def save_held() -> Any:
            held.messages = [*held.messages, *turn(n, False)]
            entries = await store.save(held)
            label.minted(entries)
            return entries_view(entries, label)
        return op, await outcome(save_held)
    if op == "rewrite":  # the stored history rewritten from a point: a branch is left
        keep = rng.randrange(4)

        async def rewrite() -> Any:
            loaded = await store.load(cid)
            if loaded is None:
                return None
            rewritten = Conversation(conversation_id=cid, revision=loaded.revision,
                                     messages=[*loaded.messages[:keep], *turn(n, False)],
                                     usage=loaded.usage)
            entries = await store.save(rewritten)
            label.minted(entries)
            return entries_view(entries, label)
        return op, await outcome(rewrite)
    if op == "load":
        limit = rng.choice([None, 0, 1, 3])

        async def load() -> Any:
            loaded = await store.load(cid, limit=limit, scope=scope)
            if loaded is None:
                return None
            return (loaded.messages, loaded.usage, loaded.conversation_id,
                    loaded.deferred_tool_requests)
        return op, await outcome(load)
    if op == "load_entries":
        limit = rng.choice([None, 2])

        async def load_entries() -> Any:
            return entries_view(await store.load_entries(cid, limit=limit, scope=scope), label)
        return op, await outcome(load_entries)
    if op in ("branch", "branch_entry"):
        pick = rng.randrange(6)

        async def branch() -> Any:
            loaded = await store.load_entries(cid)
            record = await store.read_record(cid)
            revision = record.revision if record is not None else None
            if op == "branch":
                conversation = await store.branch(cid, at=pick, expected_revision=revision)
            else:  # an entry of its history or of a branch it left, picked by label
                tips = [e.id for e in loaded or []] + (record.branches if record else [])
                if not tips:
                    return None
                conversation = await store.branch(cid, from_entry=tips[pick % len(tips)],
                                                  expected_revision=revision)
            return conversation.messages, conversation.usage
        return op, await outcome(branch)
    if op == "fork":
        at = rng.choice([None, 0, 1, 2, 5])
        new_id = f"c{4 + rng.randrange(6)}"  # c7-c9 only ever forks: they pin what they reach

        async def fork() -> Any:
            forked = await store.fork(cid, at=at, new_conversation_id=new_id, scope=scope)
            side.held[new_id] = forked
            return forked.messages, forked.usage, forked.conversation_id
        return op, await outcome(fork)
    if op == "delete":
        return op, await outcome(lambda: store.delete(cid, scope=scope))
    limit = rng.choice([None, 1, 2])

    async def listed() -> Any:
        records = await store.list_conversations(scope=scope, limit=limit)
        return [record_view(record, label) for record in records]
    return op, await outcome(listed)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_the_same_operations_answer_as_the_in_memory_store(
        api: AsyncAgentStateClient, uid: str, seed: int) -> None:
    ours = Side(AgentStateConversationStore(client=api, namespace=f"diff-{uid}"))
    theirs = Side(InMemoryConversationStore())
    rng_ours, rng_theirs = random.Random(seed), random.Random(seed)
    counts: dict[str, int] = {}
    for n in range(90):
        mine = await step(ours, rng_ours, n)
        expected = await step(theirs, rng_theirs, n)
        assert mine == expected, f"step {n}: {mine[0]}"
        key = f"{mine[0]}:{mine[1][0] if mine[1] else None}"
        counts[key] = counts.get(key, 0) + 1
    # The sequences reach the interesting paths, not only the happy ones.
    assert counts.get("save:ok") and counts.get("fork:ok") and counts.get("delete:ok"), counts
    # Every conversation reads back the same at the end, records and all.
    final_ours = [record_view(r, ours.label) for r in await ours.store.list_conversations()]
    final_theirs = [record_view(r, theirs.label)
                    for r in await theirs.store.list_conversations()]
    assert final_ours == final_theirs
    for record in await theirs.store.list_conversations():
        cid = record.conversation_id
        assert entries_view(await ours.store.load_entries(cid), ours.label) == \
            entries_view(await theirs.store.load_entries(cid), theirs.label)


def lookup(symbol: str) -> str:
    """The price of a symbol."""
    return f"{symbol}: 189.1"


async def test_an_agent_run_is_saved_loaded_branched_and_forked(
        api: AsyncAgentStateClient, uid: str) -> None:
    store = AgentStateConversationStore(client=api, namespace=f"agent-{uid}")
    agent = Agent(TestModel(), tools=[lookup])
    cid = f"chat/{uid}"  # not a valid agentstate name as it is: encoded
    conversation = await store.load(cid) or Conversation(conversation_id=cid)
    first = await agent.run("Price of AAPL?", conversation=conversation)
    assert any(isinstance(p, ToolCallPart) for m in first.all_messages() for p in m.parts)
    assert len(await store.save(first)) == len(first.all_messages())
    loaded = await store.load(cid)
    assert loaded is not None and loaded.messages == first.all_messages()
    second = await agent.run("And now?", conversation=loaded)
    new = await store.save(second)
    assert len(new) == len(second.new_messages())
    loaded = await store.load(cid)
    assert loaded is not None
    assert loaded.messages == second.all_messages() and loaded.usage == second.usage
    assert (await store.load(cid, limit=2)).messages == second.all_messages()[-2:]  # type: ignore[union-attr]
    turn_one = len(first.all_messages())

    # Branch back to the end of the first turn and continue there.
    branched = await store.branch(cid, at=turn_one, expected_revision=loaded.revision)
    third = await agent.run("Something else", conversation=branched)
    await store.save(third)
    record = await store.read_record(cid)
    assert record is not None and len(record.branches) == 1
    reloaded = await store.load(cid)
    assert reloaded is not None and reloaded.messages == third.all_messages()
    # ... and back to the branch it left.
    back = await store.branch(cid, from_entry=record.branches[0],
                              expected_revision=record.revision)
    assert back.messages == second.all_messages()

    # A fork shares the entries before it and continues on its own.
    fork_id = f"fork/{uid}"
    forked = await store.fork(cid, at=turn_one, new_conversation_id=fork_id)
    fourth = await agent.run("In the fork", conversation=forked)
    await store.save(fourth)
    entries = await store.load_entries(fork_id)
    source = await store.load_entries(cid)
    assert entries is not None and source is not None
    assert [e.id for e in entries[:turn_one]] == [e.id for e in source[:turn_one]]
    assert [e.message for e in entries] == fourth.all_messages()
    forks = await store.list_conversations()
    assert [r.conversation_id for r in forks] == [fork_id, cid]
    assert forks[0].forked_from == cid and forks[0].forked_at == source[turn_one - 1].id
    # The fork's history is one request, through both threads.
    page = await api.get_lineage(entries[-1].id, limit=1000)
    assert {m.thread_id for m in page.data} == {store.thread_id(cid), store.thread_id(fork_id)}


async def test_concurrent_saves_of_one_loaded_conversation(api: AsyncAgentStateClient,
                                                           uid: str) -> None:
    namespace = f"race-{uid}"
    store = AgentStateConversationStore(client=api, namespace=namespace)
    base = Conversation(conversation_id="c", messages=turn(0, True))
    await store.save(base)
    loaded = await store.load("c")
    assert loaded is not None

    async def save(n: int) -> Any:
        # Each writer its own store (another process), from the same loaded conversation.
        writer = AgentStateConversationStore(client=api, namespace=namespace)
        conversation = copy.deepcopy(loaded)
        conversation.messages = [*conversation.messages, *turn(100 + n, False)]
        await writer.read_record("c")
        return await writer.save(conversation)

    results = await asyncio.gather(*(save(n) for n in range(12)), return_exceptions=True)
    winners = [r for r in results if not isinstance(r, BaseException)]
    losers = [r for r in results if isinstance(r, BaseException)]
    assert len(winners) == 1 and all(isinstance(r, ConversationConflict) for r in losers), results
    final = await store.load_entries("c")
    assert final is not None and [e.id for e in final[-2:]] == [e.id for e in winners[0]]
    assert [e.message for e in final[:len(base.messages)]] == base.messages
    # The losers wrote nothing: the thread holds the base, the winner's turn and no more.
    thread = await api.get_thread(store.thread_id("c"), include_messages=True)
    assert thread.message_count == len(base.messages) + 2


async def test_deleting_what_a_fork_reaches_keeps_the_fork_readable(
        api: AsyncAgentStateClient, uid: str) -> None:
    store = AgentStateConversationStore(client=api, namespace=f"del-{uid}")
    await store.save(Conversation(conversation_id="a", messages=[*turn(1, True), *turn(2, False)]))
    forked = await store.fork("a", at=4, new_conversation_id="f")
    forked.messages = [*forked.messages, *turn(3, False)]
    await store.save(forked)
    await store.fork("a", new_conversation_id="bare")  # no entries of its own
    expected = {cid: (await store.load(cid)).messages for cid in ("f", "bare")}  # type: ignore[union-attr]

    await store.delete("a")
    assert await store.load("a") is None
    assert [r.conversation_id for r in await store.list_conversations()] == ["bare", "f"]
    for cid, messages in expected.items():
        loaded = await store.load(cid)
        assert loaded is not None and loaded.messages == messages
    # The id can be used again, afresh.
    await store.save(Conversation(conversation_id="a", messages=turn(9, False)))
    again = await store.load("a")
    assert again is not None and again.messages == turn(9, False)
    assert (await store.load("f")).messages == expected["f"]  # type: ignore[union-attr]
    await store.delete("a")

    # Once nothing reaches them, the kept entries go with the last fork.
    await store.delete("f")
    assert (await store.load("bare")).messages == expected["bare"]  # type: ignore[union-attr]
    await store.delete("bare")
    assert await store.list_conversations() == []
    for cid in ("a", "f", "bare"):
        with pytest.raises(NotFound):
            await api.get_thread(store.thread_id(cid))


async def test_missing_entries_and_released_heads(api: AsyncAgentStateClient, uid: str) -> None:
    store = AgentStateConversationStore(client=api, namespace=f"miss-{uid}")
    with pytest.raises(LookupError):
        await store.read_entry(f"no-such-entry-{uid}")
    with pytest.raises(LookupError):
        await store.read_history(f"no-such-entry-{uid}")
    # A record whose head no store holds (a concurrent delete released it): a conflict, and
    # nothing is written.
    with pytest.raises(ConversationConflict):
        await store.write_record(
            ConversationRecord(conversation_id="x", head_id=f"gone-{uid}"),
            expected_revision=None)
    assert await store.read_record("x") is None
    # A long first save (more than one request's worth of messages) is still one write.
    long = [m for n in range(60) for m in turn(n, False)]
    entries = await store.save(Conversation(conversation_id="long", messages=long))
    assert len(entries) == 120
    assert [e.message for e in await store.read_history(entries[-1].id)] == long
    assert [e.message for e in await store.read_history(entries[-1].id, limit=7)] == long[-7:]
    stale = ConversationRecord(conversation_id="long", head_id=None)
    with pytest.raises(ConversationConflict):
        await store.write_record(stale, expected_revision="not-the-revision")
    assert dataclasses.replace(stale).head_id is None


class Counting(httpx.AsyncBaseTransport):
    """The app over ASGI, recording each request's method and path."""

    def __init__(self, app: FastAPI) -> None:
        self.inner = httpx.ASGITransport(app=app)
        self.requests: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(f"{request.method} {request.url.path}")
        return await self.inner.handle_async_request(request)


async def test_turn_400_costs_what_turn_1_costs(app: FastAPI, uid: str) -> None:
    transport = Counting(app)
    async with AsyncAgentStateClient("http://agentstate.test", transport=transport) as client:
        store = AgentStateConversationStore(client=client, namespace=f"cost-{uid}")
        conversation = Conversation(conversation_id="long")
        for n in range(100):  # 400 messages, saved a turn at a time
            conversation.messages = [*conversation.messages, *turn(n, True)]
            await store.save(conversation)
        transport.requests.clear()
        loaded = await store.load("long")
        assert loaded is not None and len(loaded.messages) == 400
        # The record, then the whole history in one lineage read.
        assert [r.split(" ")[0] for r in transport.requests] == ["GET", "GET"]
        assert transport.requests[1].endswith("/lineage")
        transport.requests.clear()
        loaded.messages = [*loaded.messages, *turn(400, False)]
        await store.save(loaded)
        # The record's revision, then one PUT: record and new entries together.
        assert [r.split(" ")[0] for r in transport.requests] == ["GET", "PUT"]
        # Another app on the same tenant sees none of it.
        other = AgentStateConversationStore(client=client, namespace=f"other-{uid}")
        assert await other.load("long") is None and await other.list_conversations() == []
