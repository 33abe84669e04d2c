"""Failover: a private primary with a streaming standby made by pg_basebackup (synchronous
replication), the primary SIGKILLed under load, the standby promoted. A real `agentstate
serve` on a libpq-style multi-host URL (`target_session_attrs=read-write`) reaches the new
primary without a restart; while there is no primary, writes answer 503 with Retry-After;
every write acknowledged before, during and after is on the new primary (docs/SCALING.md).

Never the shared Postgres: both clusters are the test's own (tests/components.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.components import PrivatePostgres
from tests.support import ServerProcess, agentstate, eventually, pg_connect

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def replicated() -> Iterator[tuple[PrivatePostgres, PrivatePostgres]]:
    primary = PrivatePostgres().initdb(synchronous_standby_names="standby1",
                                       synchronous_commit="on").start()
    standby: PrivatePostgres | None = None
    try:
        standby = primary.basebackup("standby1").start()
        yield primary, standby
    finally:
        for cluster in (standby, primary):
            if cluster is not None:
                cluster.stop()
        primary.remove()


async def replication_state(primary: PrivatePostgres) -> str | None:
    connection = await pg_connect(primary.url())
    try:
        return await connection.fetchval(
            "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby1'")
    finally:
        await connection.close()


async def test_the_service_follows_a_promoted_standby_and_loses_no_acknowledged_write(
        replicated: tuple[PrivatePostgres, PrivatePostgres], uid: str) -> None:
    primary, standby = replicated
    for _ in range(100):
        if await replication_state(primary) == "sync":
            break
        await asyncio.sleep(0.1)
    assert await replication_state(primary) == "sync"
    admin = await pg_connect(primary.url())
    await admin.execute("CREATE DATABASE agentstate")
    await admin.close()
    assert agentstate(primary.url("agentstate"), "migrate").returncode == 0

    url = (f"postgresql://postgres@/agentstate?host=127.0.0.1:{primary.port}"
           f"&host=127.0.0.1:{standby.port}&target_session_attrs=read-write")
    server = ServerProcess(url, env={"AGENTSTATE_CONNECT_TIMEOUT": "2",
                                     "AGENTSTATE_DATABASE_TIMEOUT": "3"})
    server.start(timeout=120)
    clients, per_client = 6, 30
    acknowledged: set[str] = set()
    outage: list[tuple[int, bool]] = []  # (status, Retry-After present) of failed writes
    killed_at: list[float] = []
    promoted_at: list[float] = []
    first_write_after: list[float] = []  # the first 201 of a request sent after the kill
    try:
        async def append(client: httpx.AsyncClient, key: str) -> None:
            for _ in range(600):
                sent = time.monotonic()
                try:
                    response = await client.post(
                        f"/v1/threads/fo-{uid}/messages", headers={"Idempotency-Key": key},
                        json={"role": "user", "content": key})
                except httpx.TransportError as error:
                    raise AssertionError(f"the server itself failed: {error!r}") from error
                if response.status_code == 201:
                    acknowledged.add(key)
                    if killed_at and sent > killed_at[0] and not first_write_after:
                        first_write_after.append(time.monotonic())
                    return
                if response.status_code != 409:  # 409: its own earlier try still in flight
                    outage.append((response.status_code, "retry-after" in response.headers))
                await asyncio.sleep(0.05)
            raise AssertionError(f"{key} never succeeded")

        async def appender(c: int) -> None:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
                for a in range(per_client):
                    await append(client, f"{c}-{a}")

        async def crash_and_promote() -> None:
            await eventually(lambda: len(acknowledged) >= 40, "writes are flowing")
            killed_at.append(time.monotonic())
            primary.kill()
            await asyncio.sleep(2.0)  # an outage with no primary at all
            await asyncio.to_thread(standby.promote)
            promoted_at.append(time.monotonic())

        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as setup:
            created = await setup.put(f"/v1/threads/fo-{uid}", json={"state": {}})
            assert created.status_code == 201, created.text
        await asyncio.gather(crash_and_promote(), *(appender(c) for c in range(clients)))
        async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as probe:
            ready = await probe.get("/readyz")
        assert ready.status_code == 200, ready.text
    finally:
        server.stop()

    connection = await pg_connect(standby.url("agentstate"))
    try:
        assert await connection.fetchval("SELECT pg_is_in_recovery()") is False
        stored = [row["content"] for row in await connection.fetch(
            "SELECT m.content #>> '{}' AS content FROM messages m JOIN threads t ON t.id ="
            " m.thread_pk WHERE t.thread_id = $1", f"fo-{uid}")]
    finally:
        await connection.close()
    lost = acknowledged - set(stored)
    duplicated = len(stored) - len(set(stored))
    (killed,), (promoted,), (recovered,) = killed_at, promoted_at, first_write_after
    print(f"\nfailover (synchronous): {clients * per_client} appends, {len(acknowledged)} "
          f"acknowledged, {len(outage)} answered 503 meanwhile, {len(lost)} lost, "
          f"{duplicated} duplicated; first write {recovered - killed:.2f} s after the primary "
          f"died, {recovered - promoted:.2f} s after the promotion returned")
    assert len(acknowledged) == clients * per_client
    assert lost == set() and duplicated == 0
    assert outage, "no write met the outage: the test proved nothing"
    errors = [line for line in server.logs().splitlines()
              if '"status": 500' in line or '"level": "error"' in line]
    assert {status for status, _ in outage} == {503}, "\n".join(errors[:5])
    assert all(retry_after for _, retry_after in outage)
