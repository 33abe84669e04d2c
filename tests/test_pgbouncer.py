"""agentstate behind PgBouncer 1.18 (Debian's package) in transaction pooling, with its stock
settings: real `agentstate serve` processes on a private PgBouncer in front of the shared
Postgres (docs/SCALING.md).

What a transaction pooler takes away, and what each test shows is kept: startup parameters
(the statement timeout still bounds a blocked write: 503, not 201), the session (no prepared
statement outlives its transaction), LISTEN (the feed wakes watchers through the direct URL,
or by polling without one), and a place to migrate through (`agentstate migrate` refuses).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator

import asyncpg
import httpx
import pytest

from tests.components import PgBouncer, migrated_postgres
from tests.support import (
    ROOT,
    ServerProcess,
    agentstate,
    create_postgres_database,
    drop_postgres_database,
    write_lock,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture(scope="module")
def direct() -> Iterator[str]:
    """A migrated database on the shared Postgres, reached directly."""
    with migrated_postgres() as url:
        yield url


@pytest.fixture(scope="module")
def pgbouncer() -> Iterator[PgBouncer]:
    with PgBouncer() as pooler:
        yield pooler


def serve_once(url: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`agentstate serve` that is expected to refuse to start."""
    import os

    from tests.support import free_port

    return subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--port", str(free_port())], cwd=ROOT,
        env={**os.environ, "AGENTSTATE_DATABASE_URL": url, **env}, capture_output=True,
        text=True, timeout=timeout, check=False)


def test_a_stock_pgbouncer_is_named_with_the_setting_to_change(direct: str,
                                                               pgbouncer: PgBouncer) -> None:
    done = serve_once(pgbouncer.url(direct), {"AGENTSTATE_DATABASE_POOLER": "none"})
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("agentstate:")]
    assert len(lines) == 1 and "AGENTSTATE_DATABASE_POOLER=transaction" in lines[0], done.stderr
    assert "unsupported startup parameter" in lines[0]
    assert "Traceback" not in done.stderr


def test_a_pooler_that_drops_the_statement_timeout_is_refused(direct: str) -> None:
    """The operator's workaround of old (ignore_startup_parameters) lost the timeout in
    silence; the server now sees it and says what to set instead."""
    ignoring = PgBouncer(
        ignore_startup_parameters="statement_timeout,idle_in_transaction_session_timeout")
    with ignoring:
        done = serve_once(ignoring.url(direct), {"AGENTSTATE_DATABASE_POOLER": "none",
                                                 "AGENTSTATE_LOG_FORMAT": "text"})
    assert done.returncode == 2, done.stderr
    assert "statement_timeout=0 ms, not the 30000 ms" in done.stderr, done.stderr
    assert "AGENTSTATE_DATABASE_POOLER=transaction" in done.stderr
    assert "Traceback" not in done.stderr


async def test_a_write_blocked_on_a_lock_answers_503_statement_timeout(
        direct: str, pgbouncer: PgBouncer, uid: str) -> None:
    with ServerProcess(pgbouncer.url(direct),
                       env={"AGENTSTATE_STATEMENT_TIMEOUT_MS": "500"}) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            ready = await client.get("/readyz")
            assert ready.status_code == 200, ready.text
            async with write_lock(direct):
                blocked = await client.put(f"/v1/threads/blocked-{uid}", json={"state": {}})
            assert blocked.status_code == 503, blocked.text
            assert blocked.json()["code"] == "statement_timeout"
            assert "retry-after" in blocked.headers
            # The lock gone, the same write goes through: nothing was left half-done.
            again = await client.put(f"/v1/threads/blocked-{uid}", json={"state": {}})
            assert again.status_code == 201, again.text


