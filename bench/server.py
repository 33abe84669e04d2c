"""Launching servers under test and the databases they use (the approach of
tests/support.ServerProcess, without importing the test package)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
ADMIN_URL = os.environ.get("AGENTSTATE_BENCH_POSTGRES_URL",
                           "postgresql://postgres@127.0.0.1:5432/postgres")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (uvicorn's workers are children of the supervisor)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    return tree


def rss_bytes(pid: int) -> int:
    """Resident memory of `pid` and its children, from /proc/<pid>/status VmRSS."""
    total = 0
    for member in process_tree(pid):
        try:
            for line in Path(f"/proc/{member}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def cpu_ticks(pid: int) -> int:
    """utime+stime clock ticks of `pid` and its children, for the server's CPU share."""
    total = 0
    for member in process_tree(pid):
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total


class Server:
    """A process that serves HTTP on a free loopback port until stopped."""

    def __init__(self, command: list[str], env: dict[str, str], name: str,
                 cwd: Path = ROOT) -> None:
        self.cwd = cwd  # the source tree whose `app` runs (bench/feed.py runs an older one)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.command = [arg.replace("{port}", str(self.port)) for arg in command]
        self.env = {**os.environ, **env}
        self.log_path = (Path(os.environ.get("TMPDIR", "/tmp"))
                         / f"agentstate-bench-{name}-{self.port}.log")
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> Server:
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(self.command, cwd=self.cwd, env=self.env, stdout=self._log,
                                        stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited: {self.log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.base_url}/healthz", timeout=1) as response:
                    if response.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server did not start: {self.log_path.read_text()[-2000:]}")

    def rss(self) -> int:
        assert self.process is not None
        return rss_bytes(self.process.pid)

    def cpu_ticks(self) -> int:
        assert self.process is not None
        return cpu_ticks(self.process.pid)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if hasattr(self, "_log"):
            self._log.close()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def agentstate_server(database_url: str, workers: int) -> Server:
    return Server(
        [sys.executable, "-m", "app.cli", "serve", "--port", "{port}", "--workers", str(workers)],
        {"AGENTSTATE_DATABASE_URL": database_url, "AGENTSTATE_AUTO_MIGRATE": "false",
         "AGENTSTATE_LOG_LEVEL": "WARNING"},
        f"agentstate-{workers}w",
    )


FLOOR = "floor: bare FastAPI + asyncpg GET, one SELECT"


@contextlib.asynccontextmanager
async def floor_reader(agentstate_url: str,
                       floor_url: str) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """The floor of any read over HTTP on this stack: a GET of the bare endpoint of
    bench/minimal_app.py (`minimal_server` with a dsn: one SELECT of a thread row, the
    thread `floor` made here through the agentstate server at `agentstate_url`) sent as the
    async client sends its own requests (its lean transport's `send`), the JSON parsed.
    Warmed by 20 reads."""
    import httpx
    from agentstate_client import AsyncAgentStateClient
    from agentstate_client._http1 import AsyncHTTP1Transport

    async with AsyncAgentStateClient(agentstate_url) as api:
        await api.create_thread("floor", state={"bench": "floor"})
    transport = AsyncHTTP1Transport()
    url, headers, timeout = f"{floor_url}/v1/threads/floor", {"Accept": "application/json"}, \
        httpx.Timeout(30.0)

    async def get() -> None:
        answer = await transport.send("GET", url, {}, headers, None, timeout)
        if answer.status_code != 200:
            raise RuntimeError(f"the floor answered {answer.status_code}: {answer.text}")
        answer.json()

    try:
        for _ in range(20):
            await get()
        yield get
    finally:
        await transport.aclose()


def libpq_dsn(database_url: str) -> str:
    """The SQLAlchemy URL as a plain `postgresql://` DSN (asyncpg, psycopg), password kept."""
    return make_url(database_url).set(drivername="postgresql").render_as_string(
        hide_password=False)


def minimal_server(workers: int, dsn: str | None = None) -> Server:
    """The minimal FastAPI app; with `dsn`, also its bare one-SELECT get thread."""
    return Server([sys.executable, "-m", "bench.minimal_app", "--port", "{port}",
                   "--workers", str(workers)], {"AGENTSTATE_BENCH_DSN": dsn} if dsn else {},
                  f"minimal-{workers}w")


async def _admin(sql: str) -> None:
    import asyncpg

    url = make_url(ADMIN_URL)
    connection = await asyncpg.connect(host=url.host, port=url.port or 5432, user=url.username,
                                       password=url.password, database=url.database or "postgres")
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


def migrate(database_url: str) -> None:
    subprocess.run([sys.executable, "-m", "app.cli", "migrate"], cwd=ROOT, check=True,
                   env={**os.environ, "AGENTSTATE_DATABASE_URL": database_url},
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def create_postgres_database() -> str:
    name = f"agentstate_bench_{uuid.uuid4().hex[:10]}"
    asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
    return make_url(ADMIN_URL).set(drivername="postgresql+asyncpg", database=name).render_as_string(
        hide_password=False)


def drop_postgres_database(url: str) -> None:
    asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)'))


def postgres_facts() -> dict[str, str]:
    async def facts() -> dict[str, str]:
        import asyncpg

        url = make_url(ADMIN_URL)
        connection = await asyncpg.connect(host=url.host, port=url.port or 5432,
                                           user=url.username, password=url.password,
                                           database=url.database or "postgres")
        try:
            return {name: await connection.fetchval(f"SHOW {name}")
                    for name in ("server_version", "fsync", "synchronous_commit", "shared_buffers")}
        finally:
            await connection.close()

    return asyncio.run(facts())
