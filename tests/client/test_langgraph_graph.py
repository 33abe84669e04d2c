"""A real LangGraph 1.2 graph checkpointed by `AgentStateSaver` against a real server process,
on SQLite and Postgres: interrupt, resume from a new process, the history, a fork from a past
checkpoint with `update_state`, and a resume after the server restarted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from agentstate_client.langgraph import AgentStateSaver
from langchain_core.messages import HumanMessage
from langgraph.types import Command

from tests.client.langgraph_graph import build, outcome
from tests.support import ROOT, ServerProcess

pytestmark = pytest.mark.slow


def run(base_url: str, thread_id: str, action: str, arg: str) -> dict:
    """The graph driven by a process of its own: nothing survives in memory between steps."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.client.langgraph_graph", base_url, thread_id, action, arg],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_interrupt_resume_history_fork_and_restart(database_url: str, uid: str) -> None:
    thread_id = f"user/42/chat-{uid}"  # not a valid agentstate name: mapped by encode_id
    server = ServerProcess(database_url).start()
    try:
        started = run(server.base_url, thread_id, "start", "weather in Paris")
        assert started["interrupt"] == [{"question": "look up the weather in Paris?"}]
        assert [kind for kind, _ in started["messages"]] == ["HumanMessage", "AIMessage"]

        resumed = run(server.base_url, thread_id, "resume", "alice")
        assert resumed["interrupt"] == []
        assert resumed["messages"][-2:] == [
            ["ToolMessage", "sunny in Paris (approved by alice)"],
            ["AIMessage", "answer: sunny in Paris (approved by alice)"]]

        saver = AgentStateSaver(base_url=server.base_url)
        graph = build(saver)
        config = {"configurable": {"thread_id": thread_id}}
        history = list(graph.get_state_history(config))
        steps = [(s.metadata["step"], s.next) for s in history]
        # Newest first: input, agent, tools (interrupted, then resumed), agent, end.
        assert steps == [(3, ()), (2, ("agent",)), (1, ("tools",)), (0, ("agent",)),
                         (-1, ("__start__",))]
        assert history[2].tasks[0].interrupts[0].value == {
            "question": "look up the weather in Paris?"}
        assert saver.client.get_thread(
            thread_id.replace("/", "@2F")).thread_id == "user@2F42@2Fchat-" + uid

        # Fork at the checkpoint before the model first ran: the question becomes Rome.
        before_agent = history[3]
        question = before_agent.values["messages"][0]
        forked = graph.update_state(before_agent.config, {"messages": [
            HumanMessage("weather in Rome", id=question.id)]})
        assert forked["configurable"]["checkpoint_id"] != before_agent.config[
            "configurable"]["checkpoint_id"]
        paused = graph.invoke(None, forked)
        assert [i.value for i in paused["__interrupt__"]] == [
            {"question": "look up the weather in Rome?"}]
        saver.close()
    finally:
        server.stop()

    # The server restarts (same database, same port); a new process resumes the fork.
    server.start()
    try:
        finished = run(server.base_url, thread_id, "resume", "bob")
        assert finished["messages"] == [
            ["HumanMessage", "weather in Rome"], ["AIMessage", ""],
            ["ToolMessage", "sunny in Rome (approved by bob)"],
            ["AIMessage", "answer: sunny in Rome (approved by bob)"]]
        saver = AgentStateSaver(base_url=server.base_url)
        graph = build(saver)
        config = {"configurable": {"thread_id": thread_id}}
        history = list(graph.get_state_history(config))
        # The original branch is still there, untouched by the fork.
        paris = [s for s in history if s.metadata["step"] == 3 and s.values["messages"][
            -1].content == "answer: sunny in Paris (approved by alice)"]
        assert len(paris) == 1
        assert graph.get_state(config).values["messages"][-1].content == \
            "answer: sunny in Rome (approved by bob)"
        again = graph.invoke(Command(resume="nobody"), config)  # nothing pending: no change
        assert outcome(again)["messages"][-1][1] == "answer: sunny in Rome (approved by bob)"
        saver.close()
    finally:
        server.stop()


def test_one_saver_across_event_loops_and_blocking_calls(server: ServerProcess, uid: str) -> None:
    """The same saver from two `asyncio.run`s and from blocking code; a graph's state written
    by one form reads back through the other."""
    import asyncio

    saver = AgentStateSaver(base_url=server.base_url)
    graph = build(saver)
    config = {"configurable": {"thread_id": f"loops/{uid}"}}

    async def first() -> None:
        await graph.ainvoke({"messages": [HumanMessage("weather in Oslo")]}, config)

    async def second() -> str:
        result = await graph.ainvoke(Command(resume="carol"), config)
        return str(result["messages"][-1].content)

    asyncio.run(first())
    assert asyncio.run(second()) == "answer: sunny in Oslo (approved by carol)"
    assert len(list(graph.get_state_history(config))) == 5
    saver.prune([f"loops/{uid}"], strategy="keep_latest")
    assert len(list(graph.get_state_history(config))) == 1
    assert graph.get_state(config).values["messages"][-1].content.endswith("carol)")
    saver.close()