async def test_no_prepared_statement_outlives_its_transaction(direct: str, uid: str) -> None:
    """Two servers share ONE server connection (default_pool_size=1), so every transaction
    of each runs on a session the other used last: a cached or named statement of one would
    be found by the other ("prepared statement ... already exists") or left behind."""
    with PgBouncer(default_pool_size=1) as narrow:
        url = narrow.url(direct)
        with ServerProcess(url) as one, ServerProcess(url) as two:
            async with httpx.AsyncClient(timeout=60) as client:
                async def work(base: str, n: int) -> list[int]:
                    thread = f"{base}/v1/threads/prep-{uid}-{n}"
                    codes = [(await client.put(thread, json={"state": {"n": n}})).status_code]
                    for i in range(5):
                        codes.append((await client.post(
                            f"{thread}/messages", headers={"If-Match": "*"},
                            json={"messages": [{"role": "user", "content": f"m{i}"}]}))
                            .status_code)
                        codes.append((await client.get(thread)).status_code)
                    codes.append((await client.get(f"{base}/v1/events",
                                                   params={"limit": 5})).status_code)
                    return codes

                results = await asyncio.gather(*(work(server.base_url, 2 * n + i)
                                                 for n in range(16)
                                                 for i, server in enumerate((one, two))))
            assert {code for codes in results for code in codes} <= {200, 201}, results
            assert "Traceback" not in one.logs() + two.logs()
        # The one server connection, after all of that: no named statement was left on it
        # (asked through PgBouncer, in a transaction: on that very session).
        pooled = await asyncpg.connect(host="127.0.0.1", port=narrow.port, user="postgres",
                                       database=url.rsplit("/", 1)[1], statement_cache_size=0)
        try:
            async with pooled.transaction():
                left = await pooled.fetch("SELECT name, statement FROM pg_prepared_statements")
        finally:
            await pooled.close()
        assert left == []


async def next_event(client: httpx.AsyncClient, base: str, prefix: str,
                     cursor: str | None) -> tuple[float, dict]:
    started = time.monotonic()
    params = {"resource_prefix": prefix, "wait": 20, **({"cursor": cursor} if cursor else {})}
    page = await client.get(f"{base}/v1/events", params=params)
    assert page.status_code == 200, page.text
    return time.monotonic() - started, page.json()


@pytest.mark.parametrize("wake", ["listen", "poll"])
async def test_watchers_of_another_server_wake(direct: str, pgbouncer: PgBouncer, uid: str,
                                               wake: str) -> None:
    """A long poll on one server is answered when another server writes: woken by LISTEN on
    the direct URL, or without one by the poll (every 0.2 s here). The tick, which would
    wake it too, is set beyond the wait, so only the mechanism under test can."""
    env = {"AGENTSTATE_EVENTS_TICK_SECONDS": "600"}
    if wake == "listen":
        env |= {"AGENTSTATE_DIRECT_DATABASE_URL": direct, "AGENTSTATE_EVENTS_POLL_SECONDS": "600"}
    else:
        env |= {"AGENTSTATE_EVENTS_POLL_SECONDS": "0.2"}
    url = pgbouncer.url(direct)
    with ServerProcess(url, env=env) as writer, ServerProcess(url, env=env) as watcher:
        async with httpx.AsyncClient(timeout=60) as client:
            prefix, cursor = f"/v1/threads/wake-{uid}-", None
            for n in range(3):
                waiting = asyncio.create_task(next_event(client, watcher.base_url, prefix,
                                                         cursor))
                await asyncio.sleep(0.5)  # the long poll is parked on the watcher server
                assert not waiting.done()
                put = await client.put(f"{writer.base_url}/v1/threads/wake-{uid}-{n}",
                                       json={"state": {}})
                assert put.status_code == 201, put.text
                waited, body = await waiting
                assert [event["resource"] for event in body["data"]] == [
                    f"/v1/threads/wake-{uid}-{n}"], body
                assert waited < 20, f"woken only by the end of the wait ({waited:.1f} s)"
                cursor = body["next_cursor"]


def test_migrate_refuses_the_pooler_and_runs_on_the_direct_url(pgbouncer: PgBouncer) -> None:
    url = create_postgres_database()
    try:
        refused = agentstate(pgbouncer.url(url), "migrate")
        assert refused.returncode == 2, refused.stderr
        (line,) = refused.stderr.strip().splitlines()
        assert "transaction pooler" in line and "AGENTSTATE_DIRECT_DATABASE_URL" in line, line
        done = agentstate(pgbouncer.url(url), "migrate",
                          env={"AGENTSTATE_DIRECT_DATABASE_URL": url})
        assert done.returncode == 0, done.stderr
        assert "migrated from an empty database" in done.stderr
        with ServerProcess(pgbouncer.url(url)) as server:
            assert httpx.get(f"{server.base_url}/readyz", timeout=10).status_code == 200
    finally:
        drop_postgres_database(url)
