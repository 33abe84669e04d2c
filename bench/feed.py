"""The change feed: one tenant's write throughput with the database 5 ms away, the
previous design against this one in the same run; watch latency and database connections
with many idle watchers.

    python -m bench.feed [--seconds 20] [--writers 32] [--delay-ms 5] [--watchers 1000]

- **Throughput.** Each design runs as a real `agentstate serve` (one worker) on a database of
  its own, reaching Postgres through a TCP proxy that holds every chunk `--delay-ms` in each
  direction (so commit latency, not CPU, is the limit). `--writers` connections replace the
  state of one thread each (`PUT` with `If-Match`), all in the one open-mode tenant, for
  `--seconds`. The previous design is the code before the feed's migration, checked out
  with `git worktree` (`--old-ref` to choose another commit).
- **Watching** (this design only): `--watchers` SSE streams are opened on the tenant; the
  database connections of the server are counted (`pg_stat_activity`) with none and with all
  of them open; then a writer makes `--events` writes one at a time and every watcher's
  delay from the writer's 2xx to the event's arrival is recorded (p50, p99). Commit precedes
  the 2xx by one proxy delay, so commit-to-delivery is that much longer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from bench.http1 import Connection
from bench.ops import dumps, etag_revision, run_state
from bench.server import (
    ROOT,
    Server,
    create_postgres_database,
    drop_postgres_database,
    free_port,
    postgres_facts,
)

MIGRATION = "migrations/versions/2026_11_30_1200-7394f9ae97e4_event_feed.py"


# --- a TCP proxy that adds latency ------------------------------------------------------


class DelayProxy:
    """Forwards 127.0.0.1:<port> to Postgres, delivering each chunk `delay` seconds after it
    arrived, in order, in both directions (a database `2 * delay` away per round trip)."""

    def __init__(self, target_host: str, target_port: int, delay: float) -> None:
        self.target = (target_host, target_port)
        self.delay = delay
        self.port = free_port()
        self.server: asyncio.Server | None = None

    async def start(self) -> DelayProxy:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", self.port)
        return self

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    writer.close()
                    return
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()

        delivering = asyncio.create_task(deliver())
        try:
            while data := await reader.read(65536):
                queue.put_nowait((loop.time() + self.delay, data))
        except ConnectionError:
            pass
        queue.put_nowait((loop.time() + self.delay, b""))
        try:
            await delivering
        except ConnectionError:
            pass

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer),
                             return_exceptions=True)


# --- the two designs --------------------------------------------------------------------


def previous_design(ref: str | None) -> tuple[Path, str]:
    """A worktree of the code before the feed's migration (or `ref`)."""
    if ref is None:
        added = subprocess.run(
            ["git", "log", "--diff-filter=A", "--format=%H", "--", MIGRATION], cwd=ROOT,
            check=True, capture_output=True, text=True).stdout.split()
        if not added:
            raise SystemExit("cannot find the commit that added the feed's migration; "
                             "pass --old-ref")
        ref = f"{added[-1]}^"
    commit = subprocess.run(["git", "rev-parse", ref], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.strip()
    path = Path(tempfile.gettempdir()) / f"agentstate-bench-old-{commit[:10]}"
    if not path.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), commit], cwd=ROOT,
                       check=True, capture_output=True)
    return path, commit


