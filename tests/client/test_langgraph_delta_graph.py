"""A real LangGraph 1.2 graph whose `messages` is a `DeltaChannel` (snapshots every 3
updates, so most checkpoints hold no value for it and are rebuilt from ancestors' writes),
checkpointed by `AgentStateSaver` against a real server process, on SQLite and Postgres:
three interrupted turns each resumed by a new process, then the history, time travel (a
replay from a past checkpoint) and a fork (`update_state` on a past checkpoint, resumed).
Every answer equals InMemorySaver's, and on Postgres AsyncPostgresSaver's, for the same
calls."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from agentstate_client.langgraph import AgentStateSaver
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command
from sqlalchemy.engine import make_url

from tests.client.langgraph_graph import build, outcome
from tests.support import ROOT, ServerProcess

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
TURNS = [("start", "weather in Paris"), ("resume", "alice"), ("start", "weather in Oslo"),
         ("resume", "bob"), ("start", "weather in Rome"), ("resume", "carol")]


def in_new_process(base_url: str, thread_id: str, action: str, arg: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.client.langgraph_graph", base_url, thread_id, action,
         arg, "delta"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def view(state: Any) -> Any:
    """A state snapshot as comparable across savers (ids and times are each saver's own)."""
    return (state.metadata["step"], state.next,
            [(type(m).__name__, m.content) for m in state.values.get("messages", [])],
            [[i.value for i in task.interrupts] for task in state.tasks])


async def explore(graph: Any, config: dict[str, Any]) -> list[Any]:
    """The state and history, then a replay from the checkpoint before the agent's second
    answer (time travel), then a fork of the first question, resumed."""
    log: list[Any] = [view(await graph.aget_state(config))]
    history = [s async for s in graph.aget_state_history(config)]
    log.append([view(s) for s in history])
    # Newest first; the checkpoints where the agent is next, oldest first.
    before_agent = [s for s in history if s.next == ("agent",)][::-1]
    replayed = await graph.ainvoke(None, before_agent[3].config)
    log.append(outcome(replayed))
    first_question = before_agent[0]
    question = first_question.values["messages"][0]
    forked = await graph.aupdate_state(first_question.config, {"messages": [
        HumanMessage("weather in Lima", id=question.id)]})
    log.append(outcome(await graph.ainvoke(None, forked)))
    log.append(outcome(await graph.ainvoke(Command(resume="dave"), config)))
    log.append(view(await graph.aget_state(config)))
    log.append(len([s async for s in graph.aget_state_history(config)]))
    return log


async def reference(saver: Any) -> list[Any]:
    graph = build(saver, delta=True)
    config = {"configurable": {"thread_id": f"delta-{uuid.uuid4()}"}}
    log = []
    for action, arg in TURNS:
        result = await graph.ainvoke({"messages": [HumanMessage(arg)]} if action == "start"
                                     else Command(resume=arg), config)
        log.append(outcome(result))
    return log + await explore(graph, config)


@asynccontextmanager
async def async_postgres_saver(database_url: str) -> AsyncIterator[Any]:
    """AsyncPostgresSaver in a schema of its own in the test database."""
    import psycopg
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    plain = make_url(database_url).set(drivername="postgresql").render_as_string(
        hide_password=False)
    schema = f"lg_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(plain, autocommit=True) as connection:
        connection.execute(f"CREATE SCHEMA {schema}")
    try:
        async with AsyncPostgresSaver.from_conn_string(
                f"{plain}?options=-csearch_path%3D{schema}") as saver:
            await saver.setup()
            yield saver
    finally:
        with psycopg.connect(plain, autocommit=True) as connection:
            connection.execute(f"DROP SCHEMA {schema} CASCADE")


async def test_delta_channel_graph_matches_langgraphs_savers(server: ServerProcess,
                                                             database_url: str) -> None:
    thread_id = f"delta/{uuid.uuid4()}"
    ours = [in_new_process(server.base_url, thread_id, action, arg) for action, arg in TURNS]
    assert ours[-1]["messages"][-1] == ["AIMessage", "answer: sunny in Rome (approved by carol)"]
    assert len(ours[-1]["messages"]) == 12
    saver = AgentStateSaver(base_url=server.base_url)
    try:
        ours += await explore(build(saver, delta=True),
                              {"configurable": {"thread_id": thread_id}})
    finally:
        await saver.aclose()
        saver.close()
    assert ours[-2][2][-1] == ("AIMessage", "answer: sunny in Lima (approved by dave)")
    assert ours == await reference(InMemorySaver())
    if database_url.startswith("postgresql"):
        async with async_postgres_saver(database_url) as theirs:
            assert ours == await reference(theirs)
