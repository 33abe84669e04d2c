"""With real processes: `agentstate copy` killed with SIGKILL and run again finishes, and
`agentstate backup` while a real `agentstate serve` writes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import pytest
from sqlalchemy.engine import make_url

from app.core.settings import Settings
from tests.conftest import BACKENDS, http_client, running
from tests.support import ROOT, ServerProcess, agentstate, pg_connect
from tests.test_portability import (
    OTHER,
    cli,
    export_text,
    fresh_database,
    migrated,
    read_all,
    thread_records,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
THREADS, MESSAGES = 60, 60


async def thread_count(url: str) -> int:
    settings = Settings(database_url=url, auto_migrate=False, _env_file=None)  # type: ignore[call-arg]
    async with running(settings) as app, http_client(app) as client:
        return len(await read_all(client, "/v1/threads"))


async def committed_threads(url: str) -> int:
    """The threads committed in `url` so far, read in SQL: cheap enough to poll every few
    milliseconds (a server per read, as `thread_count`, took longer than some copies)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        with contextlib.closing(sqlite3.connect(str(parsed.database))) as db:
            return int(db.execute("SELECT count(*) FROM threads").fetchone()[0])
    connection = await pg_connect(url)
    try:
        return int(await connection.fetchval("SELECT count(*) FROM threads"))
    finally:
        await connection.close()


async def export_of(url: str, path: Path) -> str:
    code, _, err = await cli(url, "export", "-o", str(path))
    assert code == 0, err
    return path.read_text()


@pytest.mark.parametrize("source_backend", BACKENDS)
async def test_copy_killed_and_run_again_ends_as_an_uninterrupted_copy(
        source_backend: str, tmp_path: Path) -> None:
    target_backend = OTHER[source_backend]
    if target_backend not in BACKENDS:
        pytest.fail(f"copy needs both backends; AGENTSTATE_TEST_BACKENDS={BACKENDS}")
    async with fresh_database(source_backend, tmp_path) as source, \
            fresh_database(target_backend, tmp_path) as killed, \
            fresh_database(target_backend, tmp_path) as whole:
        await migrated(source)
        data = tmp_path / "data.jsonl"
        data.write_text(export_text(*(
            thread_records(f"t{n:04d}", state={"n": n}, messages=[{}] * MESSAGES)
            for n in range(THREADS))))
        code, _, err = await cli(source, "import", str(data))
        assert code == 0, err

        # Kill -9 once the copy has committed some threads but not all.
        env = {**os.environ, "AGENTSTATE_AUTO_MIGRATE": "false"}
        process = subprocess.Popen(  # noqa: ASYNC220 - a process of its own, to kill -9
            [sys.executable, "-m", "app.cli", "copy", "--from", source, "--to", killed],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        copied = 0
        try:
            while process.poll() is None and copied < THREADS // 10:
                await anyio.sleep(0.01)
                try:
                    copied = await committed_threads(killed)
                except Exception:  # noqa: BLE001 - the target is created by the copy itself
                    copied = 0
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait()
        assert process.returncode == -signal.SIGKILL, process.stderr.read() if process.stderr \
            else ""
        partial = await thread_count(killed)
        assert 0 < partial < THREADS, f"the copy was not interrupted mid-way ({partial})"

        done = agentstate(source, "copy", "--from", source, "--to", killed)
        assert done.returncode == 0, done.stderr
        assert f"threads: {THREADS - partial} created, {partial} unchanged" in done.stderr, \
            done.stderr
        assert f"verified: {THREADS} threads" in done.stderr, done.stderr

        uninterrupted = agentstate(source, "copy", "--from", source, "--to", whole)
        assert uninterrupted.returncode == 0, uninterrupted.stderr
        assert f"threads: {THREADS} created" in uninterrupted.stderr
        original = await export_of(source, tmp_path / "source.jsonl")
        assert await export_of(killed, tmp_path / "killed.jsonl") == original
        assert await export_of(whole, tmp_path / "whole.jsonl") == original

        again = agentstate(source, "copy", "--from", source, "--to", whole)
        assert again.returncode == 0 and f"threads: {THREADS} unchanged" in again.stderr, \
            again.stderr


async def _write_load(base_url: str, stop: asyncio.Event, threads: int) -> int:
    """Appends and state writes to several threads until `stop`; the number of writes."""
    done = 0
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        async def writer(n: int) -> None:
            nonlocal done
            thread = f"w{n}"
            response = await client.put(f"/v1/threads/{thread}", json={"state": {"i": 0}},
                                        headers={"If-None-Match": "*"})
            assert response.status_code == 201, response.text
            i = 0
            while not stop.is_set():
                i += 1
                appended = await client.post(f"/v1/threads/{thread}/messages", json={
                    "messages": [{"role": "user", "content": f"{i}a"},
                                 {"role": "assistant", "content": f"{i}b"}]})
                assert appended.status_code == 201, appended.text
                patched = await client.patch(f"/v1/threads/{thread}", json={"state": {"i": i}},
                                             headers={"If-Match": "*"})
                assert patched.status_code == 200, patched.text
                done += 2

        await asyncio.gather(*(writer(n) for n in range(threads)))
    return done


async def test_backup_while_the_server_writes_is_consistent(tmp_path: Path) -> None:
    database = tmp_path / "live.db"
    url = f"sqlite+aiosqlite:///{database}"
    await migrated(url)
    backups = [tmp_path / f"backup-{n}.db" for n in range(3)]
    with ServerProcess(url) as server:
        stop = asyncio.Event()
        load = asyncio.create_task(_write_load(server.base_url, stop, threads=4))
        try:
            for path in backups:
                await anyio.sleep(0.3)
                done = await anyio.to_thread.run_sync(
                    lambda p=path: agentstate(url, "backup", str(p)))
                assert done.returncode == 0, done.stderr
                assert "backed up" in done.stderr and str(path) in done.stderr
        finally:
            stop.set()
            writes = await load
    assert writes > 0
    sizes = []
    for path in backups:
        with sqlite3.connect(path) as check:
            assert check.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            assert check.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert oct(path.stat().st_mode & 0o777) == "0o600"
        # Every thread in the backup is as one committed transaction left it: appends and
        # the state write after them agree, and the log has no gap.
        settings = Settings(database_url=f"sqlite+aiosqlite:///{path}", auto_migrate=False,  # type: ignore[call-arg]
                            _env_file=None)
        async with running(settings) as app, http_client(app) as client:
            threads = await read_all(client, "/v1/threads")
            total = 0
            for thread in threads:
                messages = await read_all(client, f"/v1/threads/{thread['thread_id']}/messages")
                n = len(messages)
                assert [m["seq"] for m in messages] == list(range(1, n + 1))
                assert thread["message_count"] == n and n % 2 == 0
                # Create (revision 1), then per i an append and a state write: a backup
                # falls between two transactions, never inside one.
                assert (thread["state"], thread["revision"]) in (
                    ({"i": n // 2}, n + 1), ({"i": n // 2 - 1}, n)), (thread, n)
                total += n
            sizes.append(total)
    assert sizes == sorted(sizes), "later backups hold more"
    refused = agentstate("postgresql+asyncpg://postgres@127.0.0.1/x", "backup",
                         str(tmp_path / "pg.db"))
    assert refused.returncode == 2 and "pg_dump" in refused.stderr
