"""Test helpers: Postgres databases and real `agentstate serve` processes."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import re
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import asyncpg
import httpx
from sqlalchemy import event
from sqlalchemy.engine import make_url

ADMIN_URL = os.environ.get(
    "AGENTSTATE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
ROOT = Path(__file__).resolve().parent.parent


# Ports of the PgBouncers tests started (tests/components.py): a helper connection to a URL
# through one goes to Postgres itself, whose backend pids and sessions it means.
POOLER_PORTS: set[int] = set()


def direct_url(url: str) -> str:
    """`url`, or the same database on Postgres itself when `url` goes through a PgBouncer."""
    parsed = make_url(url)
    if parsed.port not in POOLER_PORTS:
        return url
    admin = make_url(ADMIN_URL)
    return parsed.set(host=admin.host, port=admin.port).render_as_string(hide_password=False)


def pooler_env(url: str) -> dict[str, str]:
    """The pooler setting of a server or command on `url`: transaction pooling through a
    PgBouncer the tests started, none otherwise (whatever the test run's default is)."""
    pooled = url.startswith("postgresql") and make_url(url).port in POOLER_PORTS
    return {"AGENTSTATE_DATABASE_POOLER": "transaction" if pooled else "none"}


async def pg_connect(url: str = ADMIN_URL) -> asyncpg.Connection:
    """A plain asyncpg connection to the database of a SQLAlchemy URL (the admin database by
    default), for what a test does beside the server: hold locks, read pg_stat_activity.
    A `?host=` in the URL is a socket directory (the pgvector Postgres, tests/conftest.py)."""
    parsed = make_url(direct_url(url))
    return await asyncpg.connect(host=parsed.query.get("host", parsed.host),
                                 port=parsed.port or 5432,
                                 user=parsed.username, password=parsed.password,
                                 database=parsed.database or "postgres")


async def _admin(sql: str, admin_url: str) -> None:
    connection = await pg_connect(admin_url)
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


def create_postgres_database(admin_url: str = ADMIN_URL) -> str:
    """A new empty database on the Postgres of `admin_url` (the suite's by default)."""
    name = f"agentstate_test_{uuid.uuid4().hex[:10]}"
    asyncio.run(_admin(f'CREATE DATABASE "{name}"', admin_url))
    return make_url(admin_url).set(drivername="postgresql+asyncpg", database=name).render_as_string(
        hide_password=False
    )


def drop_postgres_database(url: str, admin_url: str = ADMIN_URL) -> None:
    name = make_url(url).database
    asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', admin_url))


class Statement(NamedTuple):
    sql: str
    params: Any
    direct: bool  # it came the direct way (app/db/direct.py)


@contextlib.contextmanager
def statements(app: Any) -> Iterator[list[Statement]]:
    """Every statement the engine of a running `app` executes while the block runs, as its
    listeners hear of it."""
    from app.db.direct import DirectContext

    heard: list[Statement] = []

    def record(_conn: Any, _cursor: Any, sql: str, params: Any, context: Any,
               _many: bool) -> None:
        heard.append(Statement(sql, params, isinstance(context, DirectContext)))

    engine = app.state.db.engine.sync_engine
    event.listen(engine, "before_cursor_execute", record)
    try:
        yield heard
    finally:
        event.remove(engine, "before_cursor_execute", record)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pool_in_use(metrics: str) -> float | None:
    """`agentstate_db_pool_in_use` in a `/metrics` exposition (None: not in it)."""
    found = re.search(r"^agentstate_db_pool_in_use (\S+)$", metrics, re.MULTILINE)
    return float(found.group(1)) if found else None


class Partition:
    """A TCP proxy to Postgres whose network can be cut silently: once `cut()`, bytes in
    either direction vanish and new connections are accepted but never answered, as when a
    firewall or a failed link drops packets (nothing is closed, nothing is refused). After
    `stall()` only the connections already open go silent, as a NAT's or a failed-over
    address's old flows do, while new ones get through."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.partitioned = threading.Event()
        self.sockets: list[socket.socket] = []
        self.stalled: set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        self.partitioned.set()

    def stall(self) -> None:
        self.stalled.update(self.sockets)

    def close(self) -> None:
        self.listener.close()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.sockets.append(client)
            if self.partitioned.is_set():
                continue  # accepted by the kernel, never answered
            upstream = socket.create_connection(self.target)
            self.sockets.append(upstream)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _silent(self, sock: socket.socket) -> bool:
        return self.partitioned.is_set() or sock in self.stalled

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if not self._silent(src):
                    dst.sendall(data)
            if not self._silent(src):
                dst.shutdown(socket.SHUT_WR)  # a close goes through, as on a real network


class ServerProcess:
    """A real `agentstate serve` in its own process, on a free loopback port."""

    def __init__(self, database_url: str, *, env: dict[str, str] | None = None,
                 args: tuple[str, ...] = ()) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "AGENTSTATE_DATABASE_URL": database_url,
                    "AGENTSTATE_AUTO_MIGRATE": "false", **pooler_env(database_url),
                    **(env or {})}
        self.args = args
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"agentstate-{self.port}.log"

    def start(self, timeout: float = 90.0) -> ServerProcess:
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--port", str(self.port), *self.args],
            cwd=ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited: {self.log_path.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.base_url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server did not start: {self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if hasattr(self, "_log"):
            self._log.close()

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def drain(client: httpx.AsyncClient, cursor: str | None = None,
                **params: object) -> tuple[list[dict], str]:
    """Every event after `cursor`, following next_cursor; and the cursor to poll with."""
    events: list[dict] = []
    while True:
        query = {"limit": 100, **params, **({"cursor": cursor} if cursor else {})}
        page = await client.get("/v1/events", params=query)
        assert page.status_code == 200, page.text
        body = page.json()
        events += body["data"]
        assert body["next_cursor"], "next_cursor is never null"
        cursor = body["next_cursor"]
        if not body["has_more"]:
            assert "link" not in page.headers
            return events, cursor
        assert cursor in page.headers["link"]


def agentstate(database_url: str, *args: str,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the `agentstate` CLI against a database, as an operator would."""
    env = {**os.environ, "AGENTSTATE_DATABASE_URL": database_url,
           "AGENTSTATE_AUTO_MIGRATE": "false", **pooler_env(database_url), **(env or {})}
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def create_key(database_url: str, tenant: str, scopes: str = "read,write",
               name: str = "test") -> str:
    """A new API key's token, made with `agentstate keys create`."""
    done = agentstate(database_url, "keys", "create", "--tenant", tenant, "--name", name,
                      "--scopes", scopes)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def revoke_key(database_url: str, token: str) -> None:
    done = agentstate(database_url, "keys", "revoke", key_id(token))
    assert done.returncode == 0, done.stderr


def key_id(token: str) -> str:
    return token.split("_")[1]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def eventually(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Poll until `condition()` holds. The deadline only stops a hang; it measures nothing."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.05)


async def _activity(connection: asyncpg.Connection) -> str:
    rows = await connection.fetch(
        "SELECT pid, application_name, state, wait_event_type, wait_event,"
        " pg_blocking_pids(pid) AS blocked_by, left(query, 120) AS query"
        " FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
    return "\n".join(str(dict(row)) for row in rows) or "(no other backend)"


async def wait_until_blocked(database_url: str, holder_pid: int, *, count: int = 1,
                             timeout: float = 60.0) -> list[int]:
    """Wait until `count` backends of the database wait on a lock that backend `holder_pid`
    holds (a row or table lock, an advisory lock); return their pids.

    This orders a race test by what Postgres says rather than by a sleep: a backend listed
    here has reached the lock and is parked on it (`pg_stat_activity.wait_event_type` is
    'Lock' and `pg_blocking_pids` names the holder), so it can only go on once the holder
    commits or rolls back. If that is not seen within `timeout` (a guard against a hang, not
    a measurement) the test fails, showing what every backend of the database was doing.
    """
    connection = await pg_connect(database_url)
    try:
        deadline = time.monotonic() + timeout
        while True:
            waiting = [row["pid"] for row in await connection.fetch(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND $1 = ANY(pg_blocking_pids(pid))",
                holder_pid)]
            if len(waiting) >= count:
                return waiting
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"after {timeout:.0f} s, {len(waiting)} backend(s) wait on a lock held by"
                    f" {holder_pid}, expected {count}:\n{await _activity(connection)}")
            await asyncio.sleep(0.02)
    finally:
        await connection.close()


@contextlib.asynccontextmanager
async def write_lock(database_url: str) -> AsyncIterator[int | None]:
    """Block every writer of the threads table until the block exits.

    Yields the pid of the Postgres backend holding the lock (for `wait_until_blocked`), None
    on SQLite, where the lock is the database's one write lock (BEGIN IMMEDIATE).
    """
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        lite = sqlite3.connect(url.database, isolation_level=None)
        lite.execute("BEGIN IMMEDIATE")
        try:
            yield None
        finally:
            lite.rollback()
            lite.close()
        return
    connection = await pg_connect(database_url)
    try:
        async with connection.transaction():
            # SHARE conflicts with the INSERT's ROW EXCLUSIVE but lets reads through.
            await connection.execute("LOCK TABLE threads IN SHARE MODE")
            yield connection.get_server_pid()
    finally:
        await connection.close()


@contextlib.contextmanager
def recorded_spans() -> Iterator[tuple[Any, Any]]:
    """OpenTelemetry's SDK set up as a traced application sets it up (the global tracer
    provider, which the client uses), keeping its spans in memory: (provider, exporter).
    The global provider is reset afterwards with OpenTelemetry's own test utility."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.test.globals_test import reset_trace_globals

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reset_trace_globals()
    trace.set_tracer_provider(provider)
    try:
        yield provider, exporter
    finally:
        reset_trace_globals()
        provider.shutdown()


def span_tree(spans: Any) -> list[str]:
    """Finished spans as an indented tree (children in start order): `name [KIND]`."""
    children: dict[int | None, list[Any]] = {}
    ids = {span.context.span_id for span in spans}
    for span in spans:
        parent = span.parent.span_id if span.parent is not None else None
        children.setdefault(parent if parent in ids else None, []).append(span)
    lines: list[str] = []

    def walk(parent: int | None, depth: int) -> None:
        for span in sorted(children.get(parent, []), key=lambda s: s.start_time):
            lines.append(f"{'  ' * depth}{span.name} [{span.kind.name}]")
            walk(span.context.span_id, depth + 1)

    walk(None, 0)
    return lines


@contextlib.contextmanager
def cyclic_garbage() -> Iterator[list[str]]:
    """The types (module-qualified names) of what became unreachable in reference cycles
    meanwhile: what waits for Python's cycle collector rather than being freed at once."""
    gc.collect()
    found: list[str] = []
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield found
        gc.collect()
    finally:
        gc.set_debug(0)
    found += sorted({f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage})
    gc.garbage.clear()
