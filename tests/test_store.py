"""The store over HTTP (API.md section 7b), on SQLite, Postgres and a Postgres with pgvector
(where SQL finds the nearest vectors: the `pgvector` backend, tests/conftest.py): items under
section 2, addresses, writes, events, idempotency, batches, TTL, search and namespaces,
limits."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import httpx
import pytest
from fastapi import FastAPI

from app.core.settings import Settings
from app.retention.service import Retention
from tests.support import bearer, create_key

pytestmark = [pytest.mark.anyio, pytest.mark.pgvector]
SEARCH = "/v1/store/items/search"
NAMESPACES = "/v1/store/namespaces"


def item(namespace: str, key: str) -> str:
    return f"/v1/store/items/{namespace}/{key}"


async def put(client: httpx.AsyncClient, url: str, body: dict,
              headers: dict[str, str] | None = None) -> httpx.Response:
    response = await client.put(url, json=body, headers=headers)
    assert response.status_code in (200, 201), response.text
    return response


async def search(client: httpx.AsyncClient, **body: object) -> list[dict]:
    response = await client.post(SEARCH, json=body)
    assert response.status_code == 200, response.text
    return response.json()["data"]


def keys(items: list[dict]) -> list[str]:
    return [found["key"] for found in items]


async def wait_past(moment: str) -> None:
    """Until the clock has passed `moment` (an item's expires_at): no timing assertion, the
    test only waits for what it then checks."""
    deadline = datetime.fromisoformat(moment)
    while datetime.now(UTC) <= deadline:
        await asyncio.sleep(0.02)


# --- one item under section 2 ------------------------------------------------------------


async def test_conditional_requests(client: httpx.AsyncClient, uid: str) -> None:
    u = item(f"users/{uid}", "prefs")
    missing = await client.put(u, json={"value": {}}, headers={"If-Match": '"1"'})
    assert missing.status_code == 412 and missing.json()["current_revision"] is None

    created = await client.put(u, json={"value": {"theme": "dark"}},
                               headers={"If-None-Match": "*"})
    assert created.status_code == 201, created.text
    assert created.headers["etag"] == '"1"' and created.headers["location"] == u
    body = created.json()
    assert body == {"namespace": ["users", uid], "key": "prefs", "value": {"theme": "dark"},
                    "revision": 1, "created_at": body["created_at"],
                    "updated_at": body["created_at"], "expires_at": None, "ttl_seconds": None,
                    "index": None}
    assert (await client.get(u)).json() == body
    head = await client.head(u)
    assert head.status_code == 200 and head.content == b"" and head.headers["etag"] == '"1"'
    cached = await client.get(u, headers={"If-None-Match": '"1"'})
    assert cached.status_code == 304 and cached.headers["etag"] == '"1"'
    assert (await client.get(u, headers={"If-Match": '"7"'})).status_code == 412

    again = await client.put(u, json={"value": {}}, headers={"If-None-Match": "*"})
    assert again.status_code == 412 and again.json()["code"] == "already_exists"
    no_header = await client.put(u, json={"value": {}})
    assert no_header.status_code == 428 and "If-Match" in no_header.json()["detail"]
    replaced = await client.put(u, json={"value": {"theme": "light"}},
                                headers={"If-Match": '"1"'})
    assert replaced.status_code == 200 and replaced.headers["etag"] == '"2"'
    stale = await client.put(u, json={"value": {}}, headers={"If-Match": '"1"'})
    assert stale.status_code == 412 and stale.json()["current_revision"] == 2

    patched = await client.patch(u, json={"value": {"font": {"size": 12}, "theme": None}},
                                 headers={"If-Match": '"2"',
                                          "Content-Type": "application/merge-patch+json"})
    assert patched.status_code == 200 and patched.headers["etag"] == '"3"'
    assert patched.json()["value"] == {"font": {"size": 12}}
    assert (await client.patch(u, json={"value": {}})).status_code == 428

    assert (await client.delete(u)).status_code == 428
    assert (await client.delete(u, headers={"If-Match": '"2"'})).status_code == 412
    assert (await client.delete(u, headers={"If-Match": '"3"'})).status_code == 204
    assert (await client.get(u)).status_code == 404
    assert (await client.delete(u, headers={"If-Match": "*"})).status_code == 412
    assert (await client.patch(u, json={"value": {}}, headers={"If-Match": "*"})).status_code == 412
    revived = await client.put(u, json={"value": {"back": True}}, headers={"If-None-Match": "*"})
    assert revived.status_code == 201 and revived.headers["etag"] == '"5"', \
        "a re-created item continues its revisions: an ETag is never reused"


async def test_an_overwrite_holds_whether_or_not_the_item_exists(client: httpx.AsyncClient,
                                                                 uid: str) -> None:
    u = item(f"upsert/{uid}", "k")
    overwrite = {"If-None-Match": '"0"'}
    first = await client.put(u, json={"value": {"n": 1}}, headers=overwrite)
    second = await client.put(u, json={"value": {"n": 2}}, headers=overwrite)
    assert (first.status_code, second.status_code) == (201, 200)
    assert second.json()["revision"] == 2
    gone = await client.post("/v1/batch", json={"operations": [
        {"op": "store.delete", "namespace": ["upsert", uid], "key": "k", "if_match": "*"},
        {"op": "store.delete", "namespace": ["upsert", uid], "key": "k", "if_match": "*",
         "missing_ok": True},
        {"op": "store.put", "namespace": ["upsert", uid], "key": "k", "if_none_match": '"0"',
         "body": {"value": {"n": 3}}}]})
    assert [r["status"] for r in gone.json()["results"]] == [204, 404, 201], gone.text
    strict = await client.post("/v1/batch", json={"operations": [
        {"op": "store.delete", "namespace": ["upsert", uid], "key": "missing", "if_match": "*"}]})
    assert strict.status_code == 412, "without missing_ok a delete of nothing ends the batch"


async def test_namespaces_and_keys_of_any_text_have_one_url(client: httpx.AsyncClient,
                                                            uid: str) -> None:
    # ("user/42", "notes.v2", "é") / "key with spaces" in the client's encoding.
    u = item(f"user@2F{uid}/notes.v2/@C3@A9", "key@20with@20spaces")
    created = await put(client, u, {"value": {"n": 1}})
    assert created.json()["namespace"] == [f"user/{uid}", "notes.v2", "é"]
    assert created.json()["key"] == "key with spaces"
    assert (await client.get(u)).status_code == 200
    assert (await client.get(u.replace("@", "%40"))).json()["key"] == "key with spaces", \
        "percent-encoding what needs none names the same item"
    for other, status in ((item(f"user@2f{uid}/notes.v2/@C3@A9", "key@20with@20spaces"), 422),
                          (item(f"user@2F{uid}/notes@2Ev2/@C3@A9", "key@20with@20spaces"), 422),
                          (item(f"user%2F{uid}/notes.v2/@C3@A9", "key@20with@20spaces"), 404),
                          (item(f"user%2f{uid}/notes.v2/@C3@A9", "key@20with@20spaces"), 404),
                          (item(f"user@2F{uid}/notes.v2/@C3", "k"), 422),
                          (item(f"user@2F{uid}//x", "k"), 422),
                          (item(".hidden", "k"), 422),
                          (f"/v1/store/items/{uid}", 404)):
        response = await client.get(other)
        assert response.status_code == status, (other, response.text)
        assert response.headers["content-type"] == "application/problem+json"
    deep = "/".join(f"l{n}" for n in range(11))
    assert (await client.put(item(deep, "k"), json={"value": {}})).json()["code"] == \
        "validation_failed"
    assert (await client.put(item("x" * 256, "k"), json={"value": {}})).status_code == 422
    long_namespace = "/".join(["y" * 200] * 3)
    too_long = await client.put(item(long_namespace, "k"), json={"value": {}})
    assert too_long.status_code == 422 and "512" in too_long.json()["detail"]


async def test_writes_are_audited_without_values(client: httpx.AsyncClient, uid: str) -> None:
    start = (await client.get("/v1/events", params={"limit": 1})).json()["next_cursor"]
    u = item(f"audit/{uid}", "k")
    await client.put(u, json={"value": {"secret": "s3cret-value"}})
    await client.patch(u, json={"value": {"more": 1}}, headers={"If-Match": '"1"'})
    await client.delete(u, headers={"If-Match": '"2"'})
    events = (await client.get("/v1/events", params={
        "cursor": start, "resource_prefix": f"/v1/store/items/audit/{uid}"})).json()["data"]
    assert [(e["type"], e["revision"], e["resource"]) for e in events] == [
        ("store.item.created", 1, u), ("store.item.updated", 2, u), ("store.item.deleted", 3, u)]
    assert "s3cret" not in json.dumps(events) and all("thread_id" not in e for e in events)
    typed = (await client.get("/v1/events", params={
        "cursor": start, "type": "store.item.deleted"})).json()["data"]
    assert u in [e["resource"] for e in typed]


async def test_idempotency_key_replays_the_first_answer(client: httpx.AsyncClient,
                                                        uid: str) -> None:
    u = item(f"idem/{uid}", "k")
    headers = {"If-None-Match": "*", "Idempotency-Key": f"put-{uid}"}
    first = await client.put(u, json={"value": {"a": 1}}, headers=headers)
    retry = await client.put(u, json={"value": {"a": 1}}, headers=headers)
    assert first.status_code == retry.status_code == 201, retry.text
    assert retry.json() == first.json() and retry.headers["idempotent-replayed"] == "true"
    assert retry.headers["etag"] == '"1"' and retry.headers["location"] == u
    assert "idempotent-replayed" not in first.headers
    changed = await client.put(u, json={"value": {"a": 2}}, headers=headers)
    assert changed.status_code == 422 and changed.json()["code"] == "idempotency_key_reused"
    elsewhere = await client.put(item(f"idem/{uid}", "other"), json={"value": {"a": 1}},
                                 headers=headers)
    assert elsewhere.status_code == 422, "a key is the tenant's: used on another item, refused"
    gone = {"If-Match": '"1"', "Idempotency-Key": f"del-{uid}"}
    assert (await client.delete(u, headers=gone)).status_code == 204
    replayed = await client.delete(u, headers=gone)
    assert replayed.status_code == 204 and replayed.headers["idempotent-replayed"] == "true"


async def test_batch_runs_store_operations_all_or_nothing(client: httpx.AsyncClient,
                                                          uid: str) -> None:
    ns = ["batch", uid]
    operations = [
        {"op": "store.put", "namespace": ns, "key": "a", "body": {"value": {"n": 1}}},
        {"op": "store.put", "namespace": ns, "key": "b/c", "if_none_match": "*",
         "body": {"value": {"n": 2}}},
        {"op": "thread.put", "thread_id": f"t-{uid}", "body": {"state": {}}},
        {"op": "store.patch", "namespace": ns, "key": "a", "if_match": '"1"',
         "body": {"value": {"m": 1}}},
        {"op": "store.get", "namespace": ns, "key": "a"},
        {"op": "store.get", "namespace": ns, "key": "missing"},
        {"op": "store.search", "body": {"namespace_prefix": ns, "filter": {"n": 2}}},
        {"op": "store.list_namespaces", "body": {"prefix": ["batch", uid]}},
    ]
    done = await client.post("/v1/batch", json={"operations": operations},
                             headers={"Idempotency-Key": f"b-{uid}"})
    assert done.status_code == 200, done.text
    results = done.json()["results"]
    assert [r["status"] for r in results] == [201, 201, 201, 200, 200, 404, 200, 200]
    assert results[3]["etag"] == '"2"' and results[4]["body"]["value"] == {"n": 1, "m": 1}
    assert keys(results[6]["body"]["data"]) == ["b/c"]
    assert results[7]["body"]["data"] == [ns]
    assert (await client.get(item(f"batch/{uid}", "b@2Fc"))).status_code == 200
    replay = await client.post("/v1/batch", json={"operations": operations},
                               headers={"Idempotency-Key": f"b-{uid}"})
    assert replay.json() == done.json() and replay.headers["idempotent-replayed"] == "true"

    refused = await client.post("/v1/batch", json={"operations": [
        {"op": "store.put", "namespace": ns, "key": "new", "body": {"value": {}}},
        {"op": "store.delete", "namespace": ns, "key": "a", "if_match": '"1"'},
    ]})
    assert refused.status_code == 412 and refused.json()["operation"] == 1
    assert (await client.get(item(f"batch/{uid}", "new"))).status_code == 404, \
        "nothing of a refused batch is written"
    bad = await client.post("/v1/batch", json={"operations": [
        {"op": "store.put", "namespace": [], "key": "k", "body": {"value": {}}}]})
    assert bad.status_code == 422


async def test_events_keep_the_order_of_their_writes_in_a_batch(client: httpx.AsyncClient,
                                                                 uid: str) -> None:
    """A store PUT writes its event in its own statement on Postgres, unless another write's
    event is still pending: either way the feed lists them in the batch's order."""
    start = (await client.get("/v1/events", params={"limit": 1})).json()["next_cursor"]
    ns = ["order", uid]
    done = await client.post("/v1/batch", json={"operations": [
        {"op": "store.put", "namespace": ns, "key": "a", "body": {"value": {"n": 1}}},
        {"op": "thread.put", "thread_id": f"t-{uid}", "body": {"state": {}}},
        {"op": "store.put", "namespace": ns, "key": "b", "body": {"value": {"n": 2}}},
        {"op": "store.put", "namespace": ns, "key": "a", "if_match": '"1"',
         "body": {"value": {"n": 3}}},
    ]})
    assert done.status_code == 200, done.text
    events = [e for prefix in (f"/v1/store/items/order/{uid}", f"/v1/threads/t-{uid}")
              for e in (await client.get("/v1/events", params={
                  "cursor": start, "resource_prefix": prefix})).json()["data"]]
    ours = [(e["type"], e["resource"], e["revision"])
            for e in sorted(events, key=lambda e: e["seq"])]
    assert ours == [("store.item.created", item(f"order/{uid}", "a"), 1),
                    ("thread.created", f"/v1/threads/t-{uid}", 1),
                    ("store.item.created", item(f"order/{uid}", "b"), 1),
                    ("store.item.updated", item(f"order/{uid}", "a"), 2)]


# --- time to live ------------------------------------------------------------------------


async def test_expired_items_are_never_read_and_the_sweeper_removes_them(
        app: FastAPI, client: httpx.AsyncClient, settings: Settings, uid: str) -> None:
    ns = f"ttl/{uid}"
    short = (await put(client, item(ns, "short"), {"value": {"k": "v"}, "ttl_seconds": 0.05,
                                                    "vectors": {"v": {"k": [1.0, 0.0]}}})).json()
    long = (await put(client, item(ns, "long"), {"value": {"k": "v"}, "ttl_seconds": 3600})).json()
    assert long["ttl_seconds"] == 3600 and long["expires_at"] > long["updated_at"]
    assert short["ttl_seconds"] == 0.05
    await wait_past(short["expires_at"])
    # Not swept yet: every read already treats it as gone.
    assert (await client.get(item(ns, "short"))).status_code == 404
    assert keys(await search(client, namespace_prefix=["ttl", uid])) == ["long"]
    assert keys(await search(client, namespace_prefix=["ttl", uid], query="v")) == ["long"]
    assert keys(await search(client, namespace_prefix=["ttl", uid],
                             vector={"index": "v", "embedding": [1, 0]})) == ["long"]
    assert (await client.put(item(ns, "short"), json={"value": {}},
                             headers={"If-Match": '"1"'})).status_code == 412
    namespaces = (await client.post(NAMESPACES, json={"prefix": ["ttl", uid]})).json()["data"]
    assert namespaces == [["ttl", uid]]

    retention = Retention(app.state.db, settings)
    assert (await retention.count()).expired_store_items >= 1
    report = await retention.sweep()
    assert report.expired_store_items >= 1
    expired = (await client.get("/v1/events", params={
        "type": "store.item.expired", "resource_prefix": item(ns, "short")})).json()["data"]
    assert [(e["revision"], e["actor"]) for e in expired] == [(1, "retention")]
    again = await client.put(item(ns, "short"), json={"value": {}}, headers={"If-None-Match": "*"})
    assert again.status_code == 201 and again.headers["etag"] == '"2"'


async def test_an_expired_item_written_again_keeps_none_of_its_old_vectors(
        client: httpx.AsyncClient, uid: str) -> None:
    ns = f"ttlv/{uid}"
    old = (await put(client, item(ns, "k"), {"value": {"k": "v"}, "ttl_seconds": 0.05,
                                              "vectors": {"v": {"k": [1.0, 0.0]}}})).json()
    await wait_past(old["expires_at"])
    # Not swept: written again as a new item (its revisions continue), without vectors.
    again = await client.put(item(ns, "k"), json={"value": {"k": "w"}},
                             headers={"If-None-Match": "*"})
    assert again.status_code == 201 and again.headers["etag"] == '"2"', again.text
    found = await search(client, namespace_prefix=["ttlv", uid],
                         vector={"index": "v", "embedding": [1, 0]})
    assert [(f["key"], f["score"]) for f in found] == [("k", None)], \
        "the expired content's vector went with it"


async def test_refresh_on_read_restarts_the_time_to_live(client: httpx.AsyncClient,
                                                         uid: str) -> None:
    u = item(f"refresh/{uid}", "k")
    written = (await put(client, u, {"value": {"t": "x"}, "ttl_seconds": 600})).json()
    plain = (await client.get(u)).json()
    assert plain["expires_at"] == written["expires_at"], "a plain read changes nothing"
    refreshed = await client.get(u, params={"refresh_ttl": "true"})
    assert refreshed.status_code == 200
    assert refreshed.json()["expires_at"] > written["expires_at"]
    assert refreshed.json()["revision"] == 1 and refreshed.json()["updated_at"] == \
        written["updated_at"], "a refresh is bookkeeping: no new revision"
    assert (await client.get(u)).json()["expires_at"] == refreshed.json()["expires_at"]
    found = await search(client, namespace_prefix=["refresh", uid], refresh_ttl=True)
    assert found[0]["expires_at"] > refreshed.json()["expires_at"]
    assert (await client.get(u)).json()["expires_at"] == found[0]["expires_at"]
    kept = await client.patch(u, json={"value": {"u": 1}}, headers={"If-Match": '"1"'})
    assert kept.json()["ttl_seconds"] == 600, "a patch keeps the time to live and restarts it"
    cleared = await client.patch(u, json={"ttl_seconds": None}, headers={"If-Match": '"2"'})
    assert cleared.json()["ttl_seconds"] is None and cleared.json()["expires_at"] is None


# --- search ------------------------------------------------------------------------------


async def test_filters_compare_by_json_type(client: httpx.AsyncClient, uid: str) -> None:
    ns = f"filter/{uid}"
    values = {
        "nine": {"n": 9, "s": "9", "tag": "a", "ok": True, "nested": {"age": 30, "city": "Oslo"}},
        "ten": {"n": 10, "s": "10", "tag": "b", "ok": 1, "nested": {"age": 17}},
        "big": {"n": 10.5, "s": "abc", "list": [1, 2], "obj": {"x": 1, "y": [True]}},
        "none": {"n": None, "s": None},
    }
    for key, value in values.items():
        await put(client, item(ns, key), {"value": value})

    async def matching(filter_: dict) -> set[str]:
        return set(keys(await search(client, namespace_prefix=["filter", uid], filter=filter_,
                                     limit=100)))

    # Numbers numerically: 9 < 10 (LangGraph's PostgresStore compares the text "9" >= "10").
    assert await matching({"n": {"$gte": 10}}) == {"ten", "big"}
    assert await matching({"n": {"$lt": 10}}) == {"nine"}
    assert await matching({"n": {"$gt": 9, "$lte": 10}}) == {"ten"}
    # Strings as text: "9" > "10", and a string bound never matches a number.
    assert await matching({"s": {"$gte": "9"}}) == {"nine", "big"}
    assert await matching({"n": {"$gte": "0"}}) == set()
    assert await matching({"n": 10}) == {"ten"} == await matching({"n": {"$eq": 10.0}})
    assert await matching({"ok": True}) == {"nine"}, "true is not 1"
    assert await matching({"ok": 1}) == {"ten"}
    assert await matching({"tag": {"$ne": "a"}}) == {"ten", "big", "none"}, \
        "$ne matches a missing key"
    assert await matching({"n": None}) == {"none"}
    assert await matching({"tag": None}) == {"big", "none"}, "a missing key reads as null"
    assert await matching({"n": {"$ne": None}}) == {"nine", "ten", "big"}
    assert await matching({"nested": {"age": {"$gte": 18}}}) == {"nine"}
    assert await matching({"nested": {"city": "Oslo", "age": 30}}) == {"nine"}
    assert await matching({"nested": {"age": {"$ne": 1}}}) == {"nine", "ten"}, \
        "nested conditions need an object there"
    assert await matching({"list": [1, 2]}) == {"big"}
    assert await matching({"list": [2, 1]}) == set()
    assert await matching({"obj": {"$eq": {"y": [True], "x": 1}}}) == {"big"}
    assert await matching({"obj": {"$ne": {"y": [True], "x": 1}}}) == {"nine", "ten", "none"}
    assert await matching({"obj": {"$ne": {"x": 1}}}) == {"nine", "ten", "big", "none"}
    for bad in ({"n": {"$in": [1]}}, {"n": {"$gt": [1]}}, {"n": {"$gt": True}},
                {'a"b': 1}):
        refused = await client.post(SEARCH, json={"filter": bad})
        assert refused.status_code == 422, (bad, refused.text)
        assert refused.headers["content-type"] == "application/problem+json"


async def test_search_pages_by_recency_and_by_relevance(client: httpx.AsyncClient,
                                                        uid: str) -> None:
    ns = ["rank", uid]
    texts = {"a": "the user likes dark chocolate", "b": "meetings before nine are a pain",
             "c": "chocolate cake and chocolate milk", "d": "nothing to see"}
    for key, text in texts.items():
        await put(client, item(f"rank/{uid}", key), {
            "value": {"text": text, "meta": {"secret": "chocolate"}}, "index": ["text"],
            "vectors": {"small": {"text": [1.0 if key == "b" else 0.1, 1.0]},
                        "large": {"text": [0.0, 0.0, 1.0 if key == "d" else 0.0, 0.5]}}})
    assert keys(await search(client, namespace_prefix=ns)) == ["d", "c", "b", "a"]
    first = await client.post(SEARCH, json={"namespace_prefix": ns, "limit": 2})
    assert keys(first.json()["data"]) == ["d", "c"] and first.json()["has_more"] is True
    last = await client.post(SEARCH, json={"namespace_prefix": ns, "limit": 2, "offset": 2})
    assert keys(last.json()["data"]) == ["b", "a"] and last.json()["has_more"] is False

    lexical = await search(client, namespace_prefix=ns, query="Chocolate!")
    assert keys(lexical) == ["c", "a"], "only the index fields are read; more matches rank first"
    assert all(found["score"] > 0 for found in lexical)
    assert keys(await search(client, namespace_prefix=ns, query="meetings pain")) == ["b"]
    assert await search(client, namespace_prefix=ns, query="!!!") == []

    by_vector = await search(client, namespace_prefix=ns,
                             vector={"index": "small", "embedding": [1.0, 0.0]})
    assert keys(by_vector)[0] == "b" and by_vector[0]["score"] == pytest.approx(2 ** -0.5, 1e-6)
    assert keys(by_vector) == ["b", "d", "c", "a"], "equal scores: the newer item first"
    paged = await client.post(SEARCH, json={"namespace_prefix": ns, "limit": 2, "offset": 2,
                                            "vector": {"index": "small", "embedding": [1, 0]}})
    assert keys(paged.json()["data"]) == ["c", "a"] and paged.json()["has_more"] is False
    larger = await search(client, namespace_prefix=ns,
                          vector={"index": "large", "embedding": [0, 0, 1, 0]})
    assert keys(larger)[0] == "d", "indexes of different dimensions side by side"
    ip = await search(client, namespace_prefix=ns, vector={
        "index": "small", "embedding": [2.0, 0.0], "metric": "inner_product"})
    assert ip[0]["score"] == pytest.approx(2.0)
    l2 = await search(client, namespace_prefix=ns, vector={
        "index": "small", "embedding": [1.0, 1.0], "metric": "l2"})
    assert keys(l2)[0] == "b" and l2[0]["score"] == pytest.approx(0.0, abs=1e-6)
    assert l2[1]["score"] == pytest.approx(-0.9, 1e-5)

    hybrid = await search(client, namespace_prefix=ns, query="chocolate",
                          vector={"index": "small", "embedding": [1.0, 0.0]})
    # c: text rank 1, vector rank >= 2; b: vector rank 1, no text match.
    scores = {found["key"]: found["score"] for found in hybrid}
    assert set(scores) == {"a", "b", "c", "d"}
    assert scores["b"] == pytest.approx(1 / 61) and scores["c"] > scores["b"]
    assert scores["d"] < scores["b"], "d is in the vector ranking only, and last"

    mismatch = await client.post(SEARCH, json={"namespace_prefix": ns, "vector": {
        "index": "small", "embedding": [1.0, 0.0, 0.0]}})
    assert mismatch.status_code == 422 and mismatch.json()["code"] == "vector_dims_mismatch"
    unknown = await search(client, namespace_prefix=ns, vector={"index": "nope",
                                                                "embedding": [1.0]})
    assert [found["score"] for found in unknown] == [None] * 4, \
        "items without a vector in the index follow, unscored"


async def test_a_prefix_is_its_namespace_and_those_below_by_recency(client: httpx.AsyncClient,
                                                                     uid: str) -> None:
    root = f"pre-{uid}/b"
    for n, namespace in enumerate((root, f"{root}/c", f"pre-{uid}/b-x", root, f"{root}/c")):
        await put(client, item(namespace, f"k{n}"), {"value": {"n": n, "even": n % 2 == 0}})
    prefix = [f"pre-{uid}", "b"]
    assert keys(await search(client, namespace_prefix=prefix)) == ["k4", "k3", "k1", "k0"]
    page = await client.post(SEARCH, json={"namespace_prefix": prefix, "limit": 2, "offset": 1})
    assert keys(page.json()["data"]) == ["k3", "k1"] and page.json()["has_more"] is True
    assert keys(await search(client, namespace_prefix=prefix, filter={"even": True})) == \
        ["k4", "k0"]


async def test_searches_of_one_shape_at_once_each_get_their_own_answer(
        client: httpx.AsyncClient, uid: str) -> None:
    """A filter's statement is built once per shape and its values are parameters: 36
    searches of three shapes in flight together, each under its own prefix with its own
    values, each get exactly their own items."""
    owners = range(12)
    for owner in owners:
        for n in range(4):
            await put(client, item(f"shape-{uid}/o{owner}", f"k{n}"), {
                "value": {"owner": owner, "n": owner * 10 + n, "text": f"word{owner} filler"},
                "index": ["text"]})

    async def one(owner: int, shape: int) -> tuple[int, int, list[str]]:
        prefix = [f"shape-{uid}", f"o{owner}"]
        if shape == 0:  # a scalar's containment
            found = await search(client, namespace_prefix=prefix, filter={"owner": owner})
        elif shape == 1:  # a numeric comparison
            found = await search(client, namespace_prefix=[f"shape-{uid}"],
                                 filter={"n": {"$gte": owner * 10 + 2, "$lt": owner * 10 + 4}})
        else:  # lexical, filtered
            found = await search(client, namespace_prefix=prefix, query=f"word{owner}",
                                 filter={"owner": {"$gte": owner}})
        return owner, shape, sorted(f"{i['namespace'][-1]}/{i['key']}" for i in found)

    answers = await asyncio.gather(*(one(owner, shape) for owner in owners
                                     for shape in range(3)))
    for owner, shape, got in answers:
        wanted = [f"o{owner}/k{n}" for n in ((2, 3) if shape == 1 else range(4))]
        assert got == wanted, (owner, shape)


async def test_vectors_are_replaced_merged_and_checked(client: httpx.AsyncClient,
                                                       uid: str) -> None:
    ns = f"vec/{uid}"
    u = item(ns, "k")
    await put(client, u, {"value": {"t": "x"}, "vectors": {"m": {"a": [1, 0], "b": [0, 1]}}})
    query = {"namespace_prefix": ["vec", uid], "vector": {"index": "m", "embedding": [0, 1]}}
    assert (await search(client, **query))[0]["score"] == pytest.approx(1.0)
    await client.patch(u, json={"vectors": {"m": {"b": None}}}, headers={"If-Match": '"1"'})
    assert (await search(client, **query))[0]["score"] == pytest.approx(0.0)
    await client.patch(u, json={"vectors": {"m": None}}, headers={"If-Match": '"2"'})
    assert (await search(client, **query))[0]["score"] is None
    await put(client, u, {"value": {}, "vectors": {"m": {"a": [0, 1]}}}, {"If-Match": "*"})
    assert (await search(client, **query))[0]["score"] == pytest.approx(1.0)
    await put(client, u, {"value": {}}, {"If-Match": "*"})
    assert (await search(client, **query))[0]["score"] is None, "a PUT replaces the vectors"
    await put(client, u, {"value": {}, "vectors": {"m": {"a": [0, 1]}}}, {"If-Match": "*"})

    other = item(ns, "other")
    for body, code in (
        ({"value": {}, "vectors": {"m": {"a": [1, 2, 3]}}}, "vector_dims_mismatch"),
        ({"value": {}, "vectors": {"n": {"a": [1, 2], "b": [1]}}}, "vector_dims_mismatch"),
        ({"value": {}, "vectors": {"n": {"a": [3.5e38, 1]}}}, "validation_failed"),
        ({"value": {}, "vectors": {"n": {"a": []}}}, "validation_failed"),
        ({"value": {}, "vectors": {"n": {"a": [1.0] * 4097}}}, "validation_failed"),
        ({"value": {}, "vectors": {"n": {f"f{i}": [1.0] for i in range(65)}}},
         "too_many_vectors"),
        ({"value": {"x": "y" * 300_000}}, "value_too_large"),
        ({"value": {}, "index": ["a..b"]}, "validation_failed"),
        ({"value": {}, "index": 0}, "validation_failed"),
        ({"value": {}, "ttl_seconds": 0}, "validation_failed"),
        ({"value": []}, "validation_failed"),
    ):
        refused = await client.put(other, json=body)
        assert refused.status_code == 422, (body if len(str(body)) < 200 else code, refused.text)
        assert refused.json()["code"] == code, refused.text
    assert (await client.get(other)).status_code == 404, "nothing of a refused write is stored"


async def test_list_namespaces(client: httpx.AsyncClient, uid: str) -> None:
    for namespace in (f"ls-{uid}/a/x", f"ls-{uid}/a/y/deep", f"ls-{uid}/b/x", f"ls-{uid}/b"):
        await put(client, item(namespace, "k"), {"value": {}})
    await put(client, item(f"ls-{uid}/gone", "k"), {"value": {}})
    await client.delete(item(f"ls-{uid}/gone", "k"), headers={"If-Match": "*"})

    async def listed(**body: object) -> list[list[str]]:
        response = await client.post(NAMESPACES, json={"prefix": [f"ls-{uid}"], **body})
        assert response.status_code == 200, response.text
        return response.json()["data"]

    root = f"ls-{uid}"
    assert await listed() == [[root, "a", "x"], [root, "a", "y", "deep"], [root, "b"],
                              [root, "b", "x"]]
    assert await listed(max_depth=2) == [[root, "a"], [root, "b"]]
    assert await listed(suffix=["x"]) == [[root, "a", "x"], [root, "b", "x"]]
    assert await listed(prefix=[root, "*", "x"]) == [[root, "a", "x"], [root, "b", "x"]]
    assert await listed(suffix=["*", "deep"]) == [[root, "a", "y", "deep"]]
    page = await client.post(NAMESPACES, json={"prefix": [root], "limit": 2, "offset": 1})
    assert page.json() == {"data": [[root, "a", "y", "deep"], [root, "b"]], "has_more": True}
    assert (await client.post(NAMESPACES, json={"prefix": [""]})).status_code == 422
    assert (await client.post(NAMESPACES, json={"max_depth": 0})).status_code == 422


@pytest.mark.slow
async def test_tenants_do_not_see_each_other(secured_client: httpx.AsyncClient,
                                             secured_database_url: str, uid: str) -> None:
    """Two keys, two tenants: neither reads, searches or lists the other's items (the auth
    matrix covers every operation; this is the store's own reading of it)."""
    a = create_key(secured_database_url, f"ta-{uid}")
    b = create_key(secured_database_url, f"tb-{uid}")
    client = secured_client
    u = item(f"shared/{uid}", "k")
    assert (await client.put(u, json={"value": {"owner": "a"}, "vectors": {"v": {"f": [1.0]}}},
                             headers={**bearer(a), "If-None-Match": "*"})).status_code == 201
    assert (await client.get(u, headers=bearer(b))).status_code == 404
    for body in ({"namespace_prefix": ["shared", uid]}, {"query": "a"},
                 {"vector": {"index": "v", "embedding": [1.0, 2.0]}}):
        found = await client.post(SEARCH, json=body, headers=bearer(b))
        assert found.status_code == 200 and found.json()["data"] == [], body
    listed = await client.post(NAMESPACES, json={}, headers=bearer(b))
    assert listed.json()["data"] == []
    mine = await client.put(u, json={"value": {"owner": "b"}, "vectors": {"v": {"f": [1, 2]}}},
                            headers={**bearer(b), "If-None-Match": "*"})
    assert mine.status_code == 201, "the same address is another item in another tenant, " \
                                    "and an index name's dimension is the tenant's"
    assert (await client.get(u, headers=bearer(a))).json()["value"] == {"owner": "a"}
