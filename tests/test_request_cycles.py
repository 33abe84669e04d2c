"""A request leaves nothing for Python's cycle collector.

Objects in a reference cycle are freed only by a collection, which CPython starts after every
700 net allocations and which, at its oldest generation, walks the whole heap. A request that
left a cycle behind (the unit of work holding the request, whose scope held the unit) made a
collection every 17 requests, and a full one every few thousand (docs/PERFORMANCE.md). What
an agent asks each turn is tried: reads, writes, the store, checkpoints, the feed, and
refusals (404, 409, 412, 422), whose exceptions carry tracebacks."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI

from tests.support import cyclic_garbage

pytestmark = pytest.mark.anyio


def ours(names: list[str]) -> list[str]:
    """The server's (its own objects, its connections): the test's client and transport
    have cycles of their own."""
    return [name for name in names if name.startswith(("app.", "sqlalchemy.", "asyncpg.",
                                                       "fastapi.", "starlette."))]


async def test_requests_of_every_kind_leave_no_cycles(app: FastAPI, client: httpx.AsyncClient,
                                                      uid: str) -> None:
    thread = f"/v1/threads/{uid}"
    assert (await client.put(thread, json={"state": {"n": 0}})).status_code == 201
    for n in range(1, 5):  # the first round makes what is made once (caches, plans)
        with cyclic_garbage() as found:
            answers = [
                await client.get(thread),
                await client.put(thread, headers={"If-Match": f'"{2 * n - 1}"'},
                                 json={"state": {"n": n}}),
                await client.post(f"{thread}/messages", json={"role": "user", "content": "hi"}),
                await client.get(f"{thread}/messages", params={"order": "desc", "limit": 20}),
                await client.put(f"/v1/store/items/{uid}/k{n}", json={"value": {"n": n}}),
                await client.get(f"/v1/store/items/{uid}/k{n}"),
                await client.post("/v1/store/items/search", json={"namespace_prefix": [uid]}),
                await client.get("/v1/events", params={"thread_id": uid}),
                await client.post(f"{thread}/checkpoints/batch", json={"checkpoints": [{
                    "checkpoint_id": f"c{n}", "parent_checkpoint_id": f"c{n - 1}" if n > 1
                    else None, "metadata": {"step": n}, "values": [],
                    "checkpoint": {"v": 4, "id": f"c{n}", "ts": "2026-12-06T00:00:00+00:00",
                                   "channel_versions": {}, "versions_seen": {}}}]}),
                await client.get(f"{thread}/checkpoints/latest"),
                await client.post("/v1/threads", json={"thread_id": f"{uid}-{n}"}),
            ]
            assert all(a.status_code < 300 for a in answers), [a.text for a in answers]
            refused = [
                await client.get(f"{thread}-missing"),
                await client.put(thread, headers={"If-Match": '"1"'}, json={"state": {}}),
                await client.post(f"{thread}/messages", json={"role": "user", "bogus": 1}),
                await client.post("/v1/threads", json={"thread_id": uid}),
            ]
            assert [a.status_code for a in refused] == [404, 412, 422, 409]
        assert n == 1 or ours(found) == []
