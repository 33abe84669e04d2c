"""Pooled connections the database has dropped are replaced before a request uses them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import httpx
import pytest
from sqlalchemy.engine import make_url

from app.core.settings import Settings
from app.events.feed import COALESCE_SECONDS
from tests.conftest import http_client, running
from tests.support import Partition, pg_connect, pool_in_use, wait_until_blocked, write_lock

pytestmark = [pytest.mark.anyio, pytest.mark.postgres_only(
    reason="only a database server can drop a pooled connection from the other side")]


async def _terminate_backends(database: str, *, waiting_only: bool = False) -> int:
    """Kill the database's server backends (with `waiting_only`, those waiting on a lock).

    Returns once every one of them has exited (`pg_terminate_backend` with a timeout waits
    for that), so its socket is closed and the server's pool is told before the test goes
    on; a backend still there after 30 s fails the test.
    """
    admin = await pg_connect()
    try:
        results = await admin.fetch(
            "SELECT pg_terminate_backend(pid, 30000) AS gone FROM pg_stat_activity "
            "WHERE datname = $1 AND pid <> pg_backend_pid() AND application_name = 'agentstate' "
            "AND ($2 = false OR wait_event_type = 'Lock')", database, waiting_only)
    finally:
        await admin.close()
    assert all(row["gone"] for row in results), "a terminated backend did not exit"
    return len(results)


async def test_requests_survive_connections_killed_by_the_database(
    client: httpx.AsyncClient, database_url: str, uid: str
) -> None:
    assert (await client.post("/v1/threads", json={"thread_id": uid})).status_code == 201
    # Fill the pool with several connections, then have the server kill every one of them.
    warm = await asyncio.gather(*(client.get(f"/v1/threads/{uid}") for _ in range(8)))
    assert [r.status_code for r in warm] == [200] * 8
    assert await _terminate_backends(make_url(database_url).database) >= 1

    reads = await asyncio.gather(*(client.get(f"/v1/threads/{uid}") for _ in range(8)))
    assert [r.status_code for r in reads] == [200] * 8
    write = await client.put(f"/v1/threads/{uid}", json={"state": {"after": "outage"}},
                             headers={"If-Match": '"1"'})
    assert write.status_code == 200, write.text
    assert write.json()["state"] == {"after": "outage"}


async def test_a_write_whose_connection_dies_mid_transaction_answers_503(
    client: httpx.AsyncClient, database_url: str, uid: str
) -> None:
    """The backend is killed while the write waits inside its transaction: the client gets a
    503 with Retry-After (never a 500), nothing of the write is stored, and the next write
    on the same server succeeds."""
    database = make_url(database_url).database
    async with write_lock(database_url) as holder:
        assert holder is not None
        write = asyncio.create_task(client.post("/v1/threads", json={"thread_id": uid}))
        # The INSERT waits for the table lock, inside its transaction.
        await wait_until_blocked(database_url, holder)
        assert not write.done()
        assert await _terminate_backends(database, waiting_only=True) == 1
        response = await write
    assert response.status_code == 503, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert "Retry-After" in response.headers
    assert (await client.get(f"/v1/threads/{uid}")).status_code == 404
    assert (await client.post("/v1/threads", json={"thread_id": uid})).status_code == 201


@pytest.mark.parametrize("write", ["append", "batch"])
async def test_an_append_whose_connection_dies_mid_transaction_answers_503(
    client: httpx.AsyncClient, database_url: str, uid: str, write: str
) -> None:
    """As above for the writes whose statements go straight to asyncpg (app/db/direct.py):
    the append waits for its thread's row lock when the backend is killed. A 503 with
    Retry-After, nothing stored (no message, no new revision, no event), and the connection
    replaced: the same write then succeeds."""
    created = await client.post("/v1/threads", json={"thread_id": uid})
    assert created.status_code == 201, created.text
    (event,) = (await client.get("/v1/events", params={"thread_id": uid})).json()["data"]

    def send() -> Awaitable[httpx.Response]:
        message = {"id": "m1", "role": "user", "content": "hello"}
        if write == "append":
            return client.post(f"/v1/threads/{uid}/messages", json=message)
        return client.post("/v1/batch", json={"operations": [{
            "op": "thread.patch", "thread_id": uid, "if_match": '"1"',
            "body": {"state": {"k": 1}, "append_messages": [message]}}]})

    async with write_lock(database_url) as holder:
        assert holder is not None
        pending = asyncio.create_task(send())
        await wait_until_blocked(database_url, holder)
        assert await _terminate_backends(make_url(database_url).database,
                                         waiting_only=True) == 1
        response = await pending
    assert response.status_code == 503, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert "Retry-After" in response.headers
    thread = (await client.get(f"/v1/threads/{uid}")).json()
    assert (thread["revision"], thread["message_count"], thread["state"]) == (1, 0, {})
    events = (await client.get("/v1/events", params={"after": event["seq"],
                                                    "thread_id": uid})).json()["data"]
    assert events == []
    again = await send()
    assert again.status_code in (200, 201), again.text
    assert (await client.get(f"/v1/threads/{uid}/messages")).json()["data"][0]["id"] == "m1"


@pytest.mark.direct_postgres(reason="through PgBouncer the server's connection is to the "
                              "pooler, which outlives the backend: the write just succeeds")
async def test_without_pre_ping_a_write_on_a_killed_connection_answers_503(
    database_url: str, uid: str
) -> None:
    """With `AGENTSTATE_POOL_PRE_PING=false` a pooled connection the database killed is
    found by the write itself: its first statement goes straight to asyncpg
    (app/db/direct.py), whose BEGIN then fails. A 503, never a 500; the dead connection is
    dropped, so the write sent again succeeds."""
    settings = Settings(database_url=database_url, auto_migrate=False, pool_pre_ping=False,
                        _env_file=None)  # type: ignore[call-arg]
    async with running(settings) as application, httpx.AsyncClient(
            transport=httpx.ASGITransport(app=application, raise_app_exceptions=False),
            base_url="http://agentstate.test") as client:
        assert (await client.post("/v1/threads", json={"thread_id": uid})).status_code == 201
        # The create's sequencing pass runs in the background a moment later: let it take
        # (and give back) its pooled connection first, or it would be the one to find the
        # killed connection instead of the append.
        await asyncio.sleep(COALESCE_SECONDS * 10)
        assert await _terminate_backends(make_url(database_url).database) >= 1
        message = {"id": "m1", "role": "user", "content": "hello"}
        failed = await client.post(f"/v1/threads/{uid}/messages", json=message)
        assert failed.status_code == 503, failed.text
        assert failed.headers["content-type"] == "application/problem+json"
        again = await client.post(f"/v1/threads/{uid}/messages", json=message)
        assert again.status_code == 201, again.text


async def _backends(database: str) -> set[int]:
    """The server's backends on `database`."""
    admin = await pg_connect()
    try:
        rows = await admin.fetch("SELECT pid FROM pg_stat_activity WHERE datname = $1 "
                                 "AND application_name = 'agentstate'", database)
    finally:
        await admin.close()
    return {row["pid"] for row in rows}


