"""A 400-turn LangGraph chat: `AgentStateSaver` over HTTP against LangGraph's own
`AsyncPostgresSaver` in-process, on the same Postgres, in the same run.

The graph is `StateGraph(MessagesState)` with one node, a fake model (no network) that
answers every user message with about 300 characters; each turn sends one user message of
about 300 characters, so a turn adds two messages. With `--delta` the state's `messages`
is a `DeltaChannel` (langgraph 1.2; snapshot every 100 updates, its default) on both systems.
The two systems run turn by turn, alternating, so both see the same machine state.
AsyncPostgresSaver keeps its tables in the schema `lgpg` of the database agentstate uses
(its table names are agentstate's too).

Measured:
- `ainvoke` latency per turn (turns 1-10 and the last ten), and agentstate's HTTP requests
  per turn (counted in the saver's client);
- CPU per turn over the last 50: this process's (the client's) for each system, and the
  agentstate server's (Postgres's own is counted for neither);
- loading the final state (`aget_state`, median of 5): with the saver that ran the chat,
  and with a new saver, as a new process resuming the chat would (for agentstate a new
  client, whose cache is empty; for AsyncPostgresSaver a new connection), made on the clock;
- bytes stored: `pg_total_relation_size` of each system's checkpoint tables (data, TOAST and
  indexes), and the payload bytes in them, against the message text itself;
- with `--count-turns N` (default 20), a second chat of N turns on each system through a
  proxy in front of Postgres (bench/pgwire.py) that counts the statements and round trips
  each sends per turn (not timed: the proxy adds a hop).

    .venv/bin/pip install -e '.[bench]' -e './client[langgraph]'
    .venv/bin/python -m bench.langgraph_chat            # 400 turns
    .venv/bin/python -m bench.langgraph_chat --delta    # the DeltaChannel variant
    .venv/bin/python -m bench.langgraph_chat --turns 20 # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any, TypedDict

from agentstate_client.langgraph import AgentStateSaver
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.message import _messages_delta_reducer
from sqlalchemy.engine import make_url

from bench.pgwire import WireCounter
from bench.server import (
    Server,
    agentstate_server,
    create_postgres_database,
    drop_postgres_database,
    libpq_dsn,
    migrate,
)

WORDS = [
    "risk", "manager", "position", "exposure", "acceptable", "tighter", "stop", "analyst",
    "divergence", "hourly", "chart", "portfolio", "sizing", "capped", "earnings", "review",
    "momentum", "volume", "breakout", "support", "resistance", "liquidity", "spread", "hedge",
    "option", "delta", "gamma", "volatility", "skew", "yield", "curve", "inflation",
    "guidance", "revenue", "margin", "forecast", "consensus", "upgrade", "downgrade"
]
AGENTSTATE_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_items", "checkpoint_writes")
LGPG_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes")


def text(rng: random.Random, size: int = 300) -> str:
    """About `size` characters of varied words: compressible like prose, not like a repeat."""
    out: list[str] = []
    while sum(len(w) + 1 for w in out) < size:
        out.append(rng.choice(WORDS))
    return " ".join(out)[:size]


class Timings:
    """Wall time per saver call (aget_tuple, aput, aput_writes) per turn: where a turn goes."""

    METHODS = ("aget_tuple", "aput", "aput_writes")

    def __init__(self, saver: Any) -> None:
        self.turn: dict[str, list[float]] = {m: [] for m in self.METHODS}
        self.turns: list[dict[str, list[float]]] = []
        for method in self.METHODS:
            setattr(saver, method, self._timed(method, getattr(saver, method)))

    def _timed(self, name: str, call: Any) -> Any:
        async def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await call(*args, **kwargs)
            finally:
                self.turn[name].append((time.perf_counter() - started) * 1000)
        return timed

    def next_turn(self) -> None:
        self.turns.append(self.turn)
        self.turn = {m: [] for m in self.METHODS}

    def summary(self, window: slice) -> str:
        turns = self.turns[window]
        parts = []
        for method in self.METHODS:
            calls = [x for t in turns for x in t[method]]
            if calls:
                parts.append(f"{method} {len(calls) / len(turns):.0f}x "
                             f"{statistics.median(calls):.1f} ms")
        return ", ".join(parts)


class DeltaMessages(TypedDict):
    """`MessagesState` with its `messages` as a DeltaChannel (langgraph 1.2), reduced by
    LangGraph's own message reducer for it."""

    messages: Annotated[list[Any], DeltaChannel(_messages_delta_reducer)]


