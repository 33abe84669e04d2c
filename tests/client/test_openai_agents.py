"""The openai-agents `Session` on agentstate: through the SDK's own `Runner` with a scripted
model (no network), and call for call against the SDK's `SQLiteSession`.

In-process (httpx over ASGI to the app on each backend), so not `slow`.
"""

from __future__ import annotations

import random
from typing import Any

import httpx
import pytest
from agents import Agent, RunConfig, Runner, SQLiteSession, function_tool
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from agentstate_client import AsyncAgentStateClient
from agentstate_client.openai_agents import AgentStateSession
from fastapi import FastAPI
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

pytestmark = pytest.mark.anyio


def text(message_id: str, words: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id=message_id, type="message", role="assistant", status="completed",
        content=[ResponseOutputText(type="output_text", text=words, annotations=[])])


def call(call_id: str, name: str, arguments: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(id=f"fc_{call_id}", call_id=call_id, type="function_call",
                                    name=name, arguments=arguments)


class ScriptedModel(Model):
    """Answers each model call with the next scripted output, and records what it was sent."""

    def __init__(self, turns: list[list[Any]]) -> None:
        self.turns = list(turns)
        self.inputs: list[Any] = []

    async def get_response(self, system_instructions: Any, input: Any, *args: Any,
                           **kwargs: Any) -> ModelResponse:
        self.inputs.append(input)
        return ModelResponse(output=self.turns.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


@function_tool
def lookup(symbol: str) -> str:
    """The price of a symbol."""
    return f"{symbol}: 189.1"


def script() -> list[list[Any]]:
    return [[call("c1", "lookup", '{"symbol": "AAPL"}')], [text("m1", "AAPL is 189.1")],
            [text("m2", "You asked about AAPL.")]]


async def run_conversation(session: Any) -> tuple[list[Any], ScriptedModel]:
    model = ScriptedModel(script())
    agent = Agent(name="analyst", instructions="Be terse.", model=model, tools=[lookup])
    # No tracing: it would start the SDK's exporter thread (and try to reach OpenAI).
    config = RunConfig(tracing_disabled=True)
    first = await Runner.run(agent, "Price of AAPL?", session=session, run_config=config)
    assert first.final_output == "AAPL is 189.1"
    second = await Runner.run(agent, "What did I ask?", session=session, run_config=config)
    assert second.final_output == "You asked about AAPL."
    return await session.get_items(), model


async def test_runner_keeps_the_conversation_like_sqlite_session(
        api: AsyncAgentStateClient, uid: str) -> None:
    ours, our_model = await run_conversation(
        AgentStateSession(f"user/{uid}/chat", client=api))
    theirs, their_model = await run_conversation(SQLiteSession(f"user/{uid}/chat"))
    assert ours == theirs
    assert [item.get("type", "message") for item in ours] == [
        "message", "function_call", "function_call_output", "message", "message", "message"]
    # The second run's model call saw the whole first turn, read back from agentstate.
    assert our_model.inputs[2] == their_model.inputs[2]
    assert len(our_model.inputs[2]) == 5
    # The thread is the session id mapped by agentstate_client.ids, readable as messages.
    messages = [m async for m in api.iter_messages(f"user@2F{uid}@2Fchat")]
    assert [m.role for m in messages] == ["user", "function_call", "function_call_output",
                                          "assistant", "user", "assistant"]
    assert [m.item for m in messages] == ours


ITEMS: list[dict[str, Any]] = [
    {"role": "user", "content": "hi"},
    {"content": [{"type": "input_text", "text": "parts"}], "role": "user", "type": "message"},
    {"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "hm"}]},
    {"arguments": "{}", "call_id": "c9", "name": "f", "type": "function_call", "id": "fc_9"},
    {"call_id": "c9", "output": "{\"ok\": true}", "type": "function_call_output"},
    {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
     "content": [{"type": "output_text", "text": "done", "annotations": []}]},
    {"role": "system", "content": "be brief", "zzz": {"b": 1, "a": [None, 2.5, "é"]}},
]


async def differential(ours: AgentStateSession, theirs: SQLiteSession,
                       steps: list[tuple[str, Any]]) -> list[Any]:
    """Apply each step to both sessions; every answer and the items after it must agree."""
    log = []
    for op, arg in steps:
        if op == "add":
            answers = [await ours.add_items(arg), await theirs.add_items(arg)]
        elif op == "get":
            answers = [await ours.get_items(arg), await theirs.get_items(arg)]
        elif op == "pop":
            answers = [await ours.pop_item(), await theirs.pop_item()]
        else:
            answers = [await ours.clear_session(), await theirs.clear_session()]
        assert answers[0] == answers[1], (op, arg)
        now = await ours.get_items(), await theirs.get_items()
        assert now[0] == now[1], (op, arg)
        # Verbatim: the same keys in the same order, not just equal dicts.
        assert [list(i) for i in now[0]] == [list(i) for i in now[1]], (op, arg)
        log.append((op, answers[0]))
    return log


SEQUENCE: list[tuple[str, Any]] = [
    ("get", None), ("pop", None), ("clear", None), ("add", []),
    ("add", ITEMS[:3]), ("get", 1), ("get", 2), ("get", 0), ("get", 50), ("get", -1),
    ("add", ITEMS[3:]), ("pop", None), ("pop", None), ("get", 3), ("add", ITEMS[:1]),
    ("clear", None), ("get", None), ("pop", None), ("add", ITEMS), ("add", ITEMS[2:4]),
    ("get", 4), ("pop", None), ("get", None),
]


async def test_same_calls_same_items_as_sqlite_session(api: AsyncAgentStateClient,
                                                      uid: str) -> None:
    log = await differential(AgentStateSession(uid, client=api), SQLiteSession(uid), SEQUENCE)
    assert log[-2] == ("pop", ITEMS[3])


async def test_random_sequences_agree_with_sqlite_session(api: AsyncAgentStateClient,
                                                         uid: str) -> None:
    rng = random.Random(16)
    steps: list[tuple[str, Any]] = []
    for _ in range(60):
        op = rng.choice(["add", "add", "get", "pop", "clear"] if len(steps) % 17 == 16
                        else ["add", "add", "get", "pop"])
        arg = (rng.sample(ITEMS, rng.randint(0, 4)) if op == "add"
               else rng.choice([None, 0, 1, 2, 5, 120]) if op == "get" else None)
        steps.append((op, arg))
    await differential(AgentStateSession(f"r/{uid}", client=api), SQLiteSession(uid), steps)


async def test_more_than_a_batch_and_session_settings(api: AsyncAgentStateClient,
                                                      uid: str) -> None:
    from agents.memory.session_settings import SessionSettings

    many = [{"role": "user", "content": f"n{i}"} for i in range(250)]
    ours = AgentStateSession(uid, client=api, session_settings=SessionSettings(limit=3))
    theirs = SQLiteSession(uid, session_settings=SessionSettings(limit=3))
    await differential(ours, theirs, [("add", many), ("get", None), ("get", 240)])
    assert len(await ours.get_items(-1)) == 250
    assert await ours.get_items() == many[-3:]


async def test_more_than_a_page(api: AsyncAgentStateClient, uid: str) -> None:
    """Reads of more items than one page (1,000) follow the cursor, in both orders."""
    many = [{"role": "user", "content": f"n{i}"} for i in range(1205)]
    await differential(AgentStateSession(uid, client=api), SQLiteSession(uid),
                       [("add", many), ("get", 1100), ("get", 1000), ("get", 999),
                        ("get", 5000)])


class LosesBatchAnswers(httpx.AsyncBaseTransport):
    """Delivers every request; the answers to the first `lose` appends are lost on the way
    back (after the server committed them), and one further append never reaches it."""

    def __init__(self, app: FastAPI, lose: int) -> None:
        self.inner = httpx.ASGITransport(app=app)
        self.lose = lose
        self.appends = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/batch" and self.appends == self.lose:
            self.appends += 1
            raise httpx.ConnectError("refused", request=request)
        response = await self.inner.handle_async_request(request)
        if request.url.path == "/v1/batch" and self.appends < self.lose:
            self.appends += 1
            await response.aread()
            raise httpx.ReadError("connection reset", request=request)
        return response


async def test_an_append_whose_answer_was_lost_is_stored_once(app: FastAPI, uid: str) -> None:
    """No Idempotency-Key: the items' own ids make a lost answer's resend harmless, and an
    append that never arrived is sent again."""
    transport = LosesBatchAnswers(app, lose=1)
    async with AsyncAgentStateClient("http://agentstate.test", transport=transport) as client:
        session = AgentStateSession(uid, client=client)
        await session.add_items(ITEMS[:2])  # stored; its answer lost
        await session.add_items(ITEMS[2:4])  # refused at connect, then sent again
        await session.add_items(ITEMS[4:5])
        assert transport.appends == 2
        assert await session.get_items() == ITEMS[:5]
