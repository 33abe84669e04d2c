"""OpenAI Agents SDK sessions: the SDK's `SQLiteSession` (a file, in-process) against
agentstate's `AgentStateSession` over HTTP (Postgres), one 400-turn session each (two items a
turn, added as the Runner adds them: the user's input, then the model's output).

    .venv/bin/python -m bench.openai_sessions [--turns 400] [--reads 5]

Reports the median `add_items` latency per turn over turns 1-10 and the last ten turns, a
`get_items(limit=20)` (what a Runner with a session limit reads), and `get_items()` of the
whole session. One request at a time: latency, not load.
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
    agentstate_server,
    create_postgres_database,
    drop_postgres_database,
    migrate,
)

EARLY = 10


def items(turn: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    question = [{"role": "user", "content": f"Question {turn}: what is the price of AAPL?"}]
    answer = [{"id": f"msg_{turn}", "type": "message", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "annotations": [],
                            "text": f"Answer {turn}: AAPL traded at 189.1 " * 4}]}]
    return question, answer


async def conversation(session: Any, turns: int, reads: int) -> dict[str, Any]:
    per_turn = []
    for turn in range(1, turns + 1):
        start = time.perf_counter()
        for batch in items(turn):
            await session.add_items(batch)
        per_turn.append(time.perf_counter() - start)

    async def timed(limit: int | None) -> float:
        times = []
        for _ in range(reads):
            start = time.perf_counter()
            got = await session.get_items(limit)
            times.append(time.perf_counter() - start)
        assert len(got) == (limit or 2 * turns)
        return round(median(times) * 1000, 2)

    return {"early_turn_ms": round(median(per_turn[:EARLY]) * 1000, 2),
            "late_turn_ms": round(median(per_turn[-EARLY:]) * 1000, 2),
            "get_items_20_ms": await timed(20), "get_items_all_ms": await timed(None),
            "items": 2 * turns}


async def sqlite(path: Path, turns: int, reads: int) -> dict[str, Any]:
    from agents import SQLiteSession

    session = SQLiteSession("bench", db_path=path)
    try:
        return await conversation(session, turns, reads)
    finally:
        session.close()


async def agentstate(base_url: str, turns: int, reads: int) -> dict[str, Any]:
    from agentstate_client.openai_agents import AgentStateSession

    async with AgentStateSession("bench/openai", base_url=base_url) as session:
        return await conversation(session, turns, reads)


def run(turns: int, reads: int) -> dict[str, Any]:
    database = create_postgres_database()
    try:
        migrate(database)
        with tempfile.TemporaryDirectory() as scratch:
            results = {"turns": turns, "sqlite_session": asyncio.run(
                sqlite(Path(scratch) / "sessions.db", turns, reads))}
        with agentstate_server(database, workers=1) as server:
            results["agentstate_over_http"] = asyncio.run(
                agentstate(server.base_url, turns, reads))
        return results
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
    for name in ("sqlite_session", "agentstate_over_http"):
        r = results[name]
        print(f"| {name} | {r['early_turn_ms']} ms | {r['late_turn_ms']} ms | "
              f"{r['get_items_20_ms']} ms | {r['get_items_all_ms']} ms ({r['items']} items) |")


if __name__ == "__main__":
    main()