def build(checkpointer: Any, seed: int, delta: bool = False) -> Any:
    rng = random.Random(seed)

    def model(state: Any) -> dict[str, list[AIMessage]]:
        return {"messages": [AIMessage(content=text(rng))]}

    graph = StateGraph(DeltaMessages if delta else MessagesState)
    graph.add_node("model", model)
    graph.add_edge(START, "model")
    return graph.compile(checkpointer=checkpointer)


async def sizes(dsn: str) -> dict[str, dict[str, int]]:
    import asyncpg

    connection = await asyncpg.connect(dsn)
    try:
        out: dict[str, dict[str, int]] = {}
        for system, schema, tables in (("agentstate", "public", AGENTSTATE_TABLES),
                                       ("AsyncPostgresSaver", "lgpg", LGPG_TABLES)):
            total = sum([await connection.fetchval(
                f"SELECT pg_total_relation_size('{schema}.{table}')") for table in tables])
            payload = 0
            for table in tables:
                columns = [r["column_name"] for r in await connection.fetch(
                    "SELECT column_name FROM information_schema.columns WHERE table_schema=$1 "
                    "AND table_name=$2", schema, table)]
                payload += await connection.fetchval(
                    f"SELECT coalesce(sum({' + '.join(f'coalesce(pg_column_size({c}), 0)' for c in columns)}), 0) "
                    f"FROM {schema}.{table}")
            rows = {table: await connection.fetchval(f"SELECT count(*) FROM {schema}.{table}")
                    for table in tables}
            out[system] = {"total": total, "payload": payload, **rows}
            out[system]["tables_kib"] = {table: round(await connection.fetchval(
                f"SELECT pg_total_relation_size('{schema}.{table}')") / 1024)
                for table in tables}
        out["agentstate"]["events"] = await connection.fetchval(
            "SELECT count(*) FROM events WHERE type LIKE 'checkpoint.%'")
        return out
    finally:
        await connection.close()


async def run(turns: int, url: str, delta: bool, count_turns: int) -> None:
    import asyncpg

    plain = libpq_dsn(url)
    connection = await asyncpg.connect(plain)
    await connection.execute("CREATE SCHEMA lgpg")
    await connection.close()
    lgpg_dsn = plain + "?options=-csearch_path%3Dlgpg"
    with agentstate_server(url, workers=1) as server:
        await compare(turns, server, lgpg_dsn, plain, delta)
    if count_turns:
        await count(count_turns, url, delta)


# The final state's loads: by the saver that ran the chat, and by a new one.
LOADS = {"same": "load final state (aget_state), the chat's saver, median of 5, ms",
         "new": "load final state, a new saver (a new process resuming), median of 5, ms"}


@contextlib.asynccontextmanager
async def new_saver(name: str, base_url: str, lgpg_dsn: str) -> AsyncIterator[Any]:
    if name == "agentstate":
        saver = AgentStateSaver(base_url=base_url)
        try:
            yield saver
        finally:
            await saver.aclose()
            saver.close()
    else:
        async with AsyncPostgresSaver.from_conn_string(lgpg_dsn) as saver:
            yield saver


def counting(saver: AgentStateSaver, base_url: str) -> list[int]:
    """Give `saver` an asyncio client whose requests are counted: [requests so far]."""
    from agentstate_client import AsyncAgentStateClient

    client = AsyncAgentStateClient(base_url)
    sent = [0]
    send = client._send

    async def counted(kwargs: dict[str, Any]) -> Any:
        sent[0] += 1
        return await send(kwargs)

    client._send = counted  # type: ignore[method-assign]
    saver._async_client, saver._owns_async = client, False
    return sent


