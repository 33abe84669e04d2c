"""Optimistic concurrency under real contention, on real databases (API.md section 2)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.support import ServerProcess

pytestmark = pytest.mark.anyio

CLIENTS = 50
INCREMENTS = 2


async def increment(client: httpx.AsyncClient, url: str, times: int) -> int:
    """Read-modify-write with If-Match, retrying on 412; returns the 412s it saw."""
    conflicts = 0
    for _ in range(times):
        while True:
            current = await client.get(url)
            assert current.status_code == 200, current.text
            state = current.json()["state"]
            response = await client.put(
                url, json={"state": {"n": state["n"] + 1}},
                headers={"If-Match": current.headers["etag"]},
            )
            if response.status_code == 200:
                break
            assert response.status_code == 412, response.text
            assert response.json()["code"] == "revision_mismatch"
            conflicts += 1
    return conflicts


async def run_increments(clients: list[httpx.AsyncClient], url: str) -> int:
    await clients[0].put(url, json={"state": {"n": 0}}, headers={"If-None-Match": "*"})
    results = await asyncio.gather(
        *(increment(clients[i % len(clients)], url, INCREMENTS) for i in range(CLIENTS))
    )
    final = (await clients[0].get(url)).json()
    total = CLIENTS * INCREMENTS
    assert final["state"]["n"] == total
    assert final["revision"] == 1 + total
    return sum(results)


async def test_many_clients_in_process(app, uid: str) -> None:
    # 50 independent clients against one app and one database; no lost update.
    clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
               for _ in range(CLIENTS)]
    try:
        conflicts = await run_increments(clients, f"/v1/threads/race-{uid}")
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))
    assert conflicts > 0, "the test must actually race"


@pytest.mark.slow
async def test_two_server_processes_share_one_database(database_url: str, uid: str) -> None:
    with ServerProcess(database_url) as one, ServerProcess(database_url) as two:
        limits = httpx.Limits(max_connections=CLIENTS)
        clients = [httpx.AsyncClient(base_url=server.base_url, limits=limits, timeout=60)
                   for server in (one, two)]
        try:
            conflicts = await run_increments(clients, f"/v1/threads/procs-{uid}")
        finally:
            await asyncio.gather(*(c.aclose() for c in clients))
        assert conflicts > 0
        assert "Traceback" not in one.logs() + two.logs()


async def test_create_race_is_a_conflict_not_a_500(app, uid: str) -> None:
    clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
               for _ in range(20)]
    try:
        put_only = await asyncio.gather(*(
            c.put(f"/v1/threads/c1-{uid}", json={"state": {"i": i}}, headers={"If-None-Match": "*"})
            for i, c in enumerate(clients)))
        posts = await asyncio.gather(*(
            c.post("/v1/threads", json={"thread_id": f"c2-{uid}"}) for c in clients))
        plain = await asyncio.gather(*(
            c.put(f"/v1/threads/c3-{uid}", json={"state": {}}) for c in clients))
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))
    assert sorted(r.status_code for r in put_only) == [201] + [412] * 19
    assert sorted(r.status_code for r in posts) == [201] + [409] * 19
    assert sorted(r.status_code for r in plain) == [201] + [428] * 19
