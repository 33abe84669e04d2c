"""MCP servers over HTTP: API.md section 7 under section 2, on SQLite and Postgres."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.anyio


async def test_conditional_requests(keyed_client: httpx.AsyncClient, uid: str) -> None:
    c, u = keyed_client, f"/v1/mcp-servers/ib-{uid}"
    missing = await c.put(u, json={"server_type": "broker"}, headers={"If-Match": "*"})
    assert missing.status_code == 412 and missing.json()["current_revision"] is None
    assert (await c.get(u)).status_code == 404

    created = await c.put(u, json={
        "server_type": "broker", "state": {"account_id": "DU1", "positions": []},
        "secrets": {"session_token": "tok-1", "api_key": "k-1"},
        "last_connected_at": "2026-11-20T09:00:00+01:00",
    })
    assert created.status_code == 201, created.text
    assert created.headers["etag"] == '"1"' and created.headers["location"] == u
    body = created.json()
    assert body == {
        "server_name": f"ib-{uid}", "server_type": "broker", "revision": 1,
        "state": {"account_id": "DU1", "positions": []},
        "secrets": {"session_token": "***", "api_key": "***"},
        "last_connected_at": "2026-11-20T08:00:00.000000Z",
        "created_at": body["created_at"], "updated_at": body["updated_at"],
    }
    assert (await c.get(u)).json() == body
    cached = await c.get(u, headers={"If-None-Match": '"1"'})
    assert cached.status_code == 304 and cached.content == b""

    assert (await c.put(u, json={"server_type": "broker"})).status_code == 428
    replaced = await c.put(u, json={"server_type": "broker", "state": {"account_id": "DU2"}},
                           headers={"If-Match": '"1"'})
    assert replaced.status_code == 200 and replaced.headers["etag"] == '"2"'
    assert replaced.json()["state"] == {"account_id": "DU2"}
    assert replaced.json()["secrets"] == {"session_token": "***", "api_key": "***"}, \
        "omitted secrets are kept"
    assert replaced.json()["last_connected_at"] == "2026-11-20T08:00:00.000000Z", \
        "omitted last_connected_at is kept"
    stale = await c.put(u, json={"server_type": "x"}, headers={"If-Match": '"1"'})
    assert stale.status_code == 412 and stale.json()["current_revision"] == 2
    only = await c.put(u, json={"server_type": "x"}, headers={"If-None-Match": "*"})
    assert only.status_code == 412 and only.json()["code"] == "already_exists"

    assert (await c.delete(u)).status_code == 428
    assert (await c.delete(u, headers={"If-Match": '"1"'})).status_code == 412
    assert (await c.delete(u, headers={"If-Match": '"2"'})).status_code == 204
    assert (await c.get(u)).status_code == 404
    assert (await c.delete(u, headers={"If-Match": "*"})).status_code == 412
    again = await c.put(u, json={"server_type": "broker", "secrets": {"api_key": "***"}})
    assert again.status_code == 422 and again.json()["code"] == "unknown_secret", \
        "a deleted server keeps no secrets to keep"
    again = await c.put(u, json={"server_type": "broker"})
    assert again.status_code == 201 and again.json()["revision"] == 4
    assert again.json()["secrets"] == {} and again.json()["last_connected_at"] is None


async def test_merge_patch(keyed_client: httpx.AsyncClient, uid: str) -> None:
    c, u = keyed_client, f"/v1/mcp-servers/news-{uid}"
    assert (await c.patch(u, json={"state": {}})).status_code == 404
    await c.put(u, json={"server_type": "news", "state": {"feeds": ["a"], "cache": {"x": 1}},
                         "secrets": {"token": "t1", "other": "o1"}})
    assert (await c.patch(u, json={"state": {}})).status_code == 428
    patched = await c.patch(
        u, content=b'{"state": {"cache": {"x": null, "y": 2}}, "last_connected_at": '
                   b'"2026-11-29T22:24:31.139574Z", "secrets": {"other": null, "new": "n1"}}',
        headers={"If-Match": '"1"', "content-type": "application/merge-patch+json"})
    assert patched.status_code == 200, patched.text
    body = patched.json()
    assert body["state"] == {"feeds": ["a"], "cache": {"y": 2}}
    assert body["secrets"] == {"token": "***", "new": "***"}
    assert body["last_connected_at"] == "2026-11-29T22:24:31.139574Z"
    assert body["server_type"] == "news" and body["revision"] == 2
    clear = await c.patch(u, json={"last_connected_at": None, "server_type": "feed"},
                          headers={"If-Match": '"2"'})
    assert clear.json()["last_connected_at"] is None and clear.json()["server_type"] == "feed"
    bad = await c.patch(u, json={"server_type": None}, headers={"If-Match": '"3"'})
    assert bad.status_code == 422 and bad.json()["errors"][0]["pointer"] == "/server_type"
    naive = await c.patch(u, json={"last_connected_at": "2026-11-29T22:24:31"},
                          headers={"If-Match": '"3"'})
    assert naive.status_code == 422, "timestamps need a time zone"
    unknown = await c.patch(u, json={"secret": {}}, headers={"If-Match": '"3"'})
    assert unknown.status_code == 422 and unknown.json()["code"] == "unknown_field"
    assert (await c.get(u)).json()["revision"] == 3


async def test_list_by_name_and_type(keyed_client: httpx.AsyncClient, uid: str) -> None:
    c = keyed_client
    names = [f"{uid}-{n}" for n in ("b", "A", "a", "_z", "c.1")]
    for i, name in enumerate(names):
        r = await c.put(f"/v1/mcp-servers/{name}", json={
            "server_type": f"t{uid}-{i % 2}", "secrets": {"k": f"v{i}"}})
        assert r.status_code == 201
    await c.delete(f"/v1/mcp-servers/{names[0]}", headers={"If-Match": '"1"'})

    async def walk(server_type: str, **extra: str) -> list[dict]:
        seen, cursor = [], None
        while True:
            params = {"server_type": server_type, "limit": 1, **extra}
            if cursor:
                params["cursor"] = cursor
            page = await c.get("/v1/mcp-servers", params=params)
            assert page.status_code == 200, page.text
            seen += page.json()["data"]
            cursor = page.json()["next_cursor"]
            if cursor is None:
                return seen

    evens = await walk(f"t{uid}-0")
    assert [s["server_name"] for s in evens] == sorted([names[2], names[4]])
    assert all(s["secrets"] == {"k": "***"} for s in evens)
    odds = await walk(f"t{uid}-1", include_secrets="true")
    assert [(s["server_name"], s["secrets"]) for s in odds] == sorted(
        [(names[1], {"k": "v1"}), (names[3], {"k": "v3"})])
    bad = await c.get("/v1/mcp-servers", params={"cursor": "x"})
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_cursor"


async def test_bad_input(keyed_client: httpx.AsyncClient, uid: str) -> None:
    u = f"/v1/mcp-servers/{uid}"
    for body in ({}, {"server_type": ""}, {"server_type": "x", "state": []},
                 {"server_type": "x", "secrets": {"k": 1}},
                 {"server_type": "x", "secrets": {"bad name": "v"}},
                 {"server_type": "x", "secrets": ["v"]},
                 {"server_type": "x", "last_connected_at": "yesterday"}):
        r = await keyed_client.put(u, json=body)
        assert r.status_code == 422, (body, r.text)
        assert r.headers["content-type"] == "application/problem+json"
    assert (await keyed_client.get(u)).status_code == 404, "nothing was written"


async def test_a_timestamp_before_year_1000_reads_back_as_rfc_3339(
        keyed_client: httpx.AsyncClient, uid: str) -> None:
    """Years are four digits in every timestamp written (RFC 3339), so what is read back is
    accepted when sent again."""
    u = f"/v1/mcp-servers/old-{uid}"
    created = await keyed_client.put(u, json={"server_type": "broker",
                                              "last_connected_at": "0999-01-02T03:04:05Z"})
    assert created.status_code == 201, created.text
    stamp = created.json()["last_connected_at"]
    assert stamp == "0999-01-02T03:04:05.000000Z"
    again = await keyed_client.put(u, json={"server_type": "broker", "last_connected_at": stamp},
                                   headers={"If-Match": created.headers["etag"]})
    assert again.status_code == 200, again.text