def migrate(tree: Path, database_url: str) -> None:
    subprocess.run([sys.executable, "-m", "app.cli", "migrate"], cwd=tree, check=True,
                   env={**os.environ, "AGENTSTATE_DATABASE_URL": database_url},
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def server_at(tree: Path, database_url: str, name: str, workers: int) -> Server:
    return Server([sys.executable, "-m", "app.cli", "serve", "--port", "{port}",
                   "--workers", str(workers)],
                  {"AGENTSTATE_DATABASE_URL": database_url, "AGENTSTATE_AUTO_MIGRATE": "false",
                   "AGENTSTATE_LOG_LEVEL": "WARNING"}, name, cwd=tree)


def via_proxy(database_url: str, proxy: DelayProxy) -> str:
    return make_url(database_url).set(host="127.0.0.1", port=proxy.port).render_as_string(
        hide_password=False)


# --- throughput -------------------------------------------------------------------------


async def replaces(base_url: str, writers: int, seconds: float, run: str) -> dict[str, Any]:
    """`writers` connections, each replacing its own thread's state for `seconds`."""
    connections = [await Connection(base_url).connect() for _ in range(writers)]
    revisions: list[int] = []
    for i, conn in enumerate(connections):
        status, headers, body = await conn.request(
            "PUT", f"/v1/threads/{run}-{i}", dumps({"state": run_state(0)}),
            {"if-none-match": "*"})
        assert status == 201, body
        revisions.append(etag_revision(headers))
    done = [0] * writers
    latencies: list[float] = []
    stop_at = time.monotonic() + seconds

    async def writer(i: int) -> None:
        conn = connections[i]
        while time.monotonic() < stop_at:
            began = time.perf_counter()
            status, headers, body = await conn.request(
                "PUT", f"/v1/threads/{run}-{i}", dumps({"state": run_state(done[i])}),
                {"if-match": f'"{revisions[i]}"'})
            assert status == 200, body
            latencies.append(time.perf_counter() - began)
            revisions[i] = etag_revision(headers)
            done[i] += 1

    began = time.monotonic()
    await asyncio.gather(*(writer(i) for i in range(writers)))
    elapsed = time.monotonic() - began
    for conn in connections:
        await conn.close()
    latencies.sort()
    return {"replaces_per_s": round(sum(done) / elapsed, 1), "writes": sum(done),
            "p50_ms": round(1000 * latencies[len(latencies) // 2], 1),
            "p99_ms": round(1000 * latencies[int(len(latencies) * 0.99)], 1)}


# --- watching ---------------------------------------------------------------------------


async def open_watcher(port: int, cursor: str, arrivals: dict[str, float],
                       ready: asyncio.Event, count: list[int], total: int) -> None:
    """One SSE stream on a raw socket (httpx per stream would cost the bench's CPU):
    records when each event's resource arrives."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /v1/events/stream HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                 f"last-event-id: {cursor}\r\naccept: text/event-stream\r\n\r\n".encode())
    await reader.readuntil(b"\r\n\r\n")
    loop = asyncio.get_running_loop()
    first = True
    try:
        while line := await reader.readline():
            if first and b"retry:" in line:
                first = False
                count[0] += 1
                if count[0] == total:
                    ready.set()
            start = line.find(b"data: ")
            if start >= 0:
                event = json.loads(line[start + 6:])
                key = event["resource"]
                now = loop.time()
                arrivals.setdefault(key, now)
                samples = arrivals.setdefault("_samples", [])  # type: ignore[arg-type]
                samples.append((key, now))  # type: ignore[attr-defined]
    finally:
        writer.close()


async def connections_of(database_url: str) -> dict[str, int]:
    import asyncpg

    url = make_url(database_url)
    conn = await asyncpg.connect(host="127.0.0.1", port=5432, user=url.username,
                                 password=url.password, database=url.database)
    try:
        rows = await conn.fetch(
            "SELECT application_name, state FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()")
    finally:
        await conn.close()
    return {"total": len(rows),
            "listener": sum(r["application_name"] == "agentstate-listener" for r in rows),
            "active": sum(r["state"] not in ("idle", None) for r in rows)}


async def watching(base_url: str, database_url: str, watchers: int, events: int,
                   run: str) -> dict[str, Any]:
    port = int(base_url.rsplit(":", 1)[1])
    conn = await Connection(base_url).connect()
    cursor = ""
    while True:
        status, _, body = await conn.request(
            "GET", "/v1/events?limit=100" + (f"&cursor={cursor}" if cursor else ""))
        page = json.loads(body)
        cursor = page["next_cursor"]
        if not page["has_more"]:
            break
    idle_before = await connections_of(database_url)
    samples: dict[str, Any] = {}
    ready, count = asyncio.Event(), [0]
    tasks = [asyncio.create_task(open_watcher(port, cursor, samples, ready, count, watchers))
             for _ in range(watchers)]
    await asyncio.wait_for(ready.wait(), 300)
    await asyncio.sleep(2)  # let every stream settle into its wait
    idle_with = await connections_of(database_url)
    acked: dict[str, float] = {}
    loop = asyncio.get_running_loop()
    for i in range(events):
        resource = f"/v1/threads/{run}-w{i}"
        status, _, body = await conn.request("PUT", resource, dumps({"state": {"i": i}}),
                                             {"if-none-match": "*"})
        assert status == 201, body
        acked[resource] = loop.time()
        deadline = loop.time() + 30
        while (sum(1 for key, _ in samples.get("_samples", []) if key == resource) < watchers
               and loop.time() < deadline):
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)
    delays = sorted(1000 * (at - acked[key]) for key, at in samples.get("_samples", [])
                    if key in acked)
    delivered = len(delays)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await conn.close()
    return {
        "watchers": watchers, "events": events,
        "deliveries": delivered, "expected_deliveries": watchers * events,
        "latency_from_2xx_ms": {"p50": round(statistics.median(delays), 1),
                                "p99": round(delays[int(len(delays) * 0.99)], 1),
                                "max": round(delays[-1], 1)} if delays else None,
        "db_connections_no_watchers": idle_before,
        "db_connections_with_watchers": idle_with,
    }


# --- the run ----------------------------------------------------------------------------


async def measure(name: str, tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    database_url = await asyncio.to_thread(create_postgres_database)
    proxy = await DelayProxy("127.0.0.1", 5432, args.delay_ms / 1000).start()
    try:
        await asyncio.to_thread(migrate, tree, database_url)
        server = server_at(tree, via_proxy(database_url, proxy), f"feed-{name}",
                           args.workers)
        await asyncio.to_thread(server.start)
        try:
            result: dict[str, Any] = {"design": name}
            ticks, own = server.cpu_ticks(), time.process_time()
            result["throughput"] = await replaces(server.base_url, args.writers, args.seconds,
                                                  uuid.uuid4().hex[:8])
            writes = result["throughput"]["writes"]
            # CPU per write: the server's, and this process's (client and proxy).
            result["throughput"]["server_cpu_ms_per_write"] = round(
                1000 * (server.cpu_ticks() - ticks) / os.sysconf("SC_CLK_TCK") / writes, 2)
            result["throughput"]["bench_cpu_ms_per_write"] = round(
                1000 * (time.process_time() - own) / writes, 2)
            if name == "new" and args.watchers:
                result["watching"] = await watching(server.base_url, database_url,
                                                    args.watchers, args.events,
                                                    uuid.uuid4().hex[:8])
            return result
        finally:
            await asyncio.to_thread(server.stop)
    finally:
        await proxy.stop()
        await asyncio.to_thread(drop_postgres_database, database_url)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    old_tree, old_commit = previous_design(args.old_ref)
    new_commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, check=True,
                                capture_output=True, text=True).stdout.strip()
    report: dict[str, Any] = {
        "bench": "feed", "delay_ms_each_way": args.delay_ms, "writers": args.writers,
        "workers": args.workers,
        "seconds": args.seconds, "old_commit": old_commit, "new_commit": new_commit,
        "postgres": await asyncio.to_thread(postgres_facts), "cpus": os.cpu_count(),
    }
    old = await measure("old", old_tree, args)
    new = await measure("new", ROOT, args)
    report["old"], report["new"] = old, new
    report["speedup"] = round(new["throughput"]["replaces_per_s"]
                              / old["throughput"]["replaces_per_s"], 2)
    if args.remove_worktree:
        subprocess.run(["git", "worktree", "remove", "--force", str(old_tree)], cwd=ROOT,
                       check=False, capture_output=True)
        shutil.rmtree(old_tree, ignore_errors=True)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--writers", type=int, default=32)
    parser.add_argument("--workers", type=int, default=1,
                        help="uvicorn workers of each server (both designs get the same)")
    parser.add_argument("--delay-ms", type=float, default=5.0)
    parser.add_argument("--watchers", type=int, default=1000)
    parser.add_argument("--events", type=int, default=20)
    parser.add_argument("--old-ref", default=None)
    parser.add_argument("--remove-worktree", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    report = asyncio.run(main_async(args))
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
