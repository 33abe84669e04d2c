"""Agent states over HTTP: API.md section 6 under section 2, on SQLite and Postgres."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.support import wait_until_blocked

pytestmark = pytest.mark.anyio


def url(thread: str, agent: str) -> str:
    return f"/v1/threads/{thread}/agents/{agent}/state"


async def test_conditional_requests(client: httpx.AsyncClient, uid: str) -> None:
    u = url(f"t-{uid}", "planner")
    missing = await client.put(u, json={"state": {}}, headers={"If-Match": '"1"'})
    assert missing.status_code == 412 and missing.json()["current_revision"] is None
    assert (await client.get(f"/v1/threads/t-{uid}")).status_code == 404, \
        "a failed write takes the thread it would have created back with it"

    created = await client.put(u, json={"state": {"step": 1}})
    assert created.status_code == 201, created.text
    assert created.headers["etag"] == '"1"' and created.headers["location"] == u
    body = created.json()
    assert body == {"thread_id": f"t-{uid}", "agent_name": "planner", "revision": 1,
                    "state": {"step": 1}, "created_at": body["created_at"],
                    "updated_at": body["updated_at"]}
    thread = (await client.get(f"/v1/threads/t-{uid}")).json()
    assert thread["revision"] == 1 and thread["state"] == {}, "the write created the thread"

    assert (await client.get(u)).json() == body
    cached = await client.get(u, headers={"If-None-Match": '"1"'})
    assert cached.status_code == 304 and cached.content == b"" and cached.headers["etag"] == '"1"'
    assert (await client.get(u, headers={"If-None-Match": '"0"'})).status_code == 200

    no_header = await client.put(u, json={"state": {"step": 2}})
    assert no_header.status_code == 428 and "If-Match" in no_header.json()["detail"]
    ok = await client.put(u, json={"state": {"step": 2}}, headers={"If-Match": '"1"'})
    assert ok.status_code == 200 and ok.headers["etag"] == '"2"'
    stale = await client.put(u, json={"state": {"step": 3}}, headers={"If-Match": '"1"'})
    assert stale.status_code == 412 and stale.json()["code"] == "revision_mismatch"
    assert stale.json()["current_revision"] == 2
    weak = await client.put(u, json={"state": {}}, headers={"If-Match": 'W/"2"'})
    assert weak.status_code == 412
    same = await client.put(u, json={"state": {"step": 2}}, headers={"If-Match": "*"})
    assert same.status_code == 200 and same.json()["revision"] == 3, "a no-op PUT is a revision"
    only = await client.put(u, json={"state": {}}, headers={"If-None-Match": "*"})
    assert only.status_code == 412 and only.json()["code"] == "already_exists"
    assert only.json()["current_revision"] == 3

    assert (await client.get(f"/v1/threads/t-{uid}")).json()["revision"] == 1, \
        "agent-state writes do not change the thread's revision"

    assert (await client.delete(u)).status_code == 428
    assert (await client.delete(u, headers={"If-Match": '"2"'})).status_code == 412
    gone = await client.delete(u, headers={"If-Match": '"3"'})
    assert gone.status_code == 204 and gone.content == b""
    assert (await client.get(u)).status_code == 404
    assert (await client.delete(u, headers={"If-Match": "*"})).status_code == 412
    assert (await client.delete(u)).status_code == 404
    old_etag = await client.put(u, json={"state": {}}, headers={"If-Match": '"3"'})
    assert old_etag.status_code == 412 and old_etag.json()["current_revision"] is None
    again = await client.put(u, json={"state": {"fresh": True}})
    assert again.status_code == 201
    assert again.json()["revision"] == 5, "revisions continue after the deletion's (4)"


async def test_create_only_put(client: httpx.AsyncClient, uid: str) -> None:
    u = url(uid, "a")
    first = await client.put(u, json={"state": {"x": 1}}, headers={"If-None-Match": "*"})
    assert first.status_code == 201 and first.json()["revision"] == 1


async def test_merge_patch(client: httpx.AsyncClient, uid: str) -> None:
    u = url(uid, "critic")
    missing = await client.patch(u, json={"state": {"a": 1}})
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"
    missing_if = await client.patch(u, json={"state": {}}, headers={"If-Match": "*"})
    assert missing_if.status_code == 412 and missing_if.json()["current_revision"] is None
    assert (await client.get(f"/v1/threads/{uid}")).status_code == 404, "PATCH never creates"

    await client.put(u, json={"state": {"a": 1, "b": {"c": 2, "d": 3}, "list": [1, 2]}})
    assert (await client.patch(u, json={"state": {"a": 2}})).status_code == 428
    patched = await client.patch(
        u, content=b'{"state": {"b": {"c": null, "e": [1]}, "list": [3], "z": true}}',
        headers={"If-Match": '"1"', "content-type": "application/merge-patch+json"},
    )
    assert patched.status_code == 200, patched.text
    assert patched.json()["state"] == {"a": 1, "b": {"d": 3, "e": [1]}, "list": [3], "z": True}
    assert patched.headers["etag"] == '"2"'
    empty = await client.patch(u, json={}, headers={"If-Match": '"2"'})
    assert empty.status_code == 200 and empty.json()["revision"] == 3
    assert empty.json()["state"]["a"] == 1
    cleared = await client.patch(u, json={"state": None}, headers={"If-Match": '"3"'})
    assert cleared.json()["state"] == {} and cleared.json()["revision"] == 4
    stale = await client.patch(u, json={"state": {}}, headers={"If-Match": '"1"'})
    assert stale.status_code == 412 and stale.json()["current_revision"] == 4
    unknown = await client.patch(u, json={"revision": 9}, headers={"If-Match": '"4"'})
    assert unknown.status_code == 422 and unknown.json()["code"] == "unknown_field"


async def test_bad_input(client: httpx.AsyncClient, uid: str) -> None:
    for body in ({}, {"state": []}, {"state": {}, "extra": 1}):
        r = await client.put(url(uid, "a"), json=body)
        assert r.status_code == 422, (body, r.text)
        assert r.headers["content-type"] == "application/problem+json"
    assert (await client.put(url(uid, ".hidden"), json={"state": {}})).status_code == 422
    r = await client.get("/v1/agent-states", params={"state_contains": "[1]"})
    assert r.status_code == 422 and r.json()["errors"][0]["parameter"] == "state_contains"
    r = await client.get("/v1/agent-states", params={"cursor": "nope"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_cursor"
    r = await client.get("/v1/agent-states", params={"agent_name": "a b"})
    assert r.status_code == 422
    assert (await client.get(f"/v1/threads/none-{uid}/agents")).status_code == 404


async def test_thread_deletion_takes_agent_states(client: httpx.AsyncClient, uid: str) -> None:
    await client.put(url(uid, "a"), json={"state": {"k": 1}})
    await client.put(url(uid, "b"), json={"state": {"k": 2}})
    listed = (await client.get(f"/v1/threads/{uid}/agents")).json()
    assert [s["agent_name"] for s in listed["data"]] == ["a", "b"]

    assert (await client.delete(f"/v1/threads/{uid}", headers={"If-Match": '"1"'})).status_code == 204
    assert (await client.get(url(uid, "a"))).status_code == 404
    for method, kwargs in [("PUT", {"json": {"state": {}}}),
                           ("PUT", {"json": {"state": {}}, "headers": {"If-None-Match": "*"}}),
                           ("PATCH", {"json": {"state": {}}, "headers": {"If-Match": "*"}}),
                           ("DELETE", {"headers": {"If-Match": "*"}})]:
        late = await client.request(method, url(uid, "a"), **kwargs)
        assert late.status_code == 410, (method, late.text)
        assert late.json()["code"] == "thread_deleted"
    assert (await client.get(f"/v1/threads/{uid}")).status_code == 404, "nothing resurrected"
    query = await client.get("/v1/agent-states", params={"thread_id": uid})
    assert query.json()["data"] == []

    await client.put(f"/v1/threads/{uid}", json={"state": {}}, headers={"If-None-Match": "*"})
    assert (await client.get(f"/v1/threads/{uid}/agents")).json()["data"] == []


async def test_lists_page_in_name_order(client: httpx.AsyncClient, uid: str) -> None:
    # Mixed case and punctuation: byte order on both backends, whatever the locale.
    threads = [f"{uid}-B", f"{uid}-a", f"{uid}-_"]
    agents = ["Zed", "alpha", "beta.2", "beta:1", "@x"]
    for thread in threads:
        for agent in agents:
            r = await client.put(url(thread, agent), json={"state": {"run": uid}})
            assert r.status_code == 201
    expected = sorted((t, a) for t in threads for a in agents)

    async def walk(path: str, params: dict) -> list[tuple[str, str]]:
        seen: list[tuple[str, str]] = []
        cursor = None
        while True:
            page = await client.get(path, params={**params, "limit": 4,
                                                  **({"cursor": cursor} if cursor else {})})
            assert page.status_code == 200, page.text
            body = page.json()
            seen += [(s["thread_id"], s["agent_name"]) for s in body["data"]]
            if not body["has_more"]:
                assert body["next_cursor"] is None and "link" not in page.headers
                return seen
            assert body["next_cursor"] in page.headers["link"]
            cursor = body["next_cursor"]

    assert await walk("/v1/agent-states", {"state_contains": json.dumps({"run": uid})}) == expected
    assert await walk(f"/v1/threads/{threads[0]}/agents", {}) == [
        (threads[0], a) for a in sorted(agents)]
    assert await walk("/v1/agent-states", {"agent_name": "alpha",
                                           "state_contains": json.dumps({"run": uid})}) == [
        (t, "alpha") for t in sorted(threads)]
    assert await walk("/v1/agent-states", {"thread_id": threads[1], "agent_name": "Zed"}) == [
        (threads[1], "Zed")]


STATES = [
    {"status": "running", "tools": ["search", "code"], "cfg": {"model": "m1", "temp": 0.2},
     "steps": [{"name": "plan", "ok": True}, {"name": "act", "ok": False}], "n": 1},
    {"status": "done", "tools": ["search"], "cfg": {"model": "m2", "temp": 1},
     "steps": [{"name": "plan", "ok": True}], "n": 1.0, "flag": False},
    {"status": "running", "tools": [], "cfg": {"model": "m1", "nested": {"deep": [1, [2, 3]]}},
     "n": "1", "flag": 0},
    {"status": "idle", "tools": ["code", "search", "code"], "cfg": {}, "n": None,
     "tags": [["a", "b"], ["c"]]},
]
QUERIES = [
    {"status": "running"},
    {"tools": ["search"]},
    {"tools": ["code", "search"]},
    {"tools": []},
    {"tools": "search"},
    {"cfg": {"model": "m1"}},
    {"cfg": {}},
    {"cfg": {"temp": 1.0}},
    {"cfg": {"nested": {"deep": [[3]]}}},
    {"cfg": {"nested": {"deep": [2]}}},
    {"steps": [{"ok": True}]},
    {"steps": [{"name": "act", "ok": False}, {"name": "plan"}]},
    {"steps": [{"name": "act", "ok": True}]},
    {"n": 1},
    {"n": "1"},
    {"n": None},
    {"flag": False},
    {"flag": 0},
    {"tags": [["b"]]},
    {"tags": [["a", "c"]]},
    {"status": "running", "cfg": {"model": "m1"}, "tools": ["code"]},
    {"missing": None},
    {},
]


# What Postgres itself answers for the queries above (`state::jsonb @> query::jsonb`), so the
# SQLite implementation is held to the real thing, not to our own reading of it.
POSTGRES_ANSWERS = [
    [0, 2], [0, 1, 3], [0, 3], [0, 1, 2, 3], [], [0, 2], [0, 1, 2, 3], [1], [2], [], [0, 1],
    [0], [], [0, 1], [2], [3], [1], [2], [3], [], [0], [], [0, 1, 2, 3],
]


async def test_containment_matches_postgres(client: httpx.AsyncClient, uid: str) -> None:
    for i, state in enumerate(STATES):
        await client.put(url(uid, f"agent{i}"), json={"state": state})
    for query, want in zip(QUERIES, POSTGRES_ANSWERS, strict=True):
        r = await client.get("/v1/agent-states", params={
            "thread_id": uid, "state_contains": json.dumps(query), "limit": 100})
        assert [s["agent_name"] for s in r.json()["data"]] == [f"agent{i}" for i in want], query


async def test_one_row_per_agent_and_create_race(app, uid: str) -> None:
    clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
               for _ in range(20)]
    try:
        only = await asyncio.gather(*(
            c.put(url(f"r1-{uid}", "a"), json={"state": {"i": i}}, headers={"If-None-Match": "*"})
            for i, c in enumerate(clients)))
        plain = await asyncio.gather(*(
            c.put(url(f"r2-{uid}", "a"), json={"state": {"i": i}}) for i, c in enumerate(clients)))
        # Many agents saving into one new thread at once: the thread is created exactly once.
        many = await asyncio.gather(*(
            c.put(url(f"r3-{uid}", f"agent{i}"), json={"state": {"i": i}})
            for i, c in enumerate(clients)))
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))
    assert sorted(r.status_code for r in only) == [201] + [412] * 19
    assert sorted(r.status_code for r in plain) == [201] + [428] * 19
    assert [r.status_code for r in many] == [201] * 20
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        listed = await c.get(f"/v1/threads/r3-{uid}/agents", params={"limit": 100})
        assert len(listed.json()["data"]) == 20
        assert (await c.get(f"/v1/threads/r3-{uid}")).json()["revision"] == 1
        events = await c.get("/v1/events", params={"thread_id": f"r3-{uid}", "limit": 100,
                                                   "type": "thread.created"})
        assert len(events.json()["data"]) == 1


async def test_concurrent_if_match_one_winner(app, uid: str) -> None:
    u = url(uid, "a")
    clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
               for _ in range(20)]
    try:
        await clients[0].put(u, json={"state": {}})
        results = await asyncio.gather(*(
            c.put(u, json={"state": {"i": i}}, headers={"If-Match": '"1"'})
            for i, c in enumerate(clients)))
        patches = await asyncio.gather(*(
            c.patch(u, json={"state": {"p": i}}, headers={"If-Match": '"2"'})
            for i, c in enumerate(clients)))
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))
    assert sorted(r.status_code for r in results) == [200] + [412] * 19
    assert sorted(r.status_code for r in patches) == [200] + [412] * 19


async def test_write_racing_a_thread_delete_never_resurrects_it(app, client: httpx.AsyncClient,
                                                                database_url: str,
                                                                uid: str) -> None:
    """A DELETE of the thread is under way (row deleted, tombstone written, not committed)
    when an agent-state write arrives. The write waits for it, then must answer 410: the
    tombstone it finds is a deletion that won, not an id to start afresh."""
    from app.db.base import utcnow
    from app.threads.repository import ThreadRepository

    await client.put(f"/v1/threads/{uid}", json={"state": {}})
    async with app.state.db.write() as session:
        threads = ThreadRepository(session, "default")
        row = await threads.get(uid, lock="update")
        await threads.delete(uid, row.revision, utcnow())
        late = asyncio.create_task(client.put(url(uid, "a"), json={"state": {}}))
        if session.dialect.name == "postgresql":
            # The write has reached the thread row and waits on this transaction's lock.
            holder = (await session.exec_driver_sql("SELECT pg_backend_pid()")).scalar_one()
            await wait_until_blocked(database_url, holder)
        # On SQLite the write cannot begin before this transaction ends (one writer at a
        # time: this process's write queue, then BEGIN IMMEDIATE), so it always reads the
        # committed tombstone, whenever it arrives; there is no wait to observe.
        await session.commit()
    response = await late
    assert response.status_code == 410, response.text
    assert (await client.get(f"/v1/threads/{uid}")).status_code == 404
