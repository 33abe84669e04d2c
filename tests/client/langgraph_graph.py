"""A real LangGraph graph for the saver tests: `StateGraph` over `MessagesState` (or, with
`delta`, a state whose `messages` is a `DeltaChannel` that snapshots every 3 updates), a fake
chat model (deterministic, no network), a tool node whose tool asks a human through
`interrupt`.

    START -> agent -> (tool calls?) tools -> agent -> END

Run as a module to drive it from a separate process:
`python -m tests.client.langgraph_graph BASE_URL THREAD_ID start TEXT | resume VALUE [delta]`
prints the outcome as one JSON line.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any, TypedDict

from agentstate_client.langgraph import AgentStateSaver
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.channels.delta import DeltaChannel
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.message import _messages_delta_reducer
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, interrupt


@tool
def lookup(city: str) -> str:
    """Look the weather up, once a human approved it."""
    approver = interrupt({"question": f"look up the weather in {city}?"})
    return f"sunny in {city} (approved by {approver})"


def fake_model(state: Any) -> dict[str, list[BaseMessage]]:
    """Asks for the tool on a user message, answers from the tool's result otherwise."""
    last = state["messages"][-1]
    if isinstance(last, ToolMessage):
        return {"messages": [AIMessage(content=f"answer: {last.content}")]}
    city = str(last.content).rsplit(" ", 1)[-1]
    turn = sum(isinstance(m, HumanMessage) for m in state["messages"])
    return {"messages": [AIMessage(content="", tool_calls=[
        {"name": "lookup", "args": {"city": city}, "id": f"call_{turn}_{city}"}])]}


def route(state: Any) -> str:
    last = state["messages"][-1]
    return "tools" if isinstance(last, AIMessage) and last.tool_calls else END


class DeltaState(TypedDict):
    messages: Annotated[list[BaseMessage], DeltaChannel(_messages_delta_reducer,
                                                        snapshot_frequency=3)]


def build(saver: Any, delta: bool = False) -> CompiledStateGraph[Any, Any, Any, Any]:
    graph = StateGraph(DeltaState if delta else MessagesState)  # type: ignore[type-var]
    graph.add_node("agent", fake_model)
    graph.add_node("tools", ToolNode([lookup]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["tools", END])
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=saver)


def outcome(result: dict[str, Any]) -> dict[str, Any]:
    return {"interrupt": [i.value for i in result.get("__interrupt__", [])],
            "messages": [[type(m).__name__, m.content] for m in result["messages"]]}


def main(argv: list[str]) -> None:
    base_url, thread_id, action, arg, *delta = argv
    saver = AgentStateSaver(base_url=base_url)
    graph = build(saver, delta == ["delta"])
    config = {"configurable": {"thread_id": thread_id}}
    if action == "start":
        result = graph.invoke({"messages": [HumanMessage(arg)]}, config)
    else:
        result = graph.invoke(Command(resume=arg), config)
    print(json.dumps(outcome(result)))
    saver.close()


if __name__ == "__main__":
    main(sys.argv[1:])
