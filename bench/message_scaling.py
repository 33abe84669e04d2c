"""Does appending and reading a page stay flat as a thread grows? (API.md section 4)

Starts a real `agentstate serve` on a fresh database, fills one thread per size to 10,
1,000 and 100,000 messages with batch appends, then measures over HTTP, one request at a time:

- append: POST one message of about 300 characters (the thread grows by the samples taken);
- newest page: GET ?order=desc&limit=100, what an agent loads before a turn;
- middle page: GET ?after_seq=<size/2>&limit=100, a keyset page deep in the history.

Prints a markdown table of median and p99 per size, in milliseconds.

    .venv/bin/python bench/message_scaling.py --backend sqlite
    .venv/bin/python bench/message_scaling.py --backend postgres  # local server, trust auth
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
POSTGRES_ADMIN = os.environ.get("AGENTSTATE_BENCH_POSTGRES_URL",
                                "postgresql://postgres@127.0.0.1:5432/postgres")
TEXT = ("The risk manager reviewed the position and found the exposure acceptable, but asked "
        "for a tighter stop; the technical analyst agreed and noted the RSI divergence on the "
        "hourly chart, while the portfolio manager wanted the sizing capped at five percent "
        "of the book until earnings are out next week, pending review.")


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _admin(sql: str) -> None:
    import asyncpg

    connection = await asyncpg.connect(POSTGRES_ADMIN)
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


def database(backend: str, workdir: Path) -> tuple[str, str | None]:
    """A fresh, migrated database: (url, postgres database name to drop afterwards)."""
    if backend == "sqlite":
        return f"sqlite:///{workdir / 'bench.db'}", None
    name = f"agentstate_bench_{uuid.uuid4().hex[:8]}"
    asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
    return POSTGRES_ADMIN.rsplit("/", 1)[0] + f"/{name}", name


def start_server(url: str, workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    env = {**os.environ, "AGENTSTATE_DATABASE_URL": url, "AGENTSTATE_LOG_LEVEL": "WARNING"}
    subprocess.run([sys.executable, "-m", "app.cli", "migrate"], cwd=ROOT, env=env, check=True,
                   capture_output=True)
    port = free_port()
    log = (workdir / "server.log").open("wb")
    server = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", str(port)],
                              cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return server, base
        except httpx.TransportError:
            time.sleep(0.1)
    server.terminate()
    raise SystemExit("server did not start: " + (workdir / "server.log").read_text()[-2000:])


def fill(client: httpx.Client, thread: str, size: int) -> None:
    done = 0
    while done < size:
        batch = min(100, size - done)
        messages = [{"role": "user" if (done + i) % 2 else "assistant", "content": TEXT}
                    for i in range(batch)]
        response = client.post(f"/v1/threads/{thread}/messages", json={"messages": messages})
        response.raise_for_status()
        done += batch


def timed(client: httpx.Client, method: str, url: str, samples: int,
          **kwargs: object) -> list[float]:
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        response = client.request(method, url, **kwargs)  # type: ignore[arg-type]
        elapsed = time.perf_counter() - started
        response.raise_for_status()
        times.append(elapsed * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--sizes", default="10,1000,100000")
    parser.add_argument("--samples", type=int, default=300)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    with tempfile.TemporaryDirectory(prefix="agentstate-bench-") as tmp:
        workdir = Path(tmp)
        url, pg_name = database(args.backend, workdir)
        server, base = start_server(url, workdir)
        rows = []
        try:
            with httpx.Client(base_url=base, timeout=120) as client:
                for size in sizes:
                    thread = f"bench-{size}-{uuid.uuid4().hex[:6]}"
                    started = time.perf_counter()
                    fill(client, thread, size)
                    fill_s = time.perf_counter() - started
                    messages = f"/v1/threads/{thread}/messages"
                    timed(client, "GET", messages, 20)  # warm connections and caches
                    newest = timed(client, "GET", messages, args.samples,
                                   params={"order": "desc", "limit": 100})
                    middle = timed(client, "GET", messages, args.samples,
                                   params={"after_seq": size // 2, "limit": 100})
                    append = timed(client, "POST", messages, args.samples,
                                   json={"role": "user", "content": TEXT, "agent_name": "bench"})
                    rows.append((size, append, newest, middle, fill_s))
                    print(f"  {size} messages: filled in {fill_s:.1f} s", file=sys.stderr)
        finally:
            server.terminate()
            server.wait(timeout=30)
            if pg_name:
                asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)'))

    print(f"\n{args.backend}, {args.samples} sequential requests per cell over HTTP, ms "
          "(median / p99)\n")
    print("| messages in thread | append 1 message | newest page (100) | middle page (100) |")
    print("|---:|---:|---:|---:|")
    for size, *series, _fill in rows:
        cells = [f"{statistics.median(s):.2f} / {percentile(s, 0.99):.2f}" for s in series]
        print(f"| {size:,} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