@pytest.mark.direct_postgres(reason="through PgBouncer the server's connections are to the "
                              "pooler, whose backends a recycle does not end")
async def test_a_connection_older_than_pool_recycle_is_replaced(
    fresh_url: str, uid: str
) -> None:
    """A request checks its pooled connection out without SQLAlchemy's greenlet where that
    sends nothing (app/db/engine.py, `checkout_in_place`). One past `pool_recycle` is still
    replaced, and the pool's gauge of connections in use counts it once: none are in use
    after the requests."""
    database = make_url(fresh_url).database or ""
    settings = Settings(database_url=fresh_url, auto_migrate=False, pool_recycle=1,
                        _env_file=None)  # type: ignore[call-arg]
    async with running(settings) as application, http_client(application) as client:
        assert (await client.post("/v1/threads", json={"thread_id": uid})).status_code == 201
        await asyncio.sleep(COALESCE_SECONDS * 10)  # the create's sequencing pass is done
        before = await _backends(database)
        await asyncio.sleep(1.2)
        for _ in range(3):
            assert (await client.get(f"/v1/threads/{uid}")).status_code == 200
        deadline = asyncio.get_running_loop().time() + 30  # only stops a hang
        while before <= (now := await _backends(database)):
            assert asyncio.get_running_loop().time() < deadline, "no connection was replaced"
            await asyncio.sleep(0.05)
        assert now - before, "a new connection replaced the old one"
        await _none_in_use(client)