async def compare(turns: int, server: Server, lgpg_dsn: str, plain_dsn: str,
                  delta: bool) -> None:
    base_url = server.base_url
    ours = AgentStateSaver(base_url=base_url)
    sent = counting(ours, base_url)
    requests: list[int] = []
    latencies: dict[str, list[float]] = {"agentstate": [], "AsyncPostgresSaver": []}
    # CPU of a turn: this process's (the client's: the graph, the saver, and for
    # AsyncPostgresSaver its driver) and agentstate's server's, in clock ticks. Postgres's
    # own is counted for neither.
    client_cpu: dict[str, list[float]] = {"agentstate": [], "AsyncPostgresSaver": []}
    server_ticks: list[int] = []
    text_bytes = 0
    async with AsyncPostgresSaver.from_conn_string(lgpg_dsn) as theirs:
        await theirs.setup()
        timings = {"agentstate": Timings(ours), "AsyncPostgresSaver": Timings(theirs)}
        graphs = {"agentstate": build(ours, 1, delta),
                  "AsyncPostgresSaver": build(theirs, 1, delta)}
        threads = {name: f"chat-{uuid.uuid4()}" for name in graphs}
        rng = random.Random(7)
        for turn in range(1, turns + 1):
            message = text(rng)
            for name, graph in graphs.items():
                config = {"configurable": {"thread_id": threads[name]}}
                before = sent[0]
                ticks = server.cpu_ticks() if name == "agentstate" else 0
                cpu, started = time.process_time(), time.perf_counter()
                result = await graph.ainvoke({"messages": [HumanMessage(content=message)]},
                                             config)
                latencies[name].append((time.perf_counter() - started) * 1000)
                client_cpu[name].append((time.process_time() - cpu) * 1000)
                if name == "agentstate":
                    requests.append(sent[0] - before)
                    server_ticks.append(server.cpu_ticks() - ticks)
                timings[name].next_turn()
                assert len(result["messages"]) == 2 * turn
            text_bytes += len(message.encode()) + len(result["messages"][-1].content.encode())
            if turn % 50 == 0:
                print(f"turn {turn}: " + ", ".join(
                    f"{n} {latencies[n][-1]:.1f} ms" for n in latencies), flush=True)

        for name, timing in timings.items():
            print(f"saver calls per turn, {name}: turns 1-10: {timing.summary(slice(0, 10))}; "
                  f"last 10: {timing.summary(slice(-10, None))}")
        window = min(50, turns)
        tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
        print(f"CPU per turn, last {window} turns (mean ms; Postgres's not counted): "
              f"agentstate client {statistics.mean(client_cpu['agentstate'][-window:]):.1f} + "
              f"server {statistics.mean(server_ticks[-window:]) * tick_ms:.1f}, "
              f"AsyncPostgresSaver client "
              f"{statistics.mean(client_cpu['AsyncPostgresSaver'][-window:]):.1f}")
        print(f"agentstate requests per turn: turns 1-10 {requests[:10]}, last 10 "
              f"{requests[-10:]}, min {min(requests)}, max {max(requests)}, "
              f"mean {statistics.mean(requests):.2f}")
        loads: dict[str, dict[str, list[float]]] = {
            how: {name: [] for name in graphs} for how in LOADS}
        for _ in range(5):
            for name, graph in graphs.items():
                config = {"configurable": {"thread_id": threads[name]}}
                started = time.perf_counter()
                state = await graph.aget_state(config)
                loads["same"][name].append((time.perf_counter() - started) * 1000)
                assert len(state.values["messages"]) == 2 * turns
                # As a new process resuming the chat: a new saver, its client or its
                # connection made on the clock.
                started = time.perf_counter()
                async with new_saver(name, base_url, lgpg_dsn) as fresh:
                    state = await build(fresh, 1, delta).aget_state(config)
                    loads["new"][name].append((time.perf_counter() - started) * 1000)
                assert len(state.values["messages"]) == 2 * turns
    await ours.aclose()
    ours.close()
    stored = await sizes(plain_dsn)
    report(turns, latencies, loads, stored, text_bytes)


