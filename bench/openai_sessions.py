"""OpenAI Agents SDK sessions: agentstate's `AgentStateSession` over HTTP (Postgres)
against the SDK's own `SQLAlchemySession` in-process on the same Postgres database (its
network-backed peer) and its `SQLiteSession` (a file, in-process), one 400-turn session each
(two items a turn, added as the Runner adds them: the user's input, then the model's output),
turn by turn alternately, so all see the same machine.

    .venv/bin/python -m bench.openai_sessions [--turns 400] [--reads 5]

Reports the median `add_items` latency per turn over turns 1-10 and the last ten turns, a
`get_items(limit=20)` (what a Runner with a session limit reads), and `get_items()` of the
whole session (reads alternate between the sessions too). One request at a time: latency,
not load. Beside the reads, the floor of any read over HTTP on this stack: the GET of a bare
FastAPI endpoint whose one SELECT reads a row (bench/minimal_app.py), through the client's
own HTTP transport, in the same rotation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

from bench.server import (
    FLOOR,
    agentstate_server,
    create_postgres_database,
    drop_postgres_database,
    floor_reader,
    libpq_dsn,
    migrate,
    minimal_server,
)

EARLY = 10


def items(turn: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    question = [{"role": "user", "content": f"Question {turn}: what is the price of AAPL?"}]
    answer = [{"id": f"msg_{turn}", "type": "message", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "annotations": [],
                            "text": f"Answer {turn}: AAPL traded at 189.1 " * 4}]}]
    return question, answer


async def conversations(sessions: dict[str, Any], turns: int, reads: int,
                        floor: Any) -> dict[str, dict[str, Any]]:
    per_turn: dict[str, list[float]] = {name: [] for name in sessions}
    for turn in range(1, turns + 1):
        for name, session in sessions.items():
            start = time.perf_counter()
            for batch in items(turn):
                await session.add_items(batch)
            per_turn[name].append(time.perf_counter() - start)
    timed: dict[str, dict[int | None, list[float]]] = {
        name: {20: [], None: []} for name in sessions}
    floors: list[float] = []
    for _ in range(reads):
        for limit in (20, None):
            for name, session in sessions.items():
                start = time.perf_counter()
                got = await session.get_items(limit)
                timed[name][limit].append(time.perf_counter() - start)
                assert len(got) == (limit or 2 * turns)
            start = time.perf_counter()
            await floor()
            floors.append(time.perf_counter() - start)
    def ms(samples: list[float]) -> float:
        return round(median(samples) * 1000, 2)

    return {FLOOR: {"get_ms": ms(floors)},
            **{name: {"early_turn_ms": ms(per_turn[name][:EARLY]),
                      "late_turn_ms": ms(per_turn[name][-EARLY:]),
                      "get_items_20_ms": ms(timed[name][20]),
                      "get_items_all_ms": ms(timed[name][None]),
                      "items": 2 * turns} for name in sessions}}


async def compare(base_url: str, database: str, sqlite_path: Path, turns: int,
                  reads: int, floor_url: str) -> dict[str, Any]:
    from agents import SQLiteSession
    from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession
    from agentstate_client.openai_agents import AgentStateSession

    peer = SQLAlchemySession.from_url("bench", url=database, create_tables=True)
    local = SQLiteSession("bench", db_path=sqlite_path)
    async with AgentStateSession("bench/openai", base_url=base_url) as ours, \
            floor_reader(base_url, floor_url) as floor_get:
        try:
            return await conversations({"agentstate_over_http": ours,
                                        "sqlalchemy_session_postgres": peer,
                                        "sqlite_session": local}, turns, reads, floor_get)
        finally:
            local.close()
            await peer.engine.dispose()


def run(turns: int, reads: int) -> dict[str, Any]:
    database = create_postgres_database()
    try:
        migrate(database)
        with tempfile.TemporaryDirectory() as scratch, \
                agentstate_server(database, workers=1) as server, \
                minimal_server(1, libpq_dsn(database)) as floor:
            return {"turns": turns, **asyncio.run(compare(
                server.base_url, database, Path(scratch) / "sessions.db", turns, reads,
                floor.base_url))}
    finally:
        drop_postgres_database(database)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--reads", type=int, default=5)
    args = parser.parse_args()
    results = run(args.turns, args.reads)
    print(json.dumps(results, indent=2))
    print("| session | add_items per turn, turns 1-10 | last 10 turns | get_items(20) | "
          "get_items() |\n|---|---|---|---|---|")
    for name in ("agentstate_over_http", "sqlalchemy_session_postgres", "sqlite_session"):
        r = results[name]
        print(f"| {name} | {r['early_turn_ms']} ms | {r['late_turn_ms']} ms | "
              f"{r['get_items_20_ms']} ms | {r['get_items_all_ms']} ms ({r['items']} items) |")
    print(f"| {FLOOR} | | | {results[FLOOR]['get_ms']} ms | |")


if __name__ == "__main__":
    main()
