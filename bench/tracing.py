"""What tracing costs the server: CPU per request of a real `agentstate serve` (one worker) with
tracing off, against the code before tracing existed (`--old-ref`) and with it on, in one run.

    .venv/bin/python -m bench.tracing [--backend postgres] [--requests 6000] [--block 200]
                                      [--connections 4] [--old-ref REF]

Three servers on one database: `before` (the tree at `--old-ref`, default the parent of the
commit that gave app/db/direct.py its DirectContext, the first of the tracing change, taken
with `git archive`), `off` (this tree, no `OTEL_*` variable) and `on` (this tree,
`OTEL_TRACES_EXPORTER=otlp_proto_http` exporting to a sink in this process that answers every
export 200 and counts its bytes, so the SDK's batching, encoding and sending are paid as
against a collector). For each operation the three take turns, `--block` requests each, the
order rotating, until each has served `--requests` over `--connections` keep-alive
connections, the server's CPU ticks (/proc/<pid>/stat, utime+stime) read around each block:
so the machine's drifting load falls on all three alike. Reported: microseconds of server
CPU per request, off/before and on/before, and the quartiles of the blocks' ratios (their
spread is the noise).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.http1 import Connection
from bench.ops import OPS
from bench.server import (
    ROOT,
    Server,
    create_postgres_database,
    drop_postgres_database,
    migrate,
)

TICKS = os.sysconf("SC_CLK_TCK")
OP_NAMES = ("state_replace", "append_1", "get_thread")
VARIANTS = ("before", "off", "on")


def first_commit_of_the_change() -> str:
    """The commit that introduced `DirectContext` (the first of the tracing change)."""
    found = subprocess.run(
        ["git", "log", "--format=%H", "-S", "class DirectContext", "--", "app/db/direct.py"],
        cwd=ROOT, check=True, capture_output=True, text=True).stdout.split()
    if not found:
        raise SystemExit("cannot find the commit that added DirectContext; pass --old-ref")
    return found[-1]


def tree_at(ref: str) -> tuple[Path, str]:
    """The source tree at `ref`, extracted with `git archive` (nothing in the repository
    changes), under the temporary directory."""
    commit = subprocess.run(["git", "rev-parse", ref], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.strip()
    path = Path(tempfile.gettempdir()) / f"agentstate-bench-tree-{commit[:10]}"
    if not (path / "app").exists():
        archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=ROOT,
                                 check=True, capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(path, filter="data")
    return path, commit


class Sink(ThreadingHTTPServer):
    """An OTLP/HTTP endpoint that accepts every export: 200 and an empty protobuf answer."""

    exports = 0
    received = 0

    def __init__(self) -> None:
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                sink.exports += 1
                sink.received += len(body)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1/traces"


def server(tree: Path, database_url: str, name: str, env: dict[str, str]) -> Server:
    # Connections stay open while the other two servers take their turns.
    process = Server([sys.executable, "-m", "app.cli", "serve", "--port", "{port}",
                      "--keep-alive", "600"],
                     {"AGENTSTATE_DATABASE_URL": database_url, "AGENTSTATE_AUTO_MIGRATE": "false",
                      "AGENTSTATE_LOG_LEVEL": "WARNING", **env}, f"tracing-{name}", cwd=tree)
    process.env = {k: v for k, v in process.env.items()
                   if not k.startswith("OTEL_") or k in env}
    return process


class Load:
    """Keep-alive connections to one server, each on a thread of its own, set up and warm."""

    def __init__(self, target: Server, op_name: str, connections: int) -> None:
        self.target = target
        self.op = OPS[op_name](uuid.uuid4().hex[:8], {})
        self.count = connections
        self.conns: list[Connection] = []
        self.slots: list[Any] = []

    async def open(self) -> Load:
        self.conns = [await Connection(self.target.base_url).connect()
                      for _ in range(self.count)]
        self.slots = [await self.op.setup(conn, i) for i, conn in enumerate(self.conns)]
        await self.run(200)
        return self

    async def run(self, requests: int) -> None:
        async def work(conn: Connection, slot: Any) -> None:
            for _ in range(requests // self.count):
                method, path, body, headers = self.op.build(slot)
                status, response_headers, payload = await conn.request(method, path, body,
                                                                       headers)
                if status not in self.op.expect:
                    raise RuntimeError(f"{method} {path} -> {status} {payload[:200]!r}")
                self.op.done(slot, response_headers)

        await asyncio.gather(*(work(c, s) for c, s in zip(self.conns, self.slots)))

    async def ticks_for(self, requests: int) -> int:
        """The server's CPU ticks for `requests` requests."""
        before = self.target.cpu_ticks()
        await self.run(requests)
        return self.target.cpu_ticks() - before

    async def close(self) -> None:
        for conn in self.conns:
            await conn.close()


