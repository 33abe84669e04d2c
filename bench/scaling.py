"""Many instances through PgBouncer: write throughput and the feed's delivery
latency, every configuration measured in the same run, alternating, as ratios.

    python -m bench.scaling [--seconds 10] [--connections 16] [--rounds 2] [--events 40]

- **Throughput.** State replaces (`PUT` with `If-Match`) and appends (`POST .../messages`),
  `--connections` keep-alive connections of bench/loadgen.py for `--seconds` each, through
  HAProxy 2.6 in every configuration: 1 instance straight to Postgres (the baseline), 1
  instance straight to Postgres with the pooler settings (no statement cache, reads in
  transactions: their cost alone), and 1, 2 and 4 instances through PgBouncer 1.18 in
  transaction pooling. The configurations
  alternate within each of `--rounds`; each ratio is against the baseline of its own round.
  The Postgres backends of the database are sampled while the load runs (the most seen).
- **Feed latency.** Two instances through PgBouncer; a writer on one makes `--events` writes
  one at a time (a random 0.1-0.6 s apart) and a long poll on the other receives each; the
  delay from the writer's 2xx to the watcher's answer, with the feed's LISTEN on the direct
  URL and without it (the poll, every `AGENTSTATE_EVENTS_POLL_SECONDS`, default 0.5 s).

The PgBouncer and HAProxy launchers are the tests' own (tests/components.py), so the bench
runs the same configurations the tests check.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import threading
import time
from contextlib import ExitStack
from typing import Any, Self

import httpx

from bench.run import run_json_process
from bench.server import (
    Server,
    create_postgres_database,
    drop_postgres_database,
    migrate,
    postgres_facts,
)
from tests.components import HAProxy, PgBouncer
from tests.support import pg_connect


def instance(url: str, env: dict[str, str], name: str) -> Server:
    import sys

    return Server([sys.executable, "-m", "app.cli", "serve", "--port", "{port}"],
                  {"AGENTSTATE_DATABASE_URL": url, "AGENTSTATE_AUTO_MIGRATE": "false",
                   "AGENTSTATE_LOG_LEVEL": "WARNING", **env}, name)


class Backends:
    """The most Postgres backends of one database seen while it runs."""

    def __init__(self, database_url: str) -> None:
        self.url, self.peak = database_url, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._sample()), daemon=True)

    async def _sample(self) -> None:
        connection = await pg_connect(self.url)
        try:
            while not self._stop.is_set():
                count = await connection.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND pid <> pg_backend_pid()")
                self.peak = max(self.peak, int(count))
                await asyncio.sleep(0.25)
        finally:
            await connection.close()

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def throughput(args: argparse.Namespace, database: str) -> list[dict[str, Any]]:
    # "pooled-direct": the pooler settings (no statement cache, reads in transactions,
    # SET LOCAL) straight to Postgres: what they cost, without PgBouncer's own hop.
    configs = [("direct", 1), ("pooled-direct", 1), ("pgbouncer", 1), ("pgbouncer", 2),
               ("pgbouncer", 4)]
    rows: list[dict[str, Any]] = []
    with PgBouncer() as pooler:
        for round_ in range(args.rounds):
            for mode, count in configs:
                url = pooler.url(database) if mode == "pgbouncer" else database
                env = {"AGENTSTATE_DATABASE_POOLER": "none" if mode == "direct"
                       else "transaction", "AGENTSTATE_DIRECT_DATABASE_URL": database}
                with ExitStack() as stack:
                    servers = [stack.enter_context(instance(url, env, f"{mode}{count}-{i}"))
                               for i in range(count)]
                    balancer = stack.enter_context(HAProxy([s.port for s in servers]))
                    time.sleep(2.5)  # two health checks: every instance up
                    for op in ("state_replace", "append_1"):
                        spec = {"base_url": balancer.base_url, "op": op,
                                "connections": args.connections, "duration": args.seconds,
                                "warmup": 1.0, "run_id": f"r{round_}{mode}{count}{op}"}
                        with Backends(database) as backends:
                            result = run_json_process("bench.loadgen", spec, None)
                        row = {"round": round_, "mode": mode, "instances": count, "op": op,
                               "throughput": result.get("throughput"),
                               "p50_ms": result.get("p50_ms"), "p99_ms": result.get("p99_ms"),
                               "errors": result.get("errors", result.get("failed")),
                               "postgres_backends": backends.peak}
                        print(json.dumps(row), flush=True)
                        rows.append(row)
    for row in rows:
        base = next(r for r in rows if r["round"] == row["round"] and r["op"] == row["op"]
                    and r["mode"] == "direct")
        row["vs_direct_1"] = (round(row["throughput"] / base["throughput"], 2)
                              if row["throughput"] and base["throughput"] else None)
    return rows


async def feed_latency(database: str, pooled: str, listen: bool, events: int) -> dict[str, Any]:
    env = {"AGENTSTATE_DATABASE_POOLER": "transaction"}
    if listen:
        env["AGENTSTATE_DIRECT_DATABASE_URL"] = database
    tag = f"lat{random.randrange(1 << 30)}"
    delays: list[float] = []
    with instance(pooled, env, "writer") as writer, instance(pooled, env, "watcher") as watcher:
        async with httpx.AsyncClient(timeout=60) as client:
            prefix = f"/v1/threads/{tag}-"
            cursor = (await client.get(f"{watcher.base_url}/v1/events", params={
                "resource_prefix": prefix})).json()["next_cursor"]
            for n in range(events):
                async def watch(cursor: str = cursor) -> tuple[float, dict[str, Any]]:
                    page = await client.get(f"{watcher.base_url}/v1/events", params={
                        "resource_prefix": prefix, "cursor": cursor, "wait": 30})
                    return time.perf_counter(), page.json()

                waiting = asyncio.create_task(watch())
                await asyncio.sleep(random.uniform(0.1, 0.6))
                put = await client.put(f"{writer.base_url}/v1/threads/{tag}-{n}",
                                       json={"state": {}})
                acknowledged = time.perf_counter()
                assert put.status_code == 201, put.text
                received, body = await waiting
                assert body["data"], body
                delays.append(received - acknowledged)
                cursor = body["next_cursor"]
    delays.sort()
    return {"wake": "LISTEN (direct URL)" if listen else "poll (no direct URL)",
            "events": events, "p50_ms": round(statistics.median(delays) * 1000, 1),
            "p99_ms": round(delays[min(len(delays) - 1, int(len(delays) * 0.99))] * 1000, 1),
            "max_ms": round(delays[-1] * 1000, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--events", type=int, default=40)
    parser.add_argument("--skip-throughput", action="store_true")
    args = parser.parse_args()
    print(json.dumps({"postgres": postgres_facts()}), flush=True)
    database = create_postgres_database()
    try:
        migrate(database)
        rows = [] if args.skip_throughput else throughput(args, database)
        with PgBouncer() as pooler:
            latency = []
            for listen in (True, False, True, False):  # alternating
                result = asyncio.run(feed_latency(database, pooler.url(database), listen,
                                                  args.events // 2))
                print(json.dumps(result), flush=True)
                latency.append(result)
        print(json.dumps({"throughput": rows, "feed_latency": latency}, indent=1))
    finally:
        drop_postgres_database(database)


if __name__ == "__main__":
    main()
