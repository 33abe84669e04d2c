"""Benchmarks: agentstate the way a user feels it, each figure beside a baseline measured in
the same run (these machines are noisy: the ratios are the result, not the absolute times).

    .venv/bin/python bench/run.py [--quick] [--backend sqlite,postgres] [--workers 1,2]
                                  [--connections 16] [--duration S]

Prints markdown tables and writes them, with every raw figure, to bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import report
from bench.conversation import conversation, scaling
from bench.ops import SERVER_OPS
from bench.server import (
    ROOT,
    Server,
    agentstate_server,
    create_postgres_database,
    drop_postgres_database,
    libpq_dsn,
    migrate,
    minimal_server,
    postgres_facts,
)
from bench.sqlbaseline import OPS as SQL_OPS

TICKS = os.sysconf("SC_CLK_TCK")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="seconds, not minutes: tiny durations and sizes (proves the harness)")
    parser.add_argument("--backend", default="sqlite,postgres")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--duration", type=float, help="seconds per measurement (default 5)")
    parser.add_argument("--ops", default=",".join(SERVER_OPS), help="operations to load")
    parser.add_argument("--turns", type=int, help="conversation length (default 400)")
    parser.add_argument("--sizes", help="thread lengths for scaling (default 10,1000,100000)")
    parser.add_argument("--skip", default="", help="parts to skip: load,sql,scaling,chat")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    args.duration = args.duration or (0.5 if args.quick else 5.0)
    args.warmup = min(1.0, args.duration / 5)
    args.turns = args.turns or (12 if args.quick else 400)
    args.sizes = [int(s) for s in (args.sizes or ("10,100,300" if args.quick else
                                                  "10,1000,100000")).split(",")]
    args.rounds = 4 if args.quick else 200
    args.chats = 1 if args.quick else 3
    args.compactions = 2 if args.quick else 40
    args.backends = [b for b in args.backend.split(",") if b]
    args.worker_counts = [int(w) for w in args.workers.split(",") if w]
    args.op_names = [o for o in args.ops.split(",") if o]
    args.skips = set(args.skip.split(","))
    return args


def machine_facts() -> dict[str, Any]:
    def sh(command: str) -> str:
        done = subprocess.run(command, shell=True, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    facts: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "nproc": sh("nproc"), "memory": sh("free -h | awk '/Mem:/ {print $2}'"),
        "cpu": sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip(),
        "python": platform.python_version(), "loadavg": os.getloadavg(),
        "commit": sh(f"git -C {ROOT} rev-parse --short HEAD"),
    }
    try:
        facts["postgres"] = postgres_facts()
    except OSError as exc:
        facts["postgres"] = {"error": str(exc)}
    return facts


def run_json_process(module: str, spec: dict[str, Any], server: Server | None
                     ) -> dict[str, Any]:
    """Run a load process; sample the server's RSS (peak) and CPU while it runs."""
    process = subprocess.Popen([sys.executable, "-m", module, json.dumps(spec)], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    ticks_before, started = (server.cpu_ticks() if server else 0), time.perf_counter()
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.wait(0.2):
            peak = max(peak, server.rss())

    sampler = threading.Thread(target=sample, daemon=True) if server else None
    if sampler:
        sampler.start()
    out, err = process.communicate()
    stop.set()
    if sampler:
        sampler.join()
    if process.returncode != 0:
        return {"failed": (err.strip().splitlines() or ["?"])[-1][:300]}
    result = json.loads(out)
    if server:
        wall = time.perf_counter() - started
        result["server_rss_mb"] = round(max(peak, server.rss()) / 2**20, 1)
        # Over the whole process (setup included): a rough share of cores the server used.
        result["server_cpu"] = round((server.cpu_ticks() - ticks_before) / TICKS / wall, 2)
    return result


def load(args: argparse.Namespace, server: Server, op: str, run_id: str) -> dict[str, Any]:
    spec = {"base_url": server.base_url, "op": op, "connections": args.connections,
            "duration": args.duration, "warmup": args.warmup, "run_id": run_id,
            "params": {"compactions_per_connection": args.compactions}}
    return run_json_process("bench.loadgen", spec, server)


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_backend(args: argparse.Namespace, backend: str, results: dict[str, Any],
                run_id: str) -> None:
    tmp = tempfile.mkdtemp(prefix="agentstate-bench-")
    url = (f"sqlite+aiosqlite:///{tmp}/state.db" if backend == "sqlite"
           else create_postgres_database())
    try:
        migrate(url)
        if "load" not in args.skips:
            for workers in args.worker_counts:
                with agentstate_server(url, workers) as server:
                    for op in args.op_names:
                        log(f"{backend} {workers}w {op}")
                        results["load"].append({"target": "agentstate", "backend": backend,
                                                "workers": workers, "op": op,
                                                **load(args, server, op, f"{run_id}{workers}")})
        if backend == "postgres" and "sql" not in args.skips:
            dsn = libpq_dsn(url)
            floor = "get_thread" in args.op_names and 1 in args.worker_counts
            if floor and "load" not in args.skips:
                log("FastAPI + asyncpg floor for get thread")
                with minimal_server(1, dsn) as server:  # the 1-worker get_thread run's threads
                    results["load"].append({"target": "fastapi+asyncpg", "backend": backend,
                                            "workers": 1, "op": "get_thread",
                                            **load(args, server, "get_thread_row", f"{run_id}1")})
            for op in SQL_OPS:
                log(f"asyncpg baseline {op}")
                spec = {"dsn": dsn, "op": op, "connections": args.connections,
                        "duration": args.duration, "warmup": args.warmup, "run_id": run_id}
                results["load"].append({"target": "asyncpg", "backend": backend, "workers": 0,
                                        "op": op, **run_json_process("bench.sqlbaseline", spec,
                                                                     None)})
        if {"scaling", "chat"} - args.skips:
            with agentstate_server(url, 1) as server:
                if "scaling" not in args.skips:
                    log(f"{backend} scaling {args.sizes}")
                    results["scaling"][backend] = _guard(scaling(server.base_url, run_id,
                                                                 args.sizes, args.rounds))
                if "chat" not in args.skips:
                    log(f"{backend} conversation of {args.turns} turns")
                    dsn = libpq_dsn(url) if backend == "postgres" else None
                    results["conversation"][backend] = _guard(
                        conversation(server.base_url, dsn, run_id, args.turns, args.chats))
    finally:
        if backend == "postgres":
            drop_postgres_database(url)
        shutil.rmtree(tmp, ignore_errors=True)


def _guard(coroutine: Any) -> dict[str, Any]:
    """A part that fails (an endpoint this build lacks) is reported, not fatal."""
    try:
        return asyncio.run(coroutine)
    except Exception as exc:  # noqa: BLE001 - the report shows what failed
        return {"failed": f"{type(exc).__name__}: {str(exc)[:300]}"}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run_id = time.strftime("%H%M%S") + os.urandom(2).hex()
    results: dict[str, Any] = {
        "command": " ".join([".venv/bin/python", "bench/run.py", *(argv or sys.argv[1:])]),
        "machine": machine_facts(), "connections": args.connections,
        "duration": args.duration, "load": [], "scaling": {}, "conversation": {},
    }
    if "load" not in args.skips:
        for workers in args.worker_counts:
            log(f"FastAPI minimal baseline {workers}w")
            with minimal_server(workers) as server:
                results["load"].append({"target": "fastapi", "backend": "-", "workers": workers,
                                        "op": "hello", **load(args, server, "hello", run_id)})
    for backend in args.backends:
        run_backend(args, backend, results, run_id)
    results["machine"]["loadavg_after"] = os.getloadavg()
    markdown = report.render(results)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"bench-{time.strftime('%Y%m%d-%H%M%S')}"
    stem.with_suffix(".json").write_text(json.dumps(results, indent=2))
    stem.with_suffix(".md").write_text(markdown)
    print(markdown)
    print(f"\nJSON: {stem.with_suffix('.json')}\nmarkdown: {stem.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
