"""Misconfiguration is found at start and told in one line.

Each case starts the real `agentstate` CLI as an operator would and checks its exit status
and the one line it prints; the runtime cases check the 503 and its `code`.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import make_url

from app.core.settings import Settings
from app.db import migrate
from app.db.engine import Database
from tests.support import (
    ROOT,
    ServerProcess,
    agentstate,
    create_postgres_database,
    drop_postgres_database,
    free_port,
    pg_connect,
)

pytestmark = pytest.mark.slow  # every test here starts the CLI or a server

HEAD = migrate.head_revision()


def serve(url: str, *args: str, env: dict[str, str] | None = None,
          timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`agentstate serve` that is expected to refuse to start (the timeout guards a hang)."""
    return agentstate(url, "serve", "--port", str(free_port()), *args,
                      env={"AGENTSTATE_LOG_FORMAT": "text", **(env or {})})


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("agentstate: "), done.stderr
    return lines[0]


@pytest.fixture
def empty_postgres() -> Iterator[str]:
    url = create_postgres_database()
    yield url
    drop_postgres_database(url)


def test_a_database_that_does_not_exist(empty_postgres: str) -> None:
    missing = make_url(empty_postgres).set(database="agentstate_nope").render_as_string(
        hide_password=False)
    done = serve(missing)
    assert done.returncode == 2
    assert one_line(done) == ("agentstate: database agentstate_nope does not exist: create "
                              "it, or set AGENTSTATE_DATABASE_URL")


def test_a_role_that_does_not_exist(empty_postgres: str) -> None:
    nobody = make_url(empty_postgres).set(username="agentstate_nobody", password=None)
    done = serve(nobody.render_as_string(hide_password=False))
    assert done.returncode == 2
    line = one_line(done)
    assert 'role "agentstate_nobody" does not exist' in line
    assert "AGENTSTATE_DATABASE_URL" in line
    # Over the Unix socket (libpq's ?host=), the line names the socket, not localhost:5432.
    socket = f"postgresql://agentstate_nobody@/{nobody.database}?host=/var/run/postgresql"
    done = serve(socket)
    assert done.returncode == 2
    assert one_line(done).startswith("agentstate: the socket /var/run/postgresql/.s.PGSQL.5432 "
                                     'refused the login: role "agentstate_nobody"'), done.stderr


def test_a_schema_never_migrated(empty_postgres: str) -> None:
    done = serve(empty_postgres)
    assert done.returncode == 1  # may pass once the migration has run: the unit retries
    assert one_line(done) == (f"agentstate: schema is at nothing, head is {HEAD}: run "
                              "`agentstate migrate`")


def test_the_debug_flag_shows_the_traceback(empty_postgres: str) -> None:
    done = agentstate(empty_postgres, "--debug", "serve", "--port", str(free_port()))
    assert done.returncode != 0 and "Traceback" in done.stderr


def test_a_bad_setting_names_its_variable(tmp_path: Path) -> None:
    done = agentstate(f"sqlite:///{tmp_path}/a.db", "migrate",
                      env={"AGENTSTATE_IDEMPOTENCY_TTL_HOURS": "0"})
    assert done.returncode == 2
    assert one_line(done) == "agentstate: AGENTSTATE_IDEMPOTENCY_TTL_HOURS must be >= 24"
    done = agentstate(f"sqlite:///{tmp_path}/a.db", "reindex",
                      env={"AGENTSTATE_STORE_HNSW_M": "40"})  # ef_construction 64 < 2 x 40
    assert done.returncode == 2
    assert one_line(done) == ("agentstate: AGENTSTATE_STORE_HNSW_EF_CONSTRUCTION must be at "
                              "least twice AGENTSTATE_STORE_HNSW_M (80)")
    done = agentstate("mysql://u:hunter2@h/db", "migrate")
    assert done.returncode == 2
    line = one_line(done)
    assert line.startswith("agentstate: AGENTSTATE_DATABASE_URL ") and "hunter2" not in line


