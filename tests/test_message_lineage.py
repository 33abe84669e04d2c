"""Parent links between messages, across a tenant's threads, and the lineage read that walks
them in one request (API.md section 4, "Parent links"), on SQLite and Postgres."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests.support import statements

pytestmark = pytest.mark.anyio


async def append(client: httpx.AsyncClient, thread_id: str, *messages: dict[str, Any],
                 **headers: str) -> httpx.Response:
    return await client.post(f"/v1/threads/{thread_id}/messages",
                             json={"messages": list(messages)}, headers=headers)


async def ok(response: httpx.Response, status: int = 201) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json() if response.content else {}
    return body


async def lineage(client: httpx.AsyncClient, message_id: str, **params: Any) -> httpx.Response:
    return await client.get(f"/v1/messages/{message_id}/lineage", params=params)


async def revision(client: httpx.AsyncClient, thread_id: str) -> int:
    value: int = (await client.get(f"/v1/threads/{thread_id}")).json()["revision"]
    return value


async def test_a_lineage_crosses_threads_oldest_first(client: httpx.AsyncClient,
                                                      uid: str) -> None:
    a, b = f"a-{uid}", f"b-{uid}"
    stored = await ok(await append(
        client, a, {"id": f"{uid}-1", "role": "user", "content": "one"},
        {"id": f"{uid}-2", "role": "assistant", "content": "two", "parent_id": f"{uid}-1"},
        {"id": f"{uid}-x", "role": "user", "content": "not on the line"}))
    assert "parent_id" not in stored["data"][0]
    assert stored["data"][1]["parent_id"] == f"{uid}-1"
    # A fork-like continuation in another thread, then one more step there.
    await ok(await append(client, b, {"id": f"{uid}-3", "role": "user", "content": "three",
                                      "parent_id": f"{uid}-2"}))
    await ok(await append(client, b, {"id": f"{uid}-4", "role": "assistant", "content": "four",
                                      "parent_id": f"{uid}-3"}))
    got = await ok(await lineage(client, f"{uid}-4"), 200)
    assert [(m["thread_id"], m["id"]) for m in got["data"]] == [
        (a, f"{uid}-1"), (a, f"{uid}-2"), (b, f"{uid}-3"), (b, f"{uid}-4")]
    assert got["data"][2]["parent_id"] == f"{uid}-2" and got["data"][1]["content"] == "two"
    assert got["has_more"] is False and got["next_cursor"] is None
    # The message read by thread shows its link too, alone, in a page and with its thread.
    one = await ok(await client.get(f"/v1/threads/{b}/messages/{uid}-3"), 200)
    assert one["parent_id"] == f"{uid}-2"
    page = await ok(await client.get(f"/v1/threads/{b}/messages"), 200)
    assert [m.get("parent_id") for m in page["data"]] == [f"{uid}-2", f"{uid}-3"]
    with_messages = await ok(await client.get(f"/v1/threads/{a}",
                                              params={"include": "messages"}), 200)
    assert [m.get("parent_id") for m in with_messages["messages"]] == [None, f"{uid}-1", None]
    assert {k: v for k, v in page["data"][0].items() if k != "thread_id"} == {
        k: v for k, v in got["data"][2].items() if k != "thread_id"}
    # The last `limit`, and the cursor continues with the older ones.
    page = await lineage(client, f"{uid}-4", limit=3)
    body = await ok(page, 200)
    assert [m["id"] for m in body["data"]] == [f"{uid}-2", f"{uid}-3", f"{uid}-4"]
    assert body["has_more"] is True and 'rel="next"' in page.headers["link"]
    rest = await ok(await lineage(client, f"{uid}-4", limit=3, cursor=body["next_cursor"]), 200)
    assert [m["id"] for m in rest["data"]] == [f"{uid}-1"] and rest["has_more"] is False
    # A message without a parent is a lineage of one.
    alone = await ok(await lineage(client, f"{uid}-x"), 200)
    assert [m["id"] for m in alone["data"]] == [f"{uid}-x"]


async def test_a_history_of_400_is_one_request(app: FastAPI, client: httpx.AsyncClient,
                                               uid: str) -> None:
    parent = None
    for turn in range(4):  # 100 a request, each chained to the one before
        batch = []
        for n in range(turn * 100, turn * 100 + 100):
            batch.append({"id": f"{uid}-{n}", "role": "user", "content": str(n),
                          **({"parent_id": parent} if parent else {})})
            parent = f"{uid}-{n}"
        await ok(await append(client, f"t{turn % 2}-{uid}", *batch))
    with statements(app) as heard:
        got = await ok(await lineage(client, f"{uid}-399", limit=1000), 200)
    assert [m["content"] for m in got["data"]] == [str(n) for n in range(400)]
    read = [s.sql for s in heard if "messages" in s.sql]
    # Across two threads and 400 links: the id's lookup and one recursive query.
    assert len(read) == 2, read
    assert not got["has_more"]
    last = await ok(await lineage(client, f"{uid}-399", limit=10), 200)
    assert [m["content"] for m in last["data"]] == [str(n) for n in range(390, 400)]


async def test_parents_must_exist_once(client: httpx.AsyncClient, uid: str) -> None:
    a = f"a-{uid}"
    await ok(await append(client, a, {"id": f"{uid}-p", "role": "user", "content": "p"}))
    before = await revision(client, a)
    missing = await append(client, a, {"role": "user", "content": "x"},
                           {"role": "user", "content": "y", "parent_id": f"{uid}-nope"})
    assert missing.status_code == 422, missing.text
    problem = missing.json()
    assert problem["code"] == "parent_not_found"
    assert problem["errors"][0]["pointer"] == "/messages/1/parent_id"
    # A parent later in the same request is not "before" the message.
    later = await append(client, a, {"id": f"{uid}-c", "role": "user", "parent_id": f"{uid}-d"},
                         {"id": f"{uid}-d", "role": "user"})
    assert later.status_code == 422 and later.json()["code"] == "parent_not_found"
    assert await revision(client, a) == before  # nothing was written
    # A single message (not a batch) and a PUT's append_messages take links too.
    single = await client.post(f"/v1/threads/{a}/messages",
                               json={"role": "user", "parent_id": f"{uid}-p"})
    assert single.status_code == 201 and single.json()["data"][0]["parent_id"] == f"{uid}-p"
    put = await client.put(f"/v1/threads/{a}", json={"state": {}, "append_messages": [
        {"id": f"{uid}-q", "role": "user", "parent_id": f"{uid}-p"},
        {"role": "user", "parent_id": f"{uid}-nope"}]}, headers={"If-Match": "*"})
    assert put.status_code == 422, put.text
    assert put.json()["errors"][0]["pointer"] == "/append_messages/1/parent_id"
    # PATCH takes append_messages like PUT, links and all.
    patched = await client.patch(f"/v1/threads/{a}", json={"state": {"n": 1}, "append_messages": [
        {"id": f"{uid}-r", "role": "user", "parent_id": f"{uid}-p"}]}, headers={"If-Match": "*"})
    assert patched.status_code == 200, patched.text
    assert [m["id"] for m in (await ok(await lineage(client, f"{uid}-r"), 200))["data"]] == [
        f"{uid}-p", f"{uid}-r"]
    # A fork copies ids, so an id it copied names two messages: 409, nothing written.
    await ok(await client.post(f"/v1/threads/{a}/fork", json={"thread_id": f"f-{uid}"}))
    before = await revision(client, a)
    ambiguous = await append(client, a, {"role": "user", "parent_id": f"{uid}-p"})
    assert ambiguous.status_code == 409 and ambiguous.json()["code"] == "message_ambiguous"
    assert await revision(client, a) == before
    assert (await lineage(client, f"{uid}-p")).json()["code"] == "message_ambiguous"
    nowhere = await lineage(client, f"{uid}-nowhere")
    assert nowhere.status_code == 404
    assert nowhere.headers["content-type"].startswith("application/problem+json")
    # A batch operation is the single request.
    batch = await client.post("/v1/batch", json={"operations": [
        {"op": "messages.append", "thread_id": f"b-{uid}",
         "body": {"messages": [{"role": "user", "parent_id": f"{uid}-missing"}]}}]})
    assert batch.status_code == 422 and batch.json()["code"] == "parent_not_found"
    assert batch.json()["operation"] == 0
    # A summary stands for a run: no link.
    summary = await client.post(f"/v1/threads/f-{uid}/compactions", json={
        "source_message_ids": [f"{uid}-p"],
        "summary": {"role": "system", "content": "s", "parent_id": f"{uid}-p"}})
    assert summary.status_code == 422, summary.text


async def test_what_others_continue_is_not_deleted(client: httpx.AsyncClient,
                                                    uid: str) -> None:
    x, y = f"x-{uid}", f"y-{uid}"
    await ok(await append(client, x, {"id": f"{uid}-p", "role": "user"},
                          {"id": f"{uid}-q", "role": "user", "parent_id": f"{uid}-p"}))
    await ok(await append(client, y, {"id": f"{uid}-c", "role": "user",
                                      "parent_id": f"{uid}-q"}))
    rev = await revision(client, x)
    refused = await client.delete(f"/v1/threads/{x}", headers={"If-Match": f'"{rev}"'})
    assert refused.status_code == 409, refused.text
    assert refused.json()["code"] == "message_referenced" and y in refused.json()["detail"]
    # Removing a message another continues, in this thread or another: refused too.
    for body in ({"ids": [f"{uid}-q"]}, {"ids": [f"{uid}-p"]}, {"last": 2}):
        removal = await client.post(f"/v1/threads/{x}/messages:remove", json=body)
        assert removal.status_code == 409 and removal.json()["code"] == "message_referenced"
    batch = await client.post("/v1/batch", json={"operations": [
        {"op": "thread.delete", "thread_id": x, "if_match": f'"{rev}"'}]})
    assert batch.status_code == 409 and batch.json()["code"] == "message_referenced"
    assert await revision(client, x) == rev
    assert [m["id"] for m in (await ok(await lineage(client, f"{uid}-c"), 200))["data"]] == [
        f"{uid}-p", f"{uid}-q", f"{uid}-c"]
    # Once the continuation is gone, the thread can go; a run with its own child can too.
    await ok(await client.post(f"/v1/threads/{y}/messages:remove", json={"last": 1}), 200)
    await ok(await client.post(f"/v1/threads/{x}/messages:remove", json={"last": 2}), 200)
    rev = await revision(client, x)
    await ok(await client.delete(f"/v1/threads/{x}", headers={"If-Match": f'"{rev}"'}), 204)
    # A thread's links into itself never hold it.
    await ok(await append(client, y, {"id": f"{uid}-s", "role": "user"},
                          {"role": "user", "parent_id": f"{uid}-s"}))
    rev = await revision(client, y)
    await ok(await client.delete(f"/v1/threads/{y}", headers={"If-Match": f'"{rev}"'}), 204)


async def test_a_fork_links_to_its_own_copies(client: httpx.AsyncClient, uid: str) -> None:
    source, fork = f"s-{uid}", f"f-{uid}"
    await ok(await append(client, source, {"id": f"{uid}-1", "role": "user"},
                          {"id": f"{uid}-2", "role": "user", "parent_id": f"{uid}-1"}))
    await ok(await client.post(f"/v1/threads/{source}/fork", json={"thread_id": fork}))
    # The copies point at the copies, so the source is free to go.
    rev = await revision(client, source)
    await ok(await client.delete(f"/v1/threads/{source}", headers={"If-Match": f'"{rev}"'}),
             204)
    got = await ok(await lineage(client, f"{uid}-2"), 200)
    assert [(m["thread_id"], m["id"], m.get("parent_id")) for m in got["data"]] == [
        (fork, f"{uid}-1", None), (fork, f"{uid}-2", f"{uid}-1")]


async def test_bad_lineage_requests_are_4xx(client: httpx.AsyncClient, uid: str) -> None:
    for params in ({"limit": 0}, {"limit": 1001}, {"limit": "x"}):
        assert (await lineage(client, "m", **params)).status_code == 422
    assert (await lineage(client, "m", cursor="nope")).status_code == 400
    assert (await lineage(client, ".bad")).status_code == 422
    bad = await append(client, uid, {"role": "user", "parent_id": "a/b"})
    assert bad.status_code == 422 and bad.json()["errors"][0]["pointer"].endswith("/parent_id")


@pytest.mark.postgres_only(reason="row locks order the race; SQLite runs one writer at a time")
@pytest.mark.parametrize("first", ["append", "delete"])
async def test_a_link_and_a_delete_of_its_parent_never_both_win(
        client: httpx.AsyncClient, database_url: str, uid: str, first: str) -> None:
    """An append that links into thread X and a DELETE of X, queued on X's row in either
    order: the one that goes first wins, the other is refused, and no link dangles."""
    import asyncio

    from tests.support import pg_connect, wait_until_blocked

    x, y = f"x-{uid}", f"y-{uid}"
    await ok(await append(client, x, {"id": f"{uid}-p", "role": "user"}))
    await ok(await append(client, y, {"role": "user"}))
    rev = await revision(client, x)
    holder = await pg_connect(database_url)
    try:
        async with holder.transaction():
            await holder.execute("SELECT 1 FROM threads WHERE tenant_id = 'default' AND "
                                 "thread_id = $1 FOR UPDATE", x)
            start_append = lambda: asyncio.ensure_future(append(
                client, y, {"id": f"{uid}-c", "role": "user", "parent_id": f"{uid}-p"}))
            start_delete = lambda: asyncio.ensure_future(client.delete(
                f"/v1/threads/{x}", headers={"If-Match": f'"{rev}"'}))
            second = "delete" if first == "append" else "append"
            tasks = {first: start_append() if first == "append" else start_delete()}
            # The first queues on the holder's row lock, the second behind the first.
            waiting = await wait_until_blocked(database_url, holder.get_server_pid())
            tasks[second] = start_append() if second == "append" else start_delete()
            await wait_until_blocked(database_url, waiting[0])
        appended, deleted = await tasks["append"], await tasks["delete"]
    finally:
        await holder.close()
    if first == "append":
        assert appended.status_code == 201, appended.text
        assert deleted.status_code == 409 and deleted.json()["code"] == "message_referenced"
        got = await ok(await lineage(client, f"{uid}-c"), 200)
        assert [m["id"] for m in got["data"]] == [f"{uid}-p", f"{uid}-c"]
    else:
        assert deleted.status_code == 204, deleted.text
        assert appended.status_code == 422 and appended.json()["code"] == "parent_not_found"
        assert (await lineage(client, f"{uid}-c")).status_code == 404
