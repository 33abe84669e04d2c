"""The LangGraph SDK's own client, `langgraph_sdk.get_client(url=<server>/langgraph).store`,
against real servers on each backend: every store call, async and blocking, the same items
as `/v1/store` holds them, and API keys sent as the SDK sends them (`x-api-key`), tenants
kept apart."""

from __future__ import annotations

from datetime import datetime

import httpx
import pytest
from langgraph_sdk import get_client, get_sync_client
from langgraph_sdk.errors import (
    AuthenticationError,
    BadRequestError,
    PermissionDeniedError,
    UnprocessableEntityError,
)

from tests.support import ServerProcess, create_key

pytestmark = pytest.mark.slow  # every test here talks to a server process


def item_keys(page: dict) -> list[str]:
    return [item["key"] for item in page["items"]]


@pytest.mark.anyio
async def test_every_store_call_of_the_async_sdk(server: ServerProcess, uid: str) -> None:
    user = ["users", f"u-{uid}"]
    memories, notes = [*user, "memories"], [*user, "notes"]
    async with get_client(url=f"{server.base_url}/langgraph", api_key=None) as client:
        store = client.store
        assert await store.put_item(memories, "tea", {"text": "likes green tea", "kind": "pref",
                                                      "n": 3}, index=["text"]) is None
        await store.put_item(memories, "k/2 é", {"text": "flies to Rome", "kind": "trip", "n": 7})
        await store.put_item(notes, "quiet", {"text": "no tea after six", "n": 1}, index=False)

        item = await store.get_item(memories, "tea")
        assert set(item) == {"namespace", "key", "value", "created_at", "updated_at"}
        assert (item["namespace"], item["key"], item["value"]) == (
            memories, "tea", {"text": "likes green tea", "kind": "pref", "n": 3})
        assert (await store.get_item(memories, "k/2 é"))["value"]["kind"] == "trip"
        assert await store.get_item(memories, "missing") is None, "LangGraph reads null"

        trips = await store.search_items(user, filter={"kind": "trip"})
        assert item_keys(trips) == ["k/2 é"] and trips["items"][0]["score"] is None
        assert item_keys(await store.search_items(user, filter={"n": {"$gte": 3}}, limit=1)) \
            == ["k/2 é"], "most recently updated first"
        assert item_keys(await store.search_items(user, filter={"n": {"$gte": 3}}, limit=1,
                                                  offset=1)) == ["tea"]
        assert item_keys(await store.search_items(notes)) == ["quiet"]
        tea = await store.search_items(user, query="tea")
        assert item_keys(tea) == ["tea"], "the note is not indexed (index=False)"
        assert tea["items"][0]["score"] > 0

        assert await store.list_namespaces(prefix=user) == {"namespaces": [memories, notes]}
        assert await store.list_namespaces(prefix=user, suffix=["notes"]) == {
            "namespaces": [notes]}
        assert await store.list_namespaces(prefix=["users", "*", "notes"], suffix=notes[1:]) \
            == {"namespaces": [notes]}
        assert await store.list_namespaces(prefix=user, max_depth=2) == {"namespaces": [user]}
        assert await store.list_namespaces(prefix=user, limit=1, offset=1) == {
            "namespaces": [notes]}

        await store.put_item(memories, "brief", {"text": "gone soon"}, ttl=30)
        async with httpx.AsyncClient(base_url=server.base_url) as http:
            url = f"/v1/store/items/users/u-{uid}/memories/brief"
            first = (await http.get(url)).json()
            assert first["ttl_seconds"] == 30 * 60, "the SDK's ttl counts minutes"
            assert (await store.get_item(memories, "brief", refresh_ttl=True))["key"] == "brief"
            refreshed = (await http.get(url)).json()
            assert datetime.fromisoformat(refreshed["expires_at"]) > \
                datetime.fromisoformat(first["expires_at"])
            assert (await http.get(f"/v1/store/items/users/u-{uid}/memories/k@2F2@20@C3@A9")
                    ).json()["value"]["text"] == "flies to Rome", "the same items as /v1/store"
            # What the SDK refuses before sending, the server refuses too: a GET could not
            # name a label with a period.
            dotted = await http.put("/langgraph/store/items", json={
                "namespace": ["a.b"], "key": "k", "value": {}})
            assert dotted.status_code == 422, dotted.text
            assert dotted.json()["errors"][0]["pointer"] == "/namespace/0"
            empty = await http.get("/langgraph/store/items", params={"namespace": "a..b",
                                                                      "key": "k"})
            assert empty.json()["errors"][0] == {"parameter": "namespace", "code": "empty_label",
                                                 "message": "Namespace labels are non-empty "
                                                            "strings."}

        with pytest.raises(UnprocessableEntityError) as refused:
            await store.search_items(user, limit=0)
        assert refused.value.response.headers["content-type"] == "application/problem+json"
        assert refused.value.code == "validation_failed"

        assert await store.delete_item(memories, "tea") is None
        assert await store.get_item(memories, "tea") is None
        await store.delete_item(memories, "tea")  # deleting what is gone is no error
        assert item_keys(await store.search_items(memories, query="tea")) == []


