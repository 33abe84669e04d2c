"""Pooled connections the database has dropped are replaced before a request uses them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import httpx
import pytest
from sqlalchemy.engine import make_url

from app.core.settings import Settings
from app.events.feed import COALESCE_SECONDS
from tests.conftest import running
from tests.support import pg_connect, wait_until_blocked, write_lock

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
