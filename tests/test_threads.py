"""Threads over HTTP: API.md sections 2 and 3, on SQLite and Postgres."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from app.threads.schemas import ThreadOut

pytestmark = pytest.mark.anyio

TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
JSON = {"content-type": "application/json"}


async def test_create_get_and_conditional_get(client: httpx.AsyncClient, uid: str) -> None:
    created = await client.post("/v1/threads", json={"thread_id": f"t-{uid}", "state": {"a": 1},
                                                    "metadata": {"team": "x"}})
    assert created.status_code == 201
    assert created.headers["etag"] == '"1"'
    assert created.headers["location"] == f"/v1/threads/t-{uid}"
    body = created.json()
    assert body == {
        "thread_id": f"t-{uid}", "revision": 1, "state": {"a": 1}, "metadata": {"team": "x"},
        "created_at": body["created_at"], "updated_at": body["updated_at"], "message_count": 0,
        "forked_from": None,
    }
    assert TS.match(body["created_at"]) and TS.match(body["updated_at"])

    got = await client.get(f"/v1/threads/t-{uid}")
    assert got.status_code == 200 and got.json() == body and got.headers["etag"] == '"1"'

    for tag in ('"1"', 'W/"1"', '"7", "1"', "*"):
        cached = await client.get(f"/v1/threads/t-{uid}", headers={"If-None-Match": tag})
        assert cached.status_code == 304, tag
        assert cached.headers["etag"] == '"1"' and cached.content == b""
    fresh = await client.get(f"/v1/threads/t-{uid}", headers={"If-None-Match": '"2"'})
    assert fresh.status_code == 200


async def test_server_generated_ids_sort_by_creation(client: httpx.AsyncClient) -> None:
    ids = [(await client.post("/v1/threads", json={})).json()["thread_id"] for _ in range(5)]
    assert all(i.startswith("thr_") for i in ids)
    assert ids == sorted(ids)


async def test_post_existing_is_409(client: httpx.AsyncClient, uid: str) -> None:
    assert (await client.post("/v1/threads", json={"thread_id": uid})).status_code == 201
    again = await client.post("/v1/threads", json={"thread_id": uid, "state": {"x": 1}})
    assert again.status_code == 409
    assert again.headers["content-type"] == "application/problem+json"
    assert again.json()["code"] == "thread_exists"
    assert (await client.get(f"/v1/threads/{uid}")).json()["state"] == {}


async def test_put_rules(client: httpx.AsyncClient, uid: str) -> None:
    url = f"/v1/threads/{uid}"
    # If-Match on a thread that does not exist: 412 with current_revision null.
    missing = await client.put(url, json={"state": {}}, headers={"If-Match": '"1"'})
    assert missing.status_code == 412
    assert missing.json()["code"] == "revision_mismatch"
    assert missing.json()["current_revision"] is None

    created = await client.put(url, json={"state": {"n": 1}, "metadata": {"m": 1}})
    assert created.status_code == 201 and created.headers["etag"] == '"1"'
    assert created.headers["location"] == url

    no_header = await client.put(url, json={"state": {"n": 2}})
    assert no_header.status_code == 428
    assert no_header.json()["code"] == "precondition_required"
    assert "If-Match" in no_header.json()["detail"]

    ok = await client.put(url, json={"state": {"n": 2}}, headers={"If-Match": '"1"'})
    assert ok.status_code == 200 and ok.headers["etag"] == '"2"'
    assert ok.json()["metadata"] == {"m": 1}, "omitted metadata is kept"

    stale = await client.put(url, json={"state": {"n": 3}}, headers={"If-Match": '"1"'})
    assert stale.status_code == 412
    assert stale.json()["current_revision"] == 2

    weak = await client.put(url, json={"state": {"n": 3}}, headers={"If-Match": 'W/"2"'})
    assert weak.status_code == 412, "weak tags never match If-Match"

    listed = await client.put(url, json={"state": {"n": 3}}, headers={"If-Match": '"9", "2"'})
    assert listed.status_code == 200 and listed.json()["revision"] == 3

    same = await client.put(url, json={"state": {"n": 3}}, headers={"If-Match": "*"})
    assert same.status_code == 200 and same.json()["revision"] == 4, "no-op PUT is a revision"

    create_only = await client.put(url, json={"state": {}}, headers={"If-None-Match": "*"})
    assert create_only.status_code == 412
    assert create_only.json()["code"] == "already_exists"
    assert create_only.json()["current_revision"] == 4

    final = (await client.get(url)).json()
    assert final["state"] == {"n": 3} and final["revision"] == 4


async def test_put_create_only(client: httpx.AsyncClient, uid: str) -> None:
    response = await client.put(f"/v1/threads/{uid}", json={"state": {"x": 1}},
                                headers={"If-None-Match": "*"})
    assert response.status_code == 201 and response.json()["revision"] == 1


async def test_last_writer_wins_setting(database_url: str, uid: str) -> None:
    from app.core.settings import Settings
    from app.main import create_app

    app = create_app(Settings(database_url=database_url, require_preconditions=False,
                              _env_file=None))  # type: ignore[call-arg]
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t") as c:
            assert (await c.put(f"/v1/threads/{uid}", json={"state": {}})).status_code == 201
            second = await c.put(f"/v1/threads/{uid}", json={"state": {"b": 1}})
            assert second.status_code == 200 and second.json()["revision"] == 2
            stale = await c.put(f"/v1/threads/{uid}", json={"state": {}},
                                headers={"If-Match": '"1"'})
            assert stale.status_code == 412, "If-Match is still honoured"


async def test_merge_patch(client: httpx.AsyncClient, uid: str) -> None:
    url = f"/v1/threads/{uid}"
    await client.post("/v1/threads", json={"thread_id": uid, "state": {"a": 1, "b": {"c": 2, "d": 3}},
                                           "metadata": {"k": "v"}})
    assert (await client.patch(url, json={"state": {"a": 2}})).status_code == 428
    patched = await client.patch(
        url, content=b'{"state": {"b": {"c": null, "e": [1]}, "z": true}, "metadata": {"n": 1}}',
        headers={"If-Match": '"1"', "content-type": "application/merge-patch+json"},
    )
    assert patched.status_code == 200, patched.text
    assert patched.json()["state"] == {"a": 1, "b": {"d": 3, "e": [1]}, "z": True}
    assert patched.json()["metadata"] == {"k": "v", "n": 1}
    assert patched.headers["etag"] == '"2"'
    stale = await client.patch(url, json={"state": {}}, headers={"If-Match": '"1"'})
    assert stale.status_code == 412 and stale.json()["current_revision"] == 2
    unknown = await client.patch(url, json={"revision": 5}, headers={"If-Match": '"2"'})
    assert unknown.status_code == 422 and unknown.json()["code"] == "unknown_field"
    missing = await client.patch(f"/v1/threads/nope-{uid}", json={"state": {}},
                                 headers={"If-Match": "*"})
    assert missing.status_code == 412
    assert (await client.patch(f"/v1/threads/nope-{uid}", json={"state": {}})).status_code == 404


async def test_delete_tombstone_and_recreate(client: httpx.AsyncClient, uid: str) -> None:
    url = f"/v1/threads/{uid}"
    await client.post("/v1/threads", json={"thread_id": uid, "state": {"v": 1}})
    await client.put(url, json={"state": {"v": 2}}, headers={"If-Match": '"1"'})
    assert (await client.delete(url)).status_code == 428
    assert (await client.delete(url, headers={"If-Match": '"1"'})).status_code == 412
    deleted = await client.delete(url, headers={"If-Match": '"2"'})
    assert deleted.status_code == 204 and deleted.content == b""

    assert (await client.get(url)).status_code == 404
    for method, kwargs in [
        ("PUT", {"json": {"state": {}}, "headers": {"If-Match": '"2"'}}),
        ("PUT", {"json": {"state": {}}}),
        ("PUT", {"json": {"state": {}}, "headers": {"If-Match": "*"}}),
        ("PATCH", {"json": {"state": {}}, "headers": {"If-Match": '"2"'}}),
        ("DELETE", {"headers": {"If-Match": "*"}}),
    ]:
        late = await client.request(method, url, **kwargs)
        assert late.status_code == 410, (method, kwargs, late.text)
        assert late.json()["code"] == "thread_deleted"
    assert (await client.get(url)).status_code == 404, "nothing was resurrected"

    again = await client.put(url, json={"state": {"new": True}}, headers={"If-None-Match": "*"})
    assert again.status_code == 201
    assert again.json()["revision"] == 4, "revisions continue after the deletion's (3)"
    assert (await client.put(url, json={"state": {}}, headers={"If-Match": '"2"'})).status_code == 412

    await client.delete(url, headers={"If-Match": '"4"'})
    posted = await client.post("/v1/threads", json={"thread_id": uid})
    assert posted.status_code == 201 and posted.json()["revision"] == 6


async def test_list_pagination_and_filters(client: httpx.AsyncClient, uid: str) -> None:
    ids = []
    for i in range(7):
        r = await client.post("/v1/threads", json={
            "thread_id": f"l{i}-{uid}",
            "metadata": {"run": uid, "n": i, "tags": ["even" if i % 2 == 0 else "odd", "x"],
                         "nested": {"deep": {"k": i % 3}}},
        })
        ids.append(r.json()["thread_id"])
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params = {"limit": 3, "metadata": f'{{"run": "{uid}"}}'}
        if cursor:
            params["cursor"] = cursor
        page = await client.get("/v1/threads", params=params)
        assert page.status_code == 200
        body = page.json()
        seen += [t["thread_id"] for t in body["data"]]
        pages += 1
        if not body["has_more"]:
            assert body["next_cursor"] is None and "link" not in page.headers
            break
        assert 'rel="next"' in page.headers["link"] and body["next_cursor"] in page.headers["link"]
        cursor = body["next_cursor"]
    assert pages == 3
    assert seen == list(reversed(ids)), "newest created first, each exactly once"

    async def filtered(query: str) -> list[str]:
        r = await client.get("/v1/threads", params={"metadata": query, "limit": 100})
        assert r.status_code == 200, r.text
        return sorted(t["thread_id"] for t in r.json()["data"])

    assert await filtered(f'{{"run": "{uid}", "tags": ["even"]}}') == sorted(ids[0::2])
    assert await filtered(f'{{"run": "{uid}", "nested": {{"deep": {{"k": 1}}}}}}') == sorted(
        [ids[1], ids[4]])
    assert await filtered(f'{{"run": "{uid}", "n": 3}}') == [ids[3]]
    assert await filtered(f'{{"run": "{uid}", "n": "3"}}') == [], "types must match"
    assert await filtered(f'{{"run": "{uid}", "tags": "even"}}') == [], "not top-level array"

    mid = (await client.get(f"/v1/threads/{ids[3]}")).json()["updated_at"]
    later = await client.get("/v1/threads", params={"metadata": f'{{"run": "{uid}"}}',
                                                    "updated_after": mid})
    assert sorted(t["thread_id"] for t in later.json()["data"]) == sorted(ids[4:])


async def test_list_reads_named_threads_in_one_request(client: httpx.AsyncClient,
                                                      uid: str) -> None:
    for name in ("a", "b", "c", "gone"):
        created = await client.post("/v1/threads", json={"thread_id": f"{uid}-{name}",
                                                         "state": {"name": name}})
        assert created.status_code == 201
    assert (await client.delete(f"/v1/threads/{uid}-gone",
                                headers={"If-Match": "*"})).status_code == 204
    asked = [f"{uid}-c", f"{uid}-a", f"{uid}-missing", f"{uid}-gone"]
    listed = await client.get("/v1/threads", params={"thread_id": asked})
    assert listed.status_code == 200, listed.text
    assert [t["state"]["name"] for t in listed.json()["data"]] == ["c", "a"], \
        "the live ones among them, newest first; missing and deleted ids are left out"
    paged = await client.get("/v1/threads", params={"thread_id": asked, "limit": 1})
    assert [t["thread_id"] for t in paged.json()["data"]] == [f"{uid}-c"]
    rest = await client.get("/v1/threads", params={"thread_id": asked, "limit": 1,
                                                   "cursor": paged.json()["next_cursor"]})
    assert [t["thread_id"] for t in rest.json()["data"]] == [f"{uid}-a"]
    assert rest.json()["has_more"] is False


async def test_list_includes_each_threads_messages(client: httpx.AsyncClient,
                                                   uid: str) -> None:
    """`include=messages` on a list gives each thread as its own `GET ?include=messages`
    gives it: the first page of the live view (a removed message left out) and the cursor."""
    talk = [{"id": f"m{i}", "role": "user", "content": f"line {i}"} for i in range(4)]
    for name, messages in (("a", talk), ("b", []), ("c", talk[:2])):
        put = await client.put(f"/v1/threads/{uid}-{name}",
                               json={"state": {"name": name}, "append_messages": messages})
        assert put.status_code == 201, put.text
    removed = await client.post(f"/v1/threads/{uid}-a/messages:remove",
                                json={"ids": ["m1"]}, headers={"If-Match": "*"})
    assert removed.status_code == 200, removed.text
    ids = [f"{uid}-{name}" for name in ("a", "b", "c")]
    listed = await client.get("/v1/threads", params={"thread_id": ids, "include": "messages",
                                                     "messages_limit": 2})
    assert listed.status_code == 200, listed.text
    for item in listed.json()["data"]:
        alone = await client.get(f"/v1/threads/{item['thread_id']}",
                                 params={"include": "messages", "messages_limit": 2})
        assert item == alone.json()
    by_id = {item["thread_id"]: item for item in listed.json()["data"]}
    assert [m["id"] for m in by_id[f"{uid}-a"]["messages"]] == ["m0", "m2"]
    rest = await client.get(f"/v1/threads/{uid}-a/messages",
                            params={"cursor": by_id[f"{uid}-a"]["messages_next_cursor"]})
    assert [m["id"] for m in rest.json()["data"]] == ["m3"]
    assert by_id[f"{uid}-b"]["messages"] == [] and by_id[f"{uid}-b"]["messages_next_cursor"] is None
    assert by_id[f"{uid}-c"]["messages_next_cursor"] is None
    plain = await client.get("/v1/threads", params={"thread_id": ids})
    assert all("messages" not in item for item in plain.json()["data"])


async def test_list_bad_parameters(client: httpx.AsyncClient) -> None:
    for params, status, code in [
        ({"limit": 0}, 422, None), ({"limit": 101}, 422, None),
        ({"metadata": "[1]"}, 422, "validation_failed"), ({"metadata": "{oops"}, 422, None),
        ({"cursor": "garbage"}, 400, "invalid_cursor"),
        ({"updated_after": "yesterday"}, 422, None),
        ({"thread_id": [f"t{i}" for i in range(101)]}, 422, None),
        ({"thread_id": ".hidden"}, 422, None),
        ({"include": "state"}, 422, "validation_failed"),
        ({"include": "messages", "messages_limit": 0}, 422, "validation_failed"),
        ({"include": "messages", "messages_limit": 1001}, 422, "validation_failed"),
    ]:
        r = await client.get("/v1/threads", params=params)
        assert r.status_code == status, (params, r.text)
        assert r.headers["content-type"] == "application/problem+json"
        if code:
            assert r.json()["code"] == code


async def test_request_id(client: httpx.AsyncClient) -> None:
    echoed = await client.get("/healthz", headers={"X-Request-ID": "abc-123"})
    assert echoed.headers["x-request-id"] == "abc-123"
    generated = await client.get("/v1/threads/does-not-exist")
    assert len(generated.headers["x-request-id"]) >= 16
    assert generated.status_code == 404
    assert generated.json()["instance"] == "/v1/threads/does-not-exist"


async def test_every_route_sends_the_thread_as_its_model_renders_it(client: httpx.AsyncClient,
                                                                    uid: str) -> None:
    """Routes render a thread from its stored JSON text (`render_thread`), not through
    `ThreadOut`, the schema the OpenAPI document declares: what each sends (create, PUT,
    PATCH, fork, batch, GET, `?include=messages`, lists) must read as the model renders
    it, members, values and key order, for every kind of thread."""
    odd = 'quote " back \\ tab \t ünïcode ✓ \U0001f600'
    state = {"z": 1, "a": [1.5, None, {"n": odd}], odd: {}, "big": 12345678901234567890,
             "float": 2.0, "tiny": 1e-7, "huge": 1e20, "t": True}

    def ordered(text: str) -> object:
        return json.loads(text, object_pairs_hook=list)

    def as_the_model(text: str) -> object:
        return ordered(ThreadOut.model_validate_json(text).model_dump_json(exclude_unset=True))

    made = [await client.post("/v1/threads", json={"thread_id": f"plain-{uid}",
                                                   "state": state, "metadata": {odd: odd}}),
            await client.put(f"/v1/threads/kept-{uid}", json={
                "state": state, "metadata": {}, "history_limit": 3, "ttl_seconds": 3600}),
            await client.post(f"/v1/threads/kept-{uid}/fork", json={"thread_id": f"fork-{uid}"}),
            await client.patch(f"/v1/threads/fork-{uid}", json={"ttl_seconds": 60},
                               headers={"Content-Type": "application/merge-patch+json",
                                        "If-Match": "*"}),
            await client.put(f"/v1/threads/plain-{uid}", json={"state": {"n": -0.0}},
                             headers={"If-Match": "*"})]
    for written in made:
        assert written.status_code in (200, 201), written.text
        assert ordered(written.text) == as_the_model(written.text)
    batch = await client.post("/v1/batch", json={"operations": [
        {"op": "thread.put", "thread_id": f"batch-{uid}", "body": {"state": state}}]})
    assert batch.status_code == 200, batch.text
    batched = batch.json()["results"][0]["body"]
    assert ordered(json.dumps(batched)) == as_the_model(json.dumps(batched))
    listed = await client.get("/v1/threads", params=[
        ("thread_id", f"{kind}-{uid}") for kind in ("plain", "kept", "fork", "batch")])
    assert listed.status_code == 200, listed.text
    by_id = {item["thread_id"]: item for item in listed.json()["data"]}
    assert len(by_id) == 4
    for thread_id, item in by_id.items():
        got = await client.get(f"/v1/threads/{thread_id}")
        assert got.status_code == 200, got.text
        assert ordered(got.text) == as_the_model(got.text) == ordered(json.dumps(item))
        with_messages = ordered((await client.get(f"/v1/threads/{thread_id}",
                                                  params={"include": "messages"})).text)
        assert isinstance(with_messages, list)
        assert with_messages[:-2] == ordered(got.text)
        assert with_messages[-2:] == [("messages", []), ("messages_next_cursor", None)]
    forked = made[2].json()["forked_from"]
    assert forked == {"thread_id": f"kept-{uid}", "revision": 1}
    assert by_id[f"fork-{uid}"]["forked_from"] == forked
    assert by_id[f"kept-{uid}"]["history_limit"] == 3 and "history_limit" not in by_id[
        f"plain-{uid}"]