async def count(turns: int, url: str, delta: bool) -> None:
    """Statements and round trips per turn, each system through a counting proxy."""
    where = make_url(url)
    host, port = where.host or "127.0.0.1", where.port or 5432
    with WireCounter(host, port) as ours_wire, WireCounter(host, port) as theirs_wire:
        proxied = where.set(host="127.0.0.1", port=ours_wire.port).render_as_string(
            hide_password=False)
        theirs_dsn = (where.set(drivername="postgresql", host="127.0.0.1",
                                port=theirs_wire.port).render_as_string(hide_password=False)
                      + "?options=-csearch_path%3Dlgpg")
        per_turn: dict[str, list[dict[str, int]]] = {"agentstate": [], "AsyncPostgresSaver": []}
        with agentstate_server(proxied, workers=1) as server:
            ours = AgentStateSaver(base_url=server.base_url)
            sent = counting(ours, server.base_url)
            async with AsyncPostgresSaver.from_conn_string(theirs_dsn) as theirs:
                graphs = {"agentstate": (build(ours, 2, delta), ours_wire),
                          "AsyncPostgresSaver": (build(theirs, 2, delta), theirs_wire)}
                threads = {name: f"count-{uuid.uuid4()}" for name in graphs}
                rng = random.Random(8)
                for _ in range(turns):
                    message = text(rng)
                    for name, (graph, wire) in graphs.items():
                        before, requests = wire.counts(), sent[0]
                        await graph.ainvoke({"messages": [HumanMessage(content=message)]},
                                            {"configurable": {"thread_id": threads[name]}})
                        await asyncio.sleep(0.2)  # the feed's pass after the last write
                        after = wire.counts()
                        per_turn[name].append({k: after[k] - before[k] for k in after} | {
                            "requests": sent[0] - requests})
            await ours.aclose()
            ours.close()
    print(f"\nper turn through the counting proxy ({turns} turns; agentstate's requests "
          "counted in its client, the feed's sequencing pass included):")
    print("| | turns 1-10 | last 10 |\n|---|---|---|")
    for name, rows in per_turn.items():
        for key in ("requests", "statements", "round_trips"):
            if name != "agentstate" and key == "requests":
                continue
            print(f"| {name} {key} | " + " | ".join(
                f"{statistics.median(r[key] for r in window)} "
                f"({min(r[key] for r in window)}-{max(r[key] for r in window)})"
                for window in (rows[:10], rows[-10:])) + " |")


def report(turns: int, latencies: dict[str, list[float]],
           loads: dict[str, dict[str, list[float]]],
           stored: dict[str, dict[str, int]], text_bytes: int) -> None:
    first = slice(0, 10)
    last = slice(max(0, turns - 10), turns)
    print(f"\n{turns} turns, {2 * turns} messages, {text_bytes / 1024:.0f} KiB of message text")
    print("\n| | agentstate (HTTP) | AsyncPostgresSaver (in-process) |")
    print("|---|---|---|")
    for label, window in (("invoke, turns 1-10, median ms", first),
                          (f"invoke, turns {last.start + 1}-{turns}, median ms", last)):
        print(f"| {label} | " + " | ".join(
            f"{statistics.median(latencies[n][window]):.1f}" for n in latencies) + " |")
    print(f"| invoke, turn {turns}, ms | " + " | ".join(
        f"{latencies[n][-1]:.1f}" for n in latencies) + " |")
    for how, label in LOADS.items():
        print(f"| {label} | " + " | ".join(
            f"{statistics.median(loads[how][n]):.1f}" for n in latencies) + " |")
    for key, label in (("total", "stored, pg_total_relation_size"),
                       ("payload", "stored, sum of pg_column_size of the rows")):
        print(f"| {label} | " + " | ".join(
            f"{stored[n][key] / 1048576:.2f} MiB ({stored[n][key] / text_bytes:.0f}x text)"
            for n in latencies) + " |")
    print("\nrows and KiB per table:", {
        n: {k: v for k, v in s.items() if k not in ("total", "payload")}
        for n, s in stored.items()})
    print("per turn, agentstate:", [round(x, 1) for x in latencies["agentstate"][first]],
          [round(x, 1) for x in latencies["agentstate"][last]])
    print("per turn, AsyncPostgresSaver:",
          [round(x, 1) for x in latencies["AsyncPostgresSaver"][first]],
          [round(x, 1) for x in latencies["AsyncPostgresSaver"][last]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--delta", action="store_true",
                        help="messages as a DeltaChannel (on both systems)")
    parser.add_argument("--count-turns", type=int, default=20,
                        help="turns of the counted chat (statements per turn); 0: none")
    args = parser.parse_args()
    url = create_postgres_database()
    try:
        migrate(url)
        asyncio.run(run(args.turns, url, args.delta, args.count_turns))
    finally:
        drop_postgres_database(url)


if __name__ == "__main__":
    main()