async def test_an_idle_connection_gone_quiet_is_pinged_and_replaced(
    database_url: str, uid: str
) -> None:
    """After `pool_ping_idle_seconds` without use a pooled connection is pinged before a
    request uses it, also where the checkout is made in place (`checkout_in_place`): one
    whose network went silent meanwhile (an old NAT flow, a failed-over address) fails its
    ping and is replaced, and the read answers 200. Unpinged, it would wait out the
    statement timeout and answer 503."""
    url = make_url(database_url)
    partition = Partition(url.host or "127.0.0.1", url.port or 5432)
    proxied = url.set(host="127.0.0.1", port=partition.port).render_as_string(
        hide_password=False)
    settings = Settings(database_url=proxied, auto_migrate=False, pool_ping_idle_seconds=0.5,
                        database_timeout=1, statement_timeout_ms=5000,
                        _env_file=None)  # type: ignore[call-arg]
    async with running(settings) as application, http_client(application) as client:
        try:
            made = await client.post("/v1/threads", json={"thread_id": uid})
            assert made.status_code == 201, made.text
            await asyncio.sleep(0.7)
            partition.stall()
            answer = await client.get(f"/v1/threads/{uid}")
            assert answer.status_code == 200, answer.text
        finally:
            partition.close()  # the stalled connections end, so the pool closes at once


async def test_many_requests_on_a_small_pool_check_out_in_place_or_wait(
    database_url: str, uid: str
) -> None:
    """Forty clients at once on a pool of three: a request checks a free connection out in
    place, or waits for one as SQLAlchemy does. Every request is answered, every append is
    stored once, and no connection is counted in use at the end."""
    settings = Settings(database_url=database_url, auto_migrate=False, pool_size=2,
                        max_overflow=1, _env_file=None)  # type: ignore[call-arg]
    async with running(settings) as application, http_client(application) as client:
        assert (await client.post("/v1/threads", json={"thread_id": uid})).status_code == 201

        async def one(n: int) -> int:
            if n % 2:
                return (await client.get(f"/v1/threads/{uid}")).status_code
            message = {"id": f"m{n}", "role": "user", "content": str(n)}
            return (await client.post(f"/v1/threads/{uid}/messages", json=message)).status_code

        answers = await asyncio.gather(*(one(n) for n in range(40)))
        assert sorted(set(answers)) == [200, 201], answers
        thread = (await client.get(f"/v1/threads/{uid}")).json()
        assert thread["message_count"] == 20
        await _none_in_use(client)  # once the appends' sequencing pass has given its back


async def _none_in_use(client: httpx.AsyncClient) -> None:
    """Wait until the pool's gauge counts no connection in use (a background sequencing
    pass may hold one a moment longer); it never goes below zero."""
    deadline = asyncio.get_running_loop().time() + 30  # only stops a hang
    while True:
        metrics = (await client.get("/metrics")).text
        in_use = pool_in_use(metrics)
        assert in_use is not None and in_use >= 0, metrics
        if in_use == 0:
            return
        assert asyncio.get_running_loop().time() < deadline, metrics
        await asyncio.sleep(0.05)
