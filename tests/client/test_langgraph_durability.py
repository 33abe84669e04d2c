"""LangGraph's durability modes (`sync`, `async`, `exit`) over `AgentStateSaver`, against a
real server process on SQLite and Postgres: after each `ainvoke` returns, a saver that has
seen nothing of the thread (a new process) reads the state and the whole history, and they
are what InMemorySaver, and on Postgres AsyncPostgresSaver, hold after the same calls in the
same mode. What LangGraph was told is stored is stored by the time it returns, in every mode,
with the batched request shape (docs/client.md)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from agentstate_client.langgraph import AgentStateSaver
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from tests.client.langgraph_graph import build, outcome
from tests.client.test_langgraph_delta_graph import TURNS, async_postgres_saver, view
from tests.support import ServerProcess

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

Reading = Callable[[Callable[[Any], Any]], Any]  # runs a read with a saver made for it


async def chat(saver: Any, read_with: Reading, *, delta: bool, durability: str) -> list[Any]:
    """Four turns (two interrupted, two resumed) in `durability` mode; after each, the
    outcome and what a reading saver finds stored: the state and the history."""
    graph = build(saver, delta=delta)
    config = {"configurable": {"thread_id": f"durable-{uuid.uuid4()}"}}
    log: list[Any] = []
    for action, arg in TURNS[:4]:
        result = await graph.ainvoke({"messages": [HumanMessage(arg)]} if action == "start"
                                     else Command(resume=arg), config, durability=durability)

        async def stored(reader: Any) -> list[Any]:
            found = build(reader, delta=delta)
            return [view(await found.aget_state(config)),
                    [view(s) async for s in found.aget_state_history(config)]]

        log += [outcome(result), await read_with(stored)]
    return log


def the_same(saver: Any) -> Reading:
    async def read(action: Callable[[Any], Any]) -> Any:
        return await action(saver)
    return read


@pytest.mark.parametrize("delta", [False, True], ids=["messages", "delta_channel"])
@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
async def test_what_langgraph_was_told_is_stored_when_it_returns(
        server: ServerProcess, database_url: str, durability: str, delta: bool) -> None:
    async def new_saver(action: Callable[[Any], Any]) -> Any:
        reader = AgentStateSaver(base_url=server.base_url)
        try:
            return await action(reader)
        finally:
            await reader.aclose()
            reader.close()

    saver = AgentStateSaver(base_url=server.base_url)
    try:
        ours = await chat(saver, new_saver, delta=delta, durability=durability)
    finally:
        await saver.aclose()
        saver.close()
    assert ours[-2]["messages"][-1] == ["AIMessage", "answer: sunny in Oslo (approved by bob)"]
    assert ours[-1][0][2][-1] == ("AIMessage", "answer: sunny in Oslo (approved by bob)")
    memory = InMemorySaver()
    assert ours == await chat(memory, the_same(memory), delta=delta, durability=durability)
    if database_url.startswith("postgresql"):
        async with async_postgres_saver(database_url) as theirs:
            assert ours == await chat(theirs, the_same(theirs), delta=delta,
                                      durability=durability)