def test_the_blocking_sdk(server: ServerProcess, uid: str) -> None:
    namespace = ["agents", f"a-{uid}"]
    with get_sync_client(url=f"{server.base_url}/langgraph", api_key=None) as client:
        client.store.put_item(namespace, "plan", {"steps": ["search", "book"]}, index=False)
        assert client.store.get_item(namespace, "plan")["value"] == {"steps": ["search", "book"]}
        assert item_keys(client.store.search_items(namespace, query="search")) == [], \
            "index=False"
        assert item_keys(client.store.search_items(namespace, filter={"steps": [
            "search", "book"]})) == ["plan"]
        assert client.store.list_namespaces(prefix=namespace) == {"namespaces": [namespace]}
        client.store.delete_item(namespace, "plan")
        assert client.store.get_item(namespace, "plan") is None


def test_api_keys_as_the_sdk_sends_them(secured_database_url: str, uid: str) -> None:
    mine = create_key(secured_database_url, tenant=f"a-{uid}")
    theirs = create_key(secured_database_url, tenant=f"b-{uid}")
    reader = create_key(secured_database_url, tenant=f"a-{uid}", scopes="read")
    namespace = ["users", f"u-{uid}"]
    with ServerProcess(secured_database_url) as server:
        url = f"{server.base_url}/langgraph"
        with get_sync_client(url=url, api_key=mine) as client:
            client.store.put_item(namespace, "k", {"text": "mine"})
            assert client.store.get_item(namespace, "k")["value"] == {"text": "mine"}
        with get_sync_client(url=url, api_key=theirs) as other:
            assert other.store.get_item(namespace, "k") is None
            assert other.store.search_items(namespace) == {"items": []}
            assert other.store.list_namespaces(prefix=namespace) == {"namespaces": []}
            other.store.delete_item(namespace, "k")  # another tenant's item: not there
        with get_sync_client(url=url, api_key=reader) as read_only:
            assert item_keys(read_only.store.search_items(namespace)) == ["k"]
            with pytest.raises(PermissionDeniedError):
                read_only.store.put_item(namespace, "k", {"text": "overwritten"})
        with get_sync_client(url=url, api_key=None) as anonymous:
            with pytest.raises(AuthenticationError) as refused:
                anonymous.store.get_item(namespace, "k")
            assert refused.value.response.headers["content-type"] == "application/problem+json"
            with pytest.raises(AuthenticationError):
                anonymous.store.put_item(namespace, "k", {"text": "anonymous"})
        with get_sync_client(url=url, api_key=f"{mine}x") as wrong, \
                pytest.raises(AuthenticationError):
            wrong.store.search_items(namespace)
        with get_sync_client(url=url, api_key=mine,
                             headers={"Authorization": f"Bearer {theirs}"}) as both, \
                pytest.raises(BadRequestError):
            both.store.get_item(namespace, "k")
        with get_sync_client(url=url, api_key=mine) as client:
            assert client.store.get_item(namespace, "k")["value"] == {"text": "mine"}
        refused_v1 = httpx.get(f"{server.base_url}/v1/store/items/users/u-{uid}/k",
                               headers={"x-api-key": mine})
        assert refused_v1.status_code == 401, "x-api-key is the SDK's routes' header only"
