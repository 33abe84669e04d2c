"""A fork records where it came from (`forked_from`), and a thread's forks are listed with
`GET /v1/threads?forked_from=`, on SQLite and Postgres, through HTTP."""

from __future__ import annotations

import httpx
import pytest

from tests.support import bearer, create_key

pytestmark = pytest.mark.anyio


async def put(client: httpx.AsyncClient, thread_id: str, state: dict,
              revision: int | None = None, **headers: str) -> dict:
    headers = {"If-Match": f'"{revision}"'} if revision else {"If-None-Match": "*", **headers}
    response = await client.put(f"/v1/threads/{thread_id}", json={"state": state},
                                headers=headers)
    assert response.status_code in (200, 201), response.text
    return response.json()


async def fork(client: httpx.AsyncClient, source: str, new: str, revision: int | None = None,
               **headers: str) -> dict:
    body = {"thread_id": new, **({"revision": revision} if revision else {})}
    response = await client.post(f"/v1/threads/{source}/fork", json=body, headers=headers)
    assert response.status_code == 201, response.text
    return response.json()


async def forks_of(client: httpx.AsyncClient, source: str, **params: object) -> list[str]:
    """Every fork of `source`, following the pages (one thread a page)."""
    found: list[str] = []
    cursor = None
    while True:
        page = await client.get("/v1/threads", params={
            "forked_from": source, "limit": 1, **params, **({"cursor": cursor} if cursor else {})})
        assert page.status_code == 200, page.text
        body = page.json()
        for thread in body["data"]:
            assert thread["forked_from"]["thread_id"] == source
        found += [thread["thread_id"] for thread in body["data"]]
        if not body["has_more"]:
            return found
        cursor = body["next_cursor"]


async def test_a_fork_records_its_source_and_the_source_lists_its_forks(
        client: httpx.AsyncClient, uid: str) -> None:
    source, early, now, deeper = f"s-{uid}", f"e-{uid}", f"n-{uid}", f"d-{uid}"
    created = await put(client, source, {"step": 1})
    assert created["forked_from"] is None, "a thread no fork made says so"
    await put(client, source, {"step": 2}, 1)

    made = await fork(client, source, early, revision=1)
    assert made["forked_from"] == {"thread_id": source, "revision": 1}
    assert (await fork(client, source, now))["forked_from"] == {"thread_id": source,
                                                                 "revision": 2}
    await fork(client, early, deeper)  # a fork of a fork is its source's fork only
    # The fork's later writes keep it; every representation carries it.
    written = await put(client, early, {"step": "own"}, 1)
    assert written["forked_from"] == {"thread_id": source, "revision": 1}
    got = await client.get(f"/v1/threads/{early}")
    assert got.json()["forked_from"] == {"thread_id": source, "revision": 1}
    with_messages = await client.get(f"/v1/threads/{early}", params={"include": "messages"})
    assert with_messages.json()["forked_from"] == {"thread_id": source, "revision": 1}
    assert (await client.get(f"/v1/threads/{source}")).json()["forked_from"] is None

    assert await forks_of(client, source) == [now, early], "newest created first, paged"
    assert await forks_of(client, source, include="messages") == [now, early]
    assert await forks_of(client, early) == [deeper]
    assert await forks_of(client, now) == []
    listed = await client.get("/v1/threads", params={"thread_id": [source, deeper]})
    assert {t["thread_id"]: t["forked_from"] for t in listed.json()["data"]} == {
        source: None, deeper: {"thread_id": early, "revision": 1}}

    # A deleted fork leaves the list; its id started afresh by a PUT is no fork.
    gone = await client.delete(f"/v1/threads/{now}", headers={"If-Match": '"1"'})
    assert gone.status_code == 204
    assert await forks_of(client, source) == [early]
    assert (await put(client, now, {}))["forked_from"] is None
    assert await forks_of(client, source) == [early]
    # The record names the source by id: it outlives the source's deletion.
    assert (await client.delete(f"/v1/threads/{source}",
                                headers={"If-Match": '"2"'})).status_code == 204
    assert await forks_of(client, source) == [early]
    bad = await client.get("/v1/threads", params={"forked_from": "../x"})
    assert bad.status_code == 422


@pytest.mark.slow
async def test_a_tenant_lists_only_its_own_forks(secured_client: httpx.AsyncClient,
                                                 secured_database_url: str, uid: str) -> None:
    """Two tenants, each with a thread of the same id forked: each lists only its own fork
    and reads only its own fork's source."""
    a = bearer(create_key(secured_database_url, f"fa-{uid}"))
    b = bearer(create_key(secured_database_url, f"fb-{uid}"))
    source = f"s-{uid}"
    for headers, new in ((a, f"a-{uid}"), (b, f"b-{uid}")):
        await put(secured_client, source, {}, **headers)
        assert (await fork(secured_client, source, new, **headers))["forked_from"] == {
            "thread_id": source, "revision": 1}
    for headers, mine in ((a, f"a-{uid}"), (b, f"b-{uid}")):
        listed = await secured_client.get("/v1/threads", params={"forked_from": source},
                                          headers=headers)
        assert [t["thread_id"] for t in listed.json()["data"]] == [mine]
    other = await secured_client.get(f"/v1/threads/b-{uid}", headers=a)
    assert other.status_code == 404
