"""Test helpers: Postgres databases and real `agentstate serve` processes."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
from sqlalchemy.engine import make_url

ADMIN_URL = os.environ.get(
    "AGENTSTATE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
ROOT = Path(__file__).resolve().parent.parent


async def _admin(sql: str) -> None:
    import asyncpg

    url = make_url(ADMIN_URL)
    connection = await asyncpg.connect(
        host=url.host, port=url.port or 5432, user=url.username, password=url.password,
        database=url.database or "postgres",
    )
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


def create_postgres_database() -> str:
    name = f"agentstate_test_{uuid.uuid4().hex[:10]}"
    asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
    return make_url(ADMIN_URL).set(drivername="postgresql+asyncpg", database=name).render_as_string(
        hide_password=False
    )


def drop_postgres_database(url: str) -> None:
    name = make_url(url).database
    asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """A real `agentstate serve` in its own process, on a free loopback port."""

    def __init__(self, database_url: str, *, env: dict[str, str] | None = None,
                 args: tuple[str, ...] = ()) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "AGENTSTATE_DATABASE_URL": database_url,
                    "AGENTSTATE_AUTO_MIGRATE": "false", **(env or {})}
        self.args = args
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"agentstate-{self.port}.log"

    def start(self, timeout: float = 30.0) -> ServerProcess:
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
           "AGENTSTATE_AUTO_MIGRATE": "false", **(env or {})}
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
