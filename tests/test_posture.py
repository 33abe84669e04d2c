"""A safe posture by default: Host names, file modes, logs without values,
secrets that work on SQLite and cannot be half-configured, HTTP limits.

Every test starts a real `agentstate serve` (or the CLI) on a database of its own.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from agentstate_client import AgentStateClient

from app.core.secretbox import new_key
from tests.support import (
    ROOT,
    ServerProcess,
    agentstate,
    create_key,
    create_postgres_database,
    drop_postgres_database,
    pg_connect,
)

pytestmark = pytest.mark.slow

MARKER = "MARKER-7f3a9c"


@pytest.fixture(params=["sqlite", "postgres"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A migrated database of its own (tests here change schemas and keys)."""
    url = (f"sqlite+aiosqlite:///{tmp_path}/db/state.db" if request.param == "sqlite"
           else create_postgres_database())
    assert agentstate(url, "migrate").returncode == 0
    yield url
    if request.param == "postgres":
        drop_postgres_database(url)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_an_open_server_answers_only_loopback_host_names(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/state.db"
    assert agentstate(url, "migrate").returncode == 0
    with ServerProcess(url) as server:
        # Twice each: the second answer comes from the verdict the server remembered.
        for host, status in ((f"localhost:{server.port}", 200), ("127.0.0.1", 200),
                             (f"[::1]:{server.port}", 200), ("rebound.example", 400),
                             (f"rebound.example:{server.port}", 400)) * 2:
            answer = httpx.get(f"{server.base_url}/v1/threads",
                               headers={"Host": host, "X-Request-ID": "probe-7"}, timeout=10)
            assert answer.status_code == status, (host, answer.text)
            assert answer.headers["x-request-id"] == "probe-7"  # refused or not
            if status == 400:
                assert answer.headers["content-type"] == "application/problem+json"
                assert answer.json()["code"] == "host_not_allowed"
                assert answer.json()["instance"] == "/v1/threads"
                assert "AGENTSTATE_ALLOWED_HOSTS" in answer.json()["detail"]
    with ServerProcess(url, env={"AGENTSTATE_ALLOWED_HOSTS": "state.internal"}) as server:
        for host, status in (("state.internal", 200), ("rebound.example", 400),
                             ("localhost", 200)):
            answer = httpx.get(f"{server.base_url}/v1/threads", headers={"Host": host},
                               timeout=10)
            assert answer.status_code == status, (host, answer.text)


def test_the_embedded_default_is_private(tmp_path: Path) -> None:
    with ServerProcess("", env={"XDG_DATA_HOME": str(tmp_path), "AGENTSTATE_AUTO_MIGRATE": "true",
                                "AGENTSTATE_SECRET_KEYS": ""}) as server:
        put = httpx.put(f"{server.base_url}/v1/mcp-servers/local",
                        json={"server_type": "x", "secrets": {"t": "v"}}, timeout=10)
        assert put.status_code == 201, put.text
        home = tmp_path / "agentstate"
        assert mode(home) == 0o700
        files = sorted(path.name for path in home.iterdir())
        assert {"state.db", "secret.key"} <= set(files), files
        for name in files:
            assert mode(home / name) == 0o600, (name, oct(mode(home / name)))


def test_sqlite_secrets_work_wherever_the_database_is(tmp_path: Path) -> None:
    """The README's MCP example, on an explicit AGENTSTATE_DATABASE_URL (before: 500)."""
    url = f"sqlite+aiosqlite:///{tmp_path}/elsewhere/my.db"
    assert agentstate(url, "migrate").returncode == 0
    with ServerProcess(url, env={"AGENTSTATE_SECRET_KEYS": ""}) as server:
        put = httpx.put(f"{server.base_url}/v1/mcp-servers/gh",
                        json={"server_type": "x", "secrets": {"token": "t0k"}}, timeout=10)
        assert put.status_code == 201, put.text
        read = httpx.get(f"{server.base_url}/v1/mcp-servers/gh",
                         params={"include_secrets": "true"}, timeout=10)
        assert read.json()["secrets"] == {"token": "t0k"}
    assert mode(tmp_path / "elsewhere" / "secret.key") == 0o600
    assert "secrets key file " + str(tmp_path / "elsewhere" / "secret.key") in server.logs()


def test_postgres_without_keys_warns_and_answers_503() -> None:
    url = create_postgres_database()
    try:
        assert agentstate(url, "migrate").returncode == 0
        with ServerProcess(url, env={"AGENTSTATE_SECRET_KEYS": ""}) as server:
            put = httpx.put(f"{server.base_url}/v1/mcp-servers/gh",
                            json={"server_type": "x", "secrets": {"token": "t0k"}}, timeout=10)
            assert put.status_code == 503, put.text
            assert put.json()["code"] == "secrets_not_configured"
            assert "AGENTSTATE_SECRET_KEYS" in put.json()["detail"]
        assert "AGENTSTATE_SECRET_KEYS is not set" in server.logs()
        assert "secrets not configured" in server.logs()  # the banner
    finally:
        drop_postgres_database(url)


def test_keys_that_cannot_open_the_stored_secrets_are_found_at_start(fresh_url: str) -> None:
    old = new_key()
    with ServerProcess(fresh_url, env={"AGENTSTATE_SECRET_KEYS": old}) as server:
        put = httpx.put(f"{server.base_url}/v1/mcp-servers/gh",
                        json={"server_type": "x", "secrets": {"token": "t0k"}}, timeout=10)
        assert put.status_code == 201, put.text
    with ServerProcess(fresh_url, env={"AGENTSTATE_SECRET_KEYS": new_key(),
                                       "AGENTSTATE_LOG_FORMAT": "text"}) as server:
        # Masked reads work; only the secrets cannot be read, and the log said why at start.
        assert httpx.get(f"{server.base_url}/v1/mcp-servers/gh", timeout=10).status_code == 200
    (line,) = [line for line in server.logs().splitlines() if "stored MCP secrets" in line]
    assert line.startswith("WARNING agentstate AGENTSTATE_SECRET_KEYS opens none of the 1 "
                           "stored MCP secrets checked (e.g. not those of default/gh)"), line
    assert "AGENTSTATE_SECRET_KEYS=<current>,<old>" in line
    assert "agentstate secrets rotate" in line
    assert server.logs().index("stored MCP secrets") < server.logs().index(" ready on ")


async def _refuse_marker(url: str) -> None:
    """Make the database itself refuse a thread whose state holds MARKER: the error it
    raises carries the row's values (Postgres: "Failing row contains (...)")."""
    if url.startswith("sqlite"):
        import sqlite3

        with sqlite3.connect(url.split("///", 1)[1]) as lite:
            lite.execute("CREATE TRIGGER refuse BEFORE INSERT ON threads WHEN NEW.state LIKE "
                         f"'%{MARKER}%' BEGIN SELECT RAISE(ABORT, 'refused'); END")
        return
    connection = await pg_connect(url)
    try:
        await connection.execute("ALTER TABLE threads ADD CONSTRAINT refuse CHECK "
                                 f"(state::text NOT LIKE '%{MARKER}%')")
    finally:
        await connection.close()


@pytest.mark.parametrize("level", ["INFO", "DEBUG"])
def test_logs_never_hold_statement_values(fresh_url: str, level: str) -> None:
    asyncio.run(_refuse_marker(fresh_url))
    for log_format in ("json", "text"):
        env = {"AGENTSTATE_LOG_LEVEL": level, "AGENTSTATE_LOG_FORMAT": log_format}
        with ServerProcess(fresh_url, env=env) as server:
            ok = httpx.post(f"{server.base_url}/v1/threads",
                            json={"state": {"fine": "MARK-ok"}}, timeout=10)
            assert ok.status_code == 201, ok.text
            failed = httpx.post(f"{server.base_url}/v1/threads",
                                json={"state": {"secret": MARKER}}, timeout=10)
            assert failed.status_code == 500, failed.text
            assert MARKER not in failed.text
        logs = server.logs()
        assert "unhandled" in logs  # the failure was logged ...
        assert MARKER not in logs  # ... without the values it was about
        assert "MARK-ok" not in logs  # nor any statement's values at DEBUG


def test_a_key_with_a_newline_works(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/state.db"
    assert agentstate(url, "migrate").returncode == 0
    token = create_key(url, "default")
    with ServerProcess(url) as server:
        with AgentStateClient(server.base_url, api_key=token + "\n") as client:
            client.create_thread("newline")
        # httpx refuses the whitespace itself; http.client sends it as written.
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        connection.request("GET", "/v1/threads/newline",
                           headers={"Authorization": f"Bearer {token} \t"})
        assert connection.getresponse().status == 200
        connection.close()


def test_oversized_headers_and_too_many_requests_in_flight_are_refused(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/state.db"
    assert agentstate(url, "migrate").returncode == 0
    with ServerProcess(url, args=("--limit-concurrency", "2", "--http", "h11")) as server:
        big = httpx.get(f"{server.base_url}/healthz", headers={"X-Big": "x" * 20_000},
                        timeout=10)
        assert big.status_code == 431, big.status_code
        assert big.json()["code"] == "headers_too_large" and big.json()["instance"] == "/healthz"
        assert re.fullmatch(r"[0-9a-f]{32}", big.headers["x-request-id"])
        trickled = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        try:  # a head that grows past the limit while it arrives: h11 refuses it
            trickled.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            for _ in range(40):
                trickled.sendall(b"X-Pad: " + b"y" * 1000 + b"\r\n")
            assert trickled.recv(4096).split(b" ")[1] in (b"400", b"431")
        except (ConnectionResetError, BrokenPipeError):
            pass  # closed on us: refused as well
        finally:
            trickled.close()
        asyncio.run(_crowd(server.base_url))


async def _crowd(base_url: str) -> None:
    """Two long polls hold the server's two places: a third request is a 503 problem until
    one of them ends; an idle keep-alive connection takes no place, `/healthz` needs none."""
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as first, \
            httpx.AsyncClient(base_url=base_url, timeout=30) as second, \
            httpx.AsyncClient(base_url=base_url, timeout=30) as third:
        assert (await third.get("/v1/threads")).status_code == 200  # now idle, kept alive

        async def hold(client: httpx.AsyncClient) -> httpx.Response:
            for _ in range(100):  # a probe below may hold the other place as it arrives
                answer = await client.get("/v1/events", params={"wait": 6})
                if answer.status_code != 503:
                    return answer
                await asyncio.sleep(0.05)
            raise AssertionError("a long poll never got in")

        polls = [asyncio.ensure_future(hold(client)) for client in (first, second)]
        crowded = None
        for _ in range(200):  # until both polls are in
            answer = await third.get("/v1/threads")
            if answer.status_code == 503:
                crowded = answer
                break
            assert answer.status_code == 200, answer.text
            await asyncio.sleep(0.02)
        assert crowded is not None, "the third request was never refused"
        assert crowded.headers["content-type"] == "application/problem+json"
        assert crowded.headers["retry-after"] == "2"
        assert crowded.json()["code"] == "overloaded" and crowded.json()["status"] == 503
        assert re.fullmatch(r"[0-9a-f]{32}", crowded.headers["x-request-id"])
        assert (await third.get("/healthz")).status_code == 200
        for poll in await asyncio.gather(*polls):
            assert poll.status_code == 200, poll.text
        assert (await third.get("/v1/threads")).status_code == 200


def test_two_servers_never_share_a_port(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/state.db"
    other = f"sqlite+aiosqlite:///{tmp_path}/other.db"
    for database in (url, other):
        assert agentstate(database, "migrate").returncode == 0
    with ServerProcess(url, args=("--workers", "2")) as server:
        for workers in ("2", "1"):
            second = subprocess.run(
                [sys.executable, "-m", "app.cli", "serve", "--port", str(server.port),
                 "--workers", workers],
                cwd=ROOT, env={"PATH": "/usr/bin:/bin", "AGENTSTATE_DATABASE_URL": other},
                capture_output=True, text=True, timeout=60, check=False)
            assert second.returncode == 2, second.stderr
            assert second.stderr.strip() == (f"agentstate: cannot listen on 127.0.0.1:"
                                             f"{server.port}: address already in use "
                                             "(another server runs there?)")


def test_the_banner_in_json(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/state.db"
    assert agentstate(url, "migrate").returncode == 0
    with ServerProcess(url, env={"AGENTSTATE_LOG_FORMAT": "json"}) as server:
        pass
    ready = [json.loads(line) for line in server.logs().splitlines()
             if line.startswith("{") and '"schema_revision"' in line]
    assert len(ready) == 1
    assert ready[0]["address"] == f"http://127.0.0.1:{server.port}"
    assert ready[0]["auth"].startswith("open on loopback")
    assert ready[0]["secrets"] == f"key file {tmp_path}/secret.key"