async def measure(servers: dict[str, Server], op_name: str, args: argparse.Namespace
                  ) -> dict[str, Any]:
    """Blocks of `--block` requests on each server in turn, the order rotating each block,
    until each has served `--requests`: drift of the machine's load falls on all three."""
    loads = {v: await Load(servers[v], op_name, args.connections).open() for v in VARIANTS}
    ticks = {v: 0 for v in VARIANTS}
    ratios: dict[str, list[float]] = {"off": [], "on": []}
    try:
        blocks = max(1, args.requests // args.block)
        for index in range(blocks):
            order = VARIANTS[index % 3:] + VARIANTS[:index % 3]
            block = {v: await loads[v].ticks_for(args.block) for v in order}
            for v in VARIANTS:
                ticks[v] += block[v]
            for v in ("off", "on"):
                ratios[v].append(block[v] / max(1, block["before"]))
    finally:
        for load in loads.values():
            await load.close()
    served = blocks * (args.block // args.connections) * args.connections
    us = {v: ticks[v] / TICKS / served * 1e6 for v in VARIANTS}
    return {"requests_each": served, "us_per_request": us,
            "off/before": us["off"] / us["before"], "on/before": us["on"] / us["before"],
            "block_ratio_quartiles": {v: [round(q, 3) for q in statistics.quantiles(r, n=4)]
                                      for v, r in ratios.items() if len(r) >= 2}}


def sqlite_url() -> str:
    return f"sqlite+aiosqlite:///{tempfile.mkdtemp(prefix='agentstate-bench-')}/state.db"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--requests", type=int, default=6000,
                        help="requests each server serves per operation")
    parser.add_argument("--block", type=int, default=200,
                        help="requests a server serves before the next one's turn")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--old-ref", default=None)
    parser.add_argument("--ops", default=",".join(OP_NAMES))
    args = parser.parse_args()
    old_tree, old_commit = tree_at(args.old_ref or f"{first_commit_of_the_change()}^")
    database_url = create_postgres_database() if args.backend == "postgres" else sqlite_url()
    sink = Sink()
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    servers: dict[str, Server] = {}
    try:
        migrate(database_url)
        servers = {
            "before": server(old_tree, database_url, "before", {}),
            "off": server(ROOT, database_url, "off", {}),
            "on": server(ROOT, database_url, "on", {
                "OTEL_TRACES_EXPORTER": "otlp_proto_http",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": sink.url}),
        }
        for process in servers.values():
            process.start()
        results = {}
        for op_name in [o for o in args.ops.split(",") if o]:
            results[op_name] = asyncio.run(measure(servers, op_name, args))
            print(f"[bench {time.strftime('%H:%M:%S')}] {op_name}: {results[op_name]}",
                  file=sys.stderr, flush=True)
    finally:
        for process in servers.values():
            process.stop()
        sink.shutdown()
        if args.backend == "postgres":
            drop_postgres_database(database_url)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()
    report: dict[str, Any] = {
        "bench": "tracing", "backend": args.backend, "requests": args.requests,
        "block": args.block, "connections": args.connections, "before_commit": old_commit,
        "commit": head, "exports": sink.exports, "exported_bytes": sink.received,
        "results": results, "loadavg": os.getloadavg(),
    }
    print(json.dumps(report, indent=2))
    print("\n| operation | before (us CPU/request) | off | on | off/before | on/before |")
    print("| --- | --- | --- | --- | --- | --- |")
    for op_name, result in results.items():
        us = result["us_per_request"]
        print(f"| {op_name} | {us['before']:.0f} | {us['off']:.0f} | {us['on']:.0f} "
              f"| {result['off/before']:.3f} | {result['on/before']:.3f} |")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers on the way out
    main()