def test_an_empty_database_url_means_the_default(tmp_path: Path) -> None:
    done = agentstate("", "migrate", env={"XDG_DATA_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "agentstate" / "state.db").exists()


def test_version_and_help() -> None:
    version = subprocess.run([sys.executable, "-m", "app.cli", "--version"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60, check=False)
    assert version.returncode == 0
    assert version.stdout == f"agentstate {metadata.version('agentstate')}\n"
    helped = subprocess.run([sys.executable, "-m", "app.cli", "serve", "--help"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60, check=False)
    assert "(default: 8080)" in helped.stdout
    for variable in ("AGENTSTATE_DATABASE_URL", "AGENTSTATE_SECRET_KEYS",
                     "AGENTSTATE_ALLOWED_HOSTS"):
        assert variable in helped.stdout


def test_libpq_parameters_work_and_unknown_ones_are_refused(empty_postgres: str) -> None:
    managed = (empty_postgres + "?sslmode=disable&application_name=agentstate-libpq"
               "&connect_timeout=5&options=-c%20lock_timeout%3D4321")
    migrated = agentstate(managed, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    with ServerProcess(managed) as server:
        assert httpx.get(f"{server.base_url}/readyz", timeout=10).status_code == 200

        async def seen() -> list[str]:
            connection = await pg_connect(empty_postgres)
            try:
                rows = await connection.fetch(
                    "SELECT application_name FROM pg_stat_activity "
                    "WHERE datname = current_database()")
                return [row["application_name"] for row in rows]
            finally:
                await connection.close()

        assert "agentstate-libpq" in asyncio.run(seen())
    for command in (("migrate",), ("serve", "--port", str(free_port()))):
        refused = agentstate(empty_postgres + "?sslmode=disable&sslfoo=1", *command)
        assert refused.returncode == 2
        assert one_line(refused).startswith(
            "agentstate: AGENTSTATE_DATABASE_URL has the parameter sslfoo=")


def test_a_dropped_database_is_a_503_naming_it(empty_postgres: str) -> None:
    assert agentstate(empty_postgres, "migrate").returncode == 0
    with ServerProcess(empty_postgres) as server:
        assert httpx.get(f"{server.base_url}/readyz", timeout=10).status_code == 200
        drop_postgres_database(empty_postgres)  # WITH (FORCE): its connections are ended
        answer = httpx.get(f"{server.base_url}/v1/threads", timeout=30)
        assert answer.status_code == 503, answer.text
        assert answer.json()["code"] == "database_missing"
        ready = httpx.get(f"{server.base_url}/readyz", timeout=30)
        assert ready.status_code == 503 and ready.json()["cause"] == "database_missing"
    assert "Traceback" not in server.logs()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_schema_rolled_back_is_a_503_naming_it(kind: str, tmp_path: Path) -> None:
    url = (f"sqlite+aiosqlite:///{tmp_path}/state.db" if kind == "sqlite"
           else create_postgres_database())
    try:
        assert agentstate(url, "migrate").returncode == 0
        with ServerProcess(url) as server:

            async def roll_back() -> None:
                db = Database(Settings(database_url=url, _env_file=None))  # type: ignore[call-arg]
                try:
                    await migrate.downgrade(db.engine, "base")
                finally:
                    await db.dispose()

            asyncio.run(roll_back())
            answer = httpx.get(f"{server.base_url}/v1/threads", timeout=30)
            assert answer.status_code == 503, answer.text
            assert answer.json()["code"] == "schema_not_current"
            assert "agentstate migrate" in answer.json()["detail"]
            ready = httpx.get(f"{server.base_url}/readyz", timeout=30)
            assert ready.status_code == 503 and ready.json()["cause"] == "schema_not_current"
        assert "Traceback" not in server.logs()
    finally:
        if kind == "postgres":
            drop_postgres_database(url)


def test_the_banner_says_what_runs(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/state.db"
    for log_format in ("text", "json"):
        with ServerProcess(url, env={"AGENTSTATE_LOG_FORMAT": log_format,
                                     "AGENTSTATE_AUTO_MIGRATE": "true"}) as server:
            pass
        logs = server.logs()
        ready = [line for line in logs.splitlines() if " ready on http://127.0.0.1:" in line]
        assert len(ready) == 1, logs
        for fact in (str(tmp_path / "state.db"), HEAD, "open on loopback",
                     str(tmp_path / "secret.key")):
            assert fact in ready[0], ready[0]
        # Logged once the port listens: nothing after it says the server is not up yet.
        assert logs.index(" ready on ") < logs.index("Application startup complete")
