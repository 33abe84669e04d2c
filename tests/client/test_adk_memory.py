"""ADK's `BaseMemoryService` on agentstate's store: against ADK's own
`InMemoryMemoryService` where its keyword matching and the server's full-text search must
agree, scoping by app and user, idempotent adds, the vector path, and a real ADK `Runner`
whose agent recalls, through the `load_memory` tool, what an earlier session said.
In-process (httpx over ASGI to the app on each backend), so not `slow`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from agentstate_client import AsyncAgentStateClient
from agentstate_client.adk import (
    AgentStateMemoryService,
    AgentStateSessionService,
    memory_namespace,
)
from google.adk.agents import LlmAgent
from google.adk.events.event import Event
from google.adk.memory import InMemoryMemoryService
from google.adk.memory.base_memory_service import BaseMemoryService
from google.adk.memory.memory_entry import MemoryEntry
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions.session import Session
from google.adk.tools import load_memory, preload_memory
from google.genai import types
from pydantic import BaseModel

from tests.client.conftest import Counting

pytestmark = pytest.mark.anyio


def said(n: int, text: str, author: str = "user") -> Event:
    return Event(id=f"ev-{n}", invocation_id=f"inv-{n}", author=author, timestamp=1000.0 + n,
                 content=types.Content(role="user" if author == "user" else "model",
                                       parts=[types.Part(text=text)]))


def called(n: int) -> Event:
    """An event with content but no text (a function call): nothing to remember."""
    return Event(id=f"ev-{n}", invocation_id=f"inv-{n}", author="agent", timestamp=1000.0 + n,
                 content=types.Content(role="model", parts=[types.Part(
                     function_call=types.FunctionCall(name="lookup", args={"q": "x"}))]))


def session(app: str, user: str, session_id: str, events: list[Event]) -> Session:
    return Session(app_name=app, user_id=user, id=session_id, events=events)


def seen(memories: list[MemoryEntry]) -> list[tuple[Any, ...]]:
    """What both services must agree on, order aside (ranking differs by design)."""
    return sorted((m.id, m.author, m.timestamp, " ".join(p.text or "" for p in
                                                           m.content.parts or ()))
                  for m in memories)


async def remember(service: BaseMemoryService, app: str) -> None:
    first = [said(1, "I drink my coffee black every morning"),
             said(2, "Noted: black coffee, no sugar", "agent"), called(3),
             said(4, "Book the Berlin trip for March")]
    await service.add_session_to_memory(session(app, "ann", "s1", first))
    # The session again, grown by a turn: the first events are not remembered twice.
    await service.add_session_to_memory(session(app, "ann", "s1", [
        *first, said(5, "The dentist appointment moved to Tuesday")]))
    await service.add_session_to_memory(session(app, "ann", "s2", [
        said(6, "My Python project uses FastAPI"),
        said(7, "Tuesday is also the team lunch", "agent")]))
    await service.add_events_to_memory(app_name=app, user_id="ann", events=[
        said(8, "Remind me to water the plants"), said(8, "Remind me to water the plants")])
    await service.add_events_to_memory(app_name=app, user_id="ann", session_id="s2",
                                       events=[said(6, "My Python project uses FastAPI")])
    await service.add_session_to_memory(session(app, "bob", "s1", [
        said(9, "I prefer tea over coffee"), said(10, "Bob's Berlin office is closed")]))


# Queries of plain ASCII words, each matching at most ten memories, so both services return
# every match. Left out, where the two differ by design: more than ten matches (ADK keeps the
# ten sharing the most words with the query, ties in insertion order; the server ranks by
# ts_rank / bm25), words joined by `_` (one word to ADK's `\w+`, two to the server's letter
# and digit runs), non-ASCII text (ADK matches a non-ASCII query word as a substring and
# normalises NFC; the server tokenises NFKC and case-folds), thought parts (ADK searches them,
# this service does not remember them), and events dropped from a session added again (ADK
# forgets them, as it replaces the session's events; this service keeps what it stored).
QUERIES = ["coffee", "COFFEE please", "berlin", "Tuesday dentist", "python fastapi",
           "plants", "tea", "what about zebras", "black sugar morning"]


async def test_same_memories_as_adks_in_memory_service(api: AsyncAgentStateClient,
                                                       uid: str) -> None:
    app = f"desk-{uid}"
    theirs, ours = InMemoryMemoryService(), AgentStateMemoryService(client=api)
    await remember(theirs, app)
    await remember(ours, app)
    matched = 0
    for user in ("ann", "bob", "nobody"):
        for query in QUERIES:
            expected = (await theirs.search_memory(app_name=app, user_id=user,
                                                   query=query)).memories
            got = (await ours.search_memory(app_name=app, user_id=user, query=query)).memories
            assert seen(got) == seen(expected), (user, query)
            matched += len(expected)
    assert matched >= 15  # not agreeing on nothing
    # Deleting a memory (in every session it was added with), an id nobody has, and none;
    # adding the sessions again does not bring the deleted ones back.
    for service in (theirs, ours):
        for user, memory_id in (("ann", "ev-4"), ("ann", "ev-6"), ("ann", "nope"),
                                ("bob", None)):
            await service.delete_memory(app_name=app, user_id=user, memory_id=memory_id)
    await remember(theirs, app)
    # A service that knows nothing of what was written: it reads which ids were deleted.
    await remember(AgentStateMemoryService(client=api), app)
    for user, query in (("ann", "berlin"), ("bob", "berlin"), ("ann", "python tuesday"),
                        ("ann", "coffee")):
        expected = (await theirs.search_memory(app_name=app, user_id=user,
                                               query=query)).memories
        got = (await ours.search_memory(app_name=app, user_id=user, query=query)).memories
        assert seen(got) == seen(expected), (user, query)
    assert [m.id for m in (await ours.search_memory(app_name=app, user_id="bob",
                                                    query="berlin")).memories] == ["ev-10"]
    assert (await ours.search_memory(app_name=app, user_id="ann",
                                     query="berlin")).memories == []
    both = await ours.search_memory(app_name=app, user_id="ann", query="coffee tuesday")
    assert len(both.memories) == 4  # the text events only, each once
    assert {m.custom_metadata.get("session_id") for m in both.memories} == {"s1", "s2"}
    assert (await ours.search_memory(app_name=app, user_id="ann", query="  ")).memories == []


async def test_a_search_sees_its_own_app_and_user_only(api: AsyncAgentStateClient,
                                                       uid: str) -> None:
    service = AgentStateMemoryService(client=api)
    scopes = [(f"a-{uid}", "u1"), (f"a-{uid}", "u1/x"), (f"a-{uid}", "u10"),
              (f"a-{uid}/u1", "x"), (f"b-{uid}", "u1")]
    for n, (app, user) in enumerate(scopes):
        await service.add_session_to_memory(session(app, user, "s", [
            said(n, f"shared secret number {n}")]))
    for n, (app, user) in enumerate(scopes):
        found = await service.search_memory(app_name=app, user_id=user, query="secret")
        assert [m.content.parts[0].text for m in found.memories] == [
            f"shared secret number {n}"], (app, user)


async def test_adding_again_writes_nothing_new(app: Any, uid: str) -> None:
    transport = Counting(app)
    async with AsyncAgentStateClient("http://agentstate.test", transport=transport) as api:
        events = [said(1, "alpha beta"), called(2), said(3, "gamma delta")]
        service = AgentStateMemoryService(client=api)
        await service.add_session_to_memory(session(f"app-{uid}", "u", "s", events))
        # Which ids were deleted, then the puts: one batch.
        assert transport.seen == ["POST /v1/store/items/search", "POST /v1/batch"]
        await service.add_session_to_memory(session(f"app-{uid}", "u", "s", events))
        assert len(transport.seen) == 2  # known written: not sent again
        # Another service (nothing known) writes the same items again: still one each.
        await AgentStateMemoryService(client=api).add_session_to_memory(
            session(f"app-{uid}", "u", "s", events))
        await AgentStateMemoryService(client=api).add_events_to_memory(
            app_name=f"app-{uid}", user_id="u", session_id="s", events=events[:1])
        stored = await api.search_store(memory_namespace(f"app-{uid}", "u"), limit=100)
        assert sorted(item.key for item in stored.data) == ["ev-1", "ev-3"]
        # A long session: 100 puts a batch.
        long = [said(n, f"fact number {n}") for n in range(150)]
        del transport.seen[:]
        await service.add_session_to_memory(session(f"app-{uid}", "u", "long", long))
        assert transport.seen.count("POST /v1/batch") == 2
        stored = await api.search_store(memory_namespace(f"app-{uid}", "u", "session", "long"),
                                        limit=1000)
        assert len(stored.data) == 150


async def test_explicit_memories_are_kept_once_each(api: AsyncAgentStateClient,
                                                    uid: str) -> None:
    service = AgentStateMemoryService(client=api)
    entries = [MemoryEntry(content=types.Content(parts=[types.Part(text="likes jazz")]),
                           author="profile", timestamp="2026-01-01T00:00:00",
                           custom_metadata={"source": "form"}),
               MemoryEntry(id="m-2", content=types.Content(parts=[types.Part(
                   text="allergic to peanuts")]))]
    for _ in range(2):
        await service.add_memory(app_name=f"app-{uid}", user_id="u", memories=entries)
    jazz = (await service.search_memory(app_name=f"app-{uid}", user_id="u",
                                        query="jazz")).memories
    assert len(jazz) == 1
    assert (jazz[0].author, jazz[0].timestamp, jazz[0].custom_metadata) == (
        "profile", "2026-01-01T00:00:00", {"source": "form"})
    peanuts = (await service.search_memory(app_name=f"app-{uid}", user_id="u",
                                           query="peanuts")).memories
    assert [m.id for m in peanuts] == ["m-2"]


TOPICS = [{"coffee", "espresso", "latte", "tea"}, {"berlin", "paris", "trip", "flight"},
          {"dentist", "doctor", "appointment"}]


def embed(texts: list[str]) -> list[list[float]]:
    """A toy embedding: how many words of each topic a text has (plus a constant)."""
    out = []
    for text in texts:
        words = text.lower().replace(",", " ").split()
        out.append([float(sum(w in topic for w in words)) for topic in TOPICS] + [0.1])
    return out


async def aembed(texts: list[str]) -> list[list[float]]:
    return embed(texts)


async def test_with_an_embed_function_search_is_by_similarity(api: AsyncAgentStateClient,
                                                              uid: str) -> None:
    app = f"vec-{uid}"
    writer = AgentStateMemoryService(client=api, embed=embed)
    await writer.add_session_to_memory(session(app, "u", "s", [
        said(1, "coffee black, coffee strong"), said(2, "the Berlin trip is in March"),
        said(3, "dentist appointment on Tuesday")]))
    reader = AgentStateMemoryService(client=api, embed=aembed, max_results=1)
    # No memory holds the word: full text finds nothing, similarity finds the coffee one.
    found = await reader.search_memory(app_name=app, user_id="u", query="an espresso")
    assert [m.id for m in found.memories] == ["ev-1"]
    found = await reader.search_memory(app_name=app, user_id="u", query="flight to paris")
    assert [m.id for m in found.memories] == ["ev-2"]
    hybrid = AgentStateMemoryService(client=api, embed=embed, hybrid=True, max_results=2)
    # "march" is a word of the Berlin memory only, "espresso" the coffee topic: first the
    # memory both rankings have, then the one only similarity finds.
    found = await hybrid.search_memory(app_name=app, user_id="u", query="march espresso")
    assert [m.id for m in found.memories] == ["ev-2", "ev-1"]
    lexical = AgentStateMemoryService(client=api)
    assert (await lexical.search_memory(app_name=app, user_id="u",
                                        query="an espresso")).memories == []
    stored = await api.search_store(memory_namespace(app, "u"), vector=embed(["doctor"])[0],
                                    vector_index="adk-memory-4", limit=1)
    assert [item.key for item in stored.data] == ["ev-3"]


def recalled(response: dict[str, Any] | None) -> list[str]:
    """The texts of the memories in `load_memory`'s result (ADK wraps a tool's returned
    model as `{"result": model}`)."""
    result = (response or {})["result"]
    if isinstance(result, BaseModel):
        result = result.model_dump(mode="json")
    return [part["text"] for memory in result["memories"]
            for part in memory["content"]["parts"]]


class Scripted(BaseLlm):
    """A model that answers from a script: a question is answered by calling `load_memory`
    first, then with the text of the memories the tool returned; anything else is noted."""

    model: str = "scripted"

    async def generate_content_async(self, llm_request: LlmRequest,
                                     stream: bool = False) -> AsyncIterator[LlmResponse]:
        last = llm_request.contents[-1]
        parts = last.parts or []
        answered = [p.function_response for p in parts if p.function_response]
        if answered:
            reply = types.Part(text="You told me: " + " | ".join(
                recalled(answered[0].response)))
        elif any("?" in (p.text or "") for p in parts):
            reply = types.Part(function_call=types.FunctionCall(
                name="load_memory", args={"query": "favourite colour"}))
        else:
            reply = types.Part(text="Noted.")
        yield LlmResponse(content=types.Content(role="model", parts=[reply]))


class Preloaded(BaseLlm):
    """A model that answers with what `preload_memory` put in its request."""

    model: str = "preloaded"

    async def generate_content_async(self, llm_request: LlmRequest,
                                     stream: bool = False) -> AsyncIterator[LlmResponse]:
        texts = [part.text for content in llm_request.contents for part in content.parts or ()
                 if part.text and "<PAST_CONVERSATIONS>" in part.text]
        yield LlmResponse(content=types.Content(role="model", parts=[
            types.Part(text=" ".join(texts) or "I remember nothing.")]))


async def run(runner: Runner, user: str, session_id: str, text: str) -> list[Event]:
    return [event async for event in runner.run_async(
        user_id=user, session_id=session_id,
        new_message=types.Content(role="user", parts=[types.Part(text=text)]))]


async def test_an_agent_recalls_an_earlier_session_through_load_memory(
        api: AsyncAgentStateClient, uid: str) -> None:
    app, user = f"runner-{uid}", "user/42"
    sessions = AgentStateSessionService(client=api)
    memory = AgentStateMemoryService(client=api)
    agent = LlmAgent(name="assistant", model=Scripted(), tools=[load_memory],
                     instruction="Answer from memory.")
    runner = Runner(agent=agent, app_name=app, session_service=sessions,
                    memory_service=memory)
    earlier = await sessions.create_session(app_name=app, user_id=user)
    await run(runner, user, earlier.id, "My favourite colour is teal")
    stored = await sessions.get_session(app_name=app, user_id=user, session_id=earlier.id)
    assert stored is not None
    await memory.add_session_to_memory(stored)

    later = await sessions.create_session(app_name=app, user_id=user)
    events = await run(runner, user, later.id, "What is my favourite colour?")
    results = [r for e in events for r in e.get_function_responses()]
    assert [r.name for r in results] == ["load_memory"]
    assert "My favourite colour is teal" in recalled(results[0].response)
    final = events[-1]
    assert final.is_final_response() and final.content and final.content.parts
    assert "teal" in (final.content.parts[0].text or "")

    # preload_memory searches with the user's whole message (here longer than the server
    # takes as a query: the service sends its first 4,096 characters).
    preloading = Runner(agent=LlmAgent(name="assistant", model=Preloaded(),
                                       tools=[preload_memory]),
                        app_name=app, session_service=sessions, memory_service=memory)
    third = await sessions.create_session(app_name=app, user_id=user)
    events = await run(preloading, user, third.id,
                       "Which colour is my favourite? " + "Please think hard. " * 300)
    answer = events[-1].content
    assert answer and answer.parts and "user: My favourite colour is teal" in (
        answer.parts[0].text or "")
