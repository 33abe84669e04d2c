"""Server CPU per request: agentstate's get thread, state replace and append against the
floor, a bare FastAPI endpoint doing the get thread's one SELECT through asyncpg
(bench/minimal_app.py), both 1-worker uvicorn servers on the same Postgres database, loaded
in alternating rounds by bench.loadgen (4 connections, a few seconds each).

    .venv/bin/python -m bench.cpu [--rounds 5] [--duration 3] [--connections 4]

CPU is the server's utime+stime (its process tree, from /proc) over the load process's life,
divided by the requests it completed: what a request costs the server, whatever the machine
is doing meanwhile (throughput on a shared machine says more about the neighbours). Prints
the median per target and its ratio to the floor's get thread, and the median of each
round's own ratio (the target over the floor of the same round).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.run import TICKS
from bench.server import (
    ROOT,
    Server,
    agentstate_server,
    create_postgres_database,
    drop_postgres_database,
    libpq_dsn,
    migrate,
    minimal_server,
)

TARGETS = (("agentstate", "get_thread"), ("floor", "get_thread_row"),
           ("agentstate", "state_replace"), ("agentstate", "append_1"))


def cpu_per_request(server: Server, op: str, run_id: str, args: argparse.Namespace) -> float:
    spec = {"base_url": server.base_url, "op": op, "connections": args.connections,
            "duration": args.duration, "warmup": 0.5, "run_id": run_id, "params": {}}
    before = server.cpu_ticks()
    done = subprocess.run([sys.executable, "-m", "bench.loadgen", json.dumps(spec)], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    ticks = server.cpu_ticks() - before
    result = json.loads(done.stdout)
    # The warm-up's requests are not counted in `requests`: add them at the measured rate.
    requests = result["requests"] * (1 + 0.5 / args.duration)
    return ticks / TICKS / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--connections", type=int, default=4)
    args = parser.parse_args()
    url = create_postgres_database()
    run_id = time.strftime("%H%M%S")
    samples: dict[str, list[float]] = {f"{who} {op}": [] for who, op in TARGETS}
    try:
        migrate(url)
        dsn = libpq_dsn(url)
        with agentstate_server(url, 1) as ours, minimal_server(1, dsn) as floor:
            servers = {"agentstate": ours, "floor": floor}
            for round_ in range(args.rounds):
                for who, op in TARGETS:  # the floor reads the threads get_thread made
                    samples[f"{who} {op}"].append(
                        cpu_per_request(servers[who], op, f"{run_id}r{round_}", args))
    finally:
        drop_postgres_database(url)
    floor = samples["floor get_thread_row"]
    base = statistics.median(floor)
    print(f"rounds {args.rounds}, {args.connections} connections, {args.duration} s each")
    print("| target | server CPU per request, us (median; min-max) | ratio to the floor | "
          "the rounds' own ratios (median; min-max) |")
    print("|---|---|---|---|")
    out: dict[str, Any] = {}
    for name, values in samples.items():
        median = statistics.median(values)
        # Each round's value over the floor's of the same round: a neighbour's load that
        # lasts a round moves both, so these swing less than the medians do.
        paired = [value / under for value, under in zip(values, floor, strict=True)]
        out[name] = round(median, 1)
        print(f"| {name} | {median:.0f} ({min(values):.0f}-{max(values):.0f}) | "
              f"{median / base:.2f}x | {statistics.median(paired):.2f}x "
              f"({min(paired):.2f}-{max(paired):.2f}) |")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
