"""Outages a running server must name and bound: a network partition to Postgres,
a full disk and a read-only database on SQLite. Real `agentstate serve` processes."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import make_url

from tests.support import (
    ROOT,
    Partition,
    ServerProcess,
    agentstate,
    create_postgres_database,
    drop_postgres_database,
    free_port,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def postgres() -> Iterator[str]:
    url = create_postgres_database()
    assert agentstate(url, "migrate").returncode == 0
    yield url
    drop_postgres_database(url)


def test_a_partition_is_a_503_within_the_database_timeout(postgres: str) -> None:
    parsed = make_url(postgres)
    partition = Partition(parsed.host or "127.0.0.1", parsed.port or 5432)
    proxied = parsed.set(host="127.0.0.1", port=partition.port).render_as_string(
        hide_password=False)
    env = {"AGENTSTATE_DATABASE_TIMEOUT": "2", "AGENTSTATE_POOL_PING_IDLE_SECONDS": "0",
           "AGENTSTATE_LOG_FORMAT": "text"}
    try:
        with ServerProcess(proxied, env=env) as server:
            made = httpx.post(f"{server.base_url}/v1/threads", json={"thread_id": "p"},
                              timeout=30)
            assert made.status_code == 201, made.text
            partition.cut()
            # Statement timeout 30 s + 5 s was the bound before; the client's 20 s would
            # fail this test long before that.
            answer = httpx.get(f"{server.base_url}/v1/threads/p", timeout=20)
            assert answer.status_code == 503, answer.text
            assert answer.json()["code"] in ("database_timeout", "database_unavailable")
            ready = httpx.get(f"{server.base_url}/readyz", timeout=20)
            assert ready.status_code == 503
            assert ready.json()["cause"] in ("database_timeout", "database_unavailable")
        assert "Traceback" not in server.logs()
    finally:
        partition.close()


def serve_limited(url: str, file_size_limit: int, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    """`agentstate serve` whose files may not grow past `file_size_limit` bytes (RLIMIT_FSIZE:
    a write past it is cut short, which SQLite reports as a full disk)."""
    port = free_port()
    env = {**os.environ, "AGENTSTATE_DATABASE_URL": url, "AGENTSTATE_AUTO_MIGRATE": "false",
           "AGENTSTATE_LOG_FORMAT": "text"}
    command = (f"ulimit -f {file_size_limit // 512}; exec {sys.executable} -m app.cli serve "
               f"--port {port}")
    with log.open("wb") as out:
        process = subprocess.Popen(["sh", "-c", command], cwd=ROOT, env=env, stdout=out,
                                   stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return process, port
        assert process.poll() is None, log.read_text()
        time.sleep(0.1)
    process.kill()
    raise AssertionError(log.read_text())


def test_sqlite_reports_a_full_disk_as_such(tmp_path: Path) -> None:
    """SQLITE_FULL, produced for real by a database that may not grow (max_page_count): the
    cause SQLite gives for ENOSPC, which a test cannot cause without mounting a file system."""
    import sqlite3

    from app.db.diagnosis import diagnose

    lite = sqlite3.connect(tmp_path / "full.db")
    lite.execute("CREATE TABLE t (x)")
    lite.execute("PRAGMA max_page_count = 4")
    with pytest.raises(sqlite3.OperationalError) as full:
        lite.execute("INSERT INTO t VALUES (?)", ("x" * 100_000,))
    lite.close()
    found = diagnose(full.value, f"sqlite+aiosqlite:///{tmp_path}/full.db")
    assert found is not None and found.code == "disk_full"
    assert "disk full" in found.message


def test_a_disk_that_refuses_writes_is_named_in_the_log_and_at_readyz(tmp_path: Path) -> None:
    """The server's files may not grow past a limit (RLIMIT_FSIZE): SQLite's writes fail as
    they do on a full quota, and the answer, the log and /readyz say so."""
    url = f"sqlite+aiosqlite:///{tmp_path}/state.db"
    assert agentstate(url, "migrate").returncode == 0
    log = tmp_path / "server.log"
    # Room for the database and the log, not for the writes below.
    limit = (tmp_path / "state.db").stat().st_size + 2_000_000 + 123
    process, port = serve_limited(url, limit, log)
    base = f"http://127.0.0.1:{port}"
    try:
        big = {"blob": "x" * 900_000}
        statuses = []
        for n in range(6):
            answer = httpx.post(f"{base}/v1/threads", json={"thread_id": f"t{n}", "state": big},
                                timeout=30)
            statuses.append(answer.status_code)
            if answer.status_code != 201:
                break
        assert statuses[-1] == 503, statuses
        assert answer.json()["code"] == "storage_error", answer.text
        assert "file size limit" in answer.json()["detail"]
        ready = httpx.get(f"{base}/readyz", timeout=30)
        assert ready.status_code == 503 and ready.json()["cause"] == "storage_error", ready.text
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert "cannot write (disk I/O error): the disk quota or the file size limit" in log.read_text()
    assert "Traceback" not in log.read_text()


def test_a_read_only_database_is_named(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    assert agentstate(f"sqlite+aiosqlite:///{path}", "migrate").returncode == 0
    read_only = f"sqlite+aiosqlite:///file:{path}?mode=ro&uri=true"
    with ServerProcess(read_only, env={"AGENTSTATE_LOG_FORMAT": "text"}) as server:
        assert httpx.get(f"{server.base_url}/v1/threads", timeout=10).status_code == 200
        answer = httpx.post(f"{server.base_url}/v1/threads", json={}, timeout=30)
        assert answer.status_code == 503, answer.text
        assert answer.json()["code"] == "read_only"
        ready = httpx.get(f"{server.base_url}/readyz", timeout=30)
        assert ready.status_code == 503 and ready.json()["cause"] == "read_only"
    assert "is read-only" in server.logs()


# The slack a loaded machine may add to a bound (scheduling, a process's start of work).
SLACK = 1.5


def test_readyz_answers_within_the_database_timeout_while_postgres_stalls(postgres: str) -> None:
    """Postgres stalls with TCP up (a cut mid-query: nothing is forwarded, nothing closed):
    every probe, one after another and several at once, answers 503 within
    AGENTSTATE_DATABASE_TIMEOUT, the bound docs/operations.md gives, connect, pool checkout,
    ping and query included. It took up to twice that: the probe was cancelled at the bound,
    then waited for its connection's rollback on the stalled socket."""
    timeout = 2.0
    parsed = make_url(postgres)
    partition = Partition(parsed.host or "127.0.0.1", parsed.port or 5432)
    proxied = parsed.set(host="127.0.0.1", port=partition.port).render_as_string(
        hide_password=False)
    env = {"AGENTSTATE_DATABASE_TIMEOUT": f"{timeout:g}", "AGENTSTATE_LOG_FORMAT": "text"}

    def probe(base_url: str) -> tuple[float, httpx.Response]:
        started = time.monotonic()
        answer = httpx.get(f"{base_url}/readyz", timeout=60)
        return time.monotonic() - started, answer

    try:
        with ServerProcess(proxied, env=env) as server:
            assert probe(server.base_url)[1].status_code == 200
            partition.cut()
            answers = [probe(server.base_url) for _ in range(3)]
            with ThreadPoolExecutor(4) as pool:
                answers += list(pool.map(probe, [server.base_url] * 4))
            answers.append(probe(server.base_url))
            took = sorted(round(seconds, 2) for seconds, _ in answers)
            for _, answer in answers:
                assert answer.status_code == 503, answer.text
                assert answer.json()["cause"] in ("database_timeout", "database_unavailable")
                assert int(answer.headers["retry-after"]) >= 1
            assert took[-1] <= timeout + SLACK, took
        assert "Traceback" not in server.logs()
    finally:
        partition.close()
