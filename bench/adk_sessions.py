"""ADK sessions: Google ADK's `DatabaseSessionService` in-process against agentstate's
`AgentStateSessionService` over HTTP, on the same Postgres server, one 400-turn session
each (two events a turn: the user's message, the model's answer with a state delta). A
third session runs the same adapter over httpx's own transport instead of the client's
lean one (agentstate_client/_http1.py), the baseline for what that transport saves.

    .venv/bin/python -m bench.adk_sessions [--turns 400] [--reads 9]

Reports the median (and p90) `append_event` latency over turns 1-10 and over the last ten
turns, per event and per turn (two events), and the median time of a `get_session` of the
whole session (all 2 x turns events), after a 5-turn warm-up session on each service. One
request at a time: latency, not load. The services run interleaved, turn by turn and read
by read, each going first in turn, so the machine's load falls on all alike. ADK gets
a database of its own on the same server (its tables would collide with agentstate's
`events`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
from statistics import median
from typing import Any

from bench.server import (
    agentstate_server,
    create_postgres_database,
    drop_postgres_database,
    migrate,
)
from bench.stats import percentile

EARLY = 10


def events(turn: int) -> list[Any]:
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions
    from google.genai import types

    question = Event(invocation_id=f"inv-{turn}", author="user", content=types.Content(
        role="user", parts=[types.Part(text=f"Question {turn}: what is the price of AAPL?")]))
    answer = Event(invocation_id=f"inv-{turn}", author="analyst", content=types.Content(
        role="model", parts=[types.Part(text=f"Answer {turn}: AAPL traded at 189.1 " * 4)]),
        actions=EventActions(state_delta={"turn": turn, "user:last_turn": turn}))
    return [question, answer]


class Timings:
    """One service's append and read times, collected turn by turn."""

    def __init__(self) -> None:
        self.per_event: list[list[float]] = []
        self.loads: list[float] = []

    def summary(self, turns: int) -> dict[str, Any]:
        def window(rows: list[list[float]]) -> dict[str, float]:
            flat = sorted(t for row in rows for t in row)
            turn_times = sorted(sum(row) for row in rows)
            return {"event_ms": round(median(flat) * 1000, 2),
                    "event_p90_ms": round(percentile(flat, 90) * 1000, 2),
                    "turn_ms": round(median(turn_times) * 1000, 2)}

        return {"early": window(self.per_event[:EARLY]),
                "late": window(self.per_event[-EARLY:]),
                "get_session_ms": round(median(self.loads) * 1000, 2), "events": 2 * turns}


async def warm_up(service: Any) -> Any:
    """A short session first, on both services alike, so turns 1-10 measure a new session
    and not the first requests of a process (connections, statement caches)."""
    warm = await service.create_session(app_name="bench", user_id="u0")
    for turn in range(1, 6):
        for event in events(turn):
            await service.append_event(warm, event)
    await service.get_session(app_name="bench", user_id="u0", session_id=warm.id)
    return await service.create_session(app_name="bench", user_id="u1",
                                        state={"app:model": "fake", "topic": "prices"})


async def append_turn(service: Any, session: Any, turn: int, timings: Timings) -> None:
    row = []
    for event in events(turn):
        start = time.perf_counter()
        await service.append_event(session, event)
        row.append(time.perf_counter() - start)
    timings.per_event.append(row)


async def load(service: Any, session: Any, turns: int, timings: Timings) -> None:
    start = time.perf_counter()
    loaded = await service.get_session(app_name="bench", user_id="u1", session_id=session.id)
    timings.loads.append(time.perf_counter() - start)
    assert loaded is not None and len(loaded.events) == 2 * turns
    assert loaded.state["turn"] == turns and loaded.state["user:last_turn"] == turns


def settle() -> None:
    """Collect, then freeze what survives (the imported frameworks, the sessions so far) out
    of the collector's view: both services share this process, and a full collection over
    its heap (about 50 ms) otherwise lands inside whichever call happens to trigger it."""
    gc.collect()
    gc.freeze()


async def race(adk_url: str, base_url: str, turns: int, reads: int) -> dict[str, Any]:
    """The services in one loop, turn by turn, taking turns at going first, so a burst of
    load on this shared machine falls on all alike."""
    import httpx
    from agentstate_client import AsyncAgentStateClient
    from agentstate_client.adk import AgentStateSessionService
    from google.adk.sessions.database_session_service import DatabaseSessionService

    stock = AsyncAgentStateClient(base_url, transport=httpx.AsyncHTTPTransport())
    services = {"adk_database_session_service": DatabaseSessionService(db_url=adk_url),
                "agentstate_over_http": AgentStateSessionService(base_url=base_url),
                "agentstate_over_httpx_transport": AgentStateSessionService(client=stock)}
    timings = {name: Timings() for name in services}
    try:
        sessions = {name: await warm_up(service) for name, service in services.items()}
        settle()
        order = list(services)
        for turn in range(1, turns + 1):
            for name in order:
                await append_turn(services[name], sessions[name], turn, timings[name])
            order = order[1:] + order[:1]
        settle()
        for _ in range(reads):
            for name in order:
                await load(services[name], sessions[name], turns, timings[name])
            order = order[1:] + order[:1]
    finally:
        for service in services.values():
            await service.close()
        await stock.aclose()
    return {name: timing.summary(turns) for name, timing in timings.items()}


def run(turns: int, reads: int) -> dict[str, Any]:
    ours_db, adk_db = create_postgres_database(), create_postgres_database()
    try:
        migrate(ours_db)
        with agentstate_server(ours_db, workers=1) as server:
            return {"turns": turns, **asyncio.run(race(adk_db, server.base_url, turns, reads))}
    finally:
        drop_postgres_database(ours_db)
        drop_postgres_database(adk_db)


def table(results: dict[str, Any]) -> str:
    lines = [("| service | append_event turns 1-10 (median / p90 per event, per turn) | "
             "append_event last 10 turns | get_session of all events |"), "|---|---|---|---|"]
    for name, label in (
            ("adk_database_session_service", "ADK DatabaseSessionService (in-process)"),
            ("agentstate_over_http", "AgentStateSessionService (HTTP)"),
            ("agentstate_over_httpx_transport",
             "AgentStateSessionService (HTTP, httpx's own transport)")):
        r = results[name]
        cells = [f"{r[w]['event_ms']} / {r[w]['event_p90_ms']} ms, {r[w]['turn_ms']} ms"
                 for w in ("early", "late")]
        lines.append(f"| {label} | {cells[0]} | {cells[1]} | "
                     f"{r['get_session_ms']} ms ({r['events']} events) |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--reads", type=int, default=9)
    args = parser.parse_args()
    results = run(args.turns, args.reads)
    print(json.dumps(results, indent=2))
    print(table(results))


if __name__ == "__main__":
    main()
