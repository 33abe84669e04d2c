"""Opaque items, any role, removal (pop, trim, by id), redaction,
`created_after` and threads by activity, on SQLite and Postgres."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import select

from app.events.models import Event
from app.idempotency.models import IdempotencyKey
from app.messages.models import Message

pytestmark = pytest.mark.anyio

# Keys in an order no sorting would give, nested, with a null and a part without `type`.
ITEM = {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{\"q\":1}",
        "zeta": {"b": 2, "a": 1}, "alpha": None, "parts": [{"text": "no type here"}]}


async def append(client: httpx.AsyncClient, thread_id: str, *messages: dict[str, Any],
                 **headers: str) -> httpx.Response:
    return await client.post(f"/v1/threads/{thread_id}/messages",
                             json={"messages": list(messages)}, headers=headers)


async def live(client: httpx.AsyncClient, thread_id: str, **params: Any) -> list[dict[str, Any]]:
    response = await client.get(f"/v1/threads/{thread_id}/messages",
                                params={"limit": 1000, **params})
    assert response.status_code == 200, response.text
    data: list[dict[str, Any]] = response.json()["data"]
    return data


async def revision(client: httpx.AsyncClient, thread_id: str) -> int:
    value: int = (await client.get(f"/v1/threads/{thread_id}")).json()["revision"]
    return value


async def test_items_are_stored_verbatim_and_roles_are_any_short_name(
        client: httpx.AsyncClient, uid: str) -> None:
    response = await append(client, uid, {"role": "model", "item": ITEM},
                            {"role": "user", "content": "hi", "item": [1, "two", {"z": 0}]},
                            {"role": "agent:planner", "content": [{"text": "a part, no type"}]})
    assert response.status_code == 201, response.text
    raw = (await client.get(f"/v1/threads/{uid}/messages")).text
    # The same keys in the same order, byte for byte in the answer.
    assert json.dumps(ITEM, separators=(",", ":")) in raw
    stored = await live(client, uid)
    assert [m["role"] for m in stored] == ["model", "user", "agent:planner"]
    assert stored[0]["item"] == ITEM and list(stored[0]["item"]) == list(ITEM)
    assert "content" in stored[0] and stored[0]["content"] is None
    assert "item" not in stored[2]
    # The known roles keep their rules.
    for bad in ({"role": "user", "content": [{"text": "no type"}]},
                {"role": "model", "tool_call_id": "c1"}, {"role": "x" * 65}):
        assert (await append(client, uid, bad)).status_code == 422, bad
    assert [m["role"] for m in await live(client, uid, role="model")] == ["model"]


async def test_pop_trim_and_remove_by_id(client: httpx.AsyncClient, app: FastAPI,
                                         uid: str) -> None:
    await append(client, uid, *({"id": f"m{i}", "role": "user", "content": f"{uid} text {i}"}
                                for i in range(1, 9)))
    before = await revision(client, uid)
    popped = await client.post(f"/v1/threads/{uid}/messages:remove", json={"last": 2})
    assert popped.status_code == 200, popped.text
    body = popped.json()
    assert [m["id"] for m in body["data"]] == ["m7", "m8"]
    assert body["data"][1]["content"] == f"{uid} text 8"
    assert body["thread_revision"] == before + 1 and popped.headers["etag"] == f'"{before + 1}"'
    gone = await client.delete(f"/v1/threads/{uid}/messages/m4",
                               headers={"If-Match": f'"{before + 1}"'})
    assert gone.status_code == 200 and [m["id"] for m in gone.json()["data"]] == ["m4"]
    trimmed = await client.post(f"/v1/threads/{uid}/messages:remove", json={"before_seq": 3})
    assert [m["id"] for m in trimmed.json()["data"]] == ["m1", "m2"]
    assert [m["id"] for m in await live(client, uid)] == ["m3", "m5", "m6"]
    thread = (await client.get(f"/v1/threads/{uid}")).json()
    assert thread["message_count"] == 3 and thread["revision"] == before + 3
    # A seq is never handed out again, even after the last messages went.
    new = await append(client, uid, {"role": "user", "content": "after"})
    assert new.json()["data"][0]["seq"] == 9
    # Removing nothing takes no revision; a missing id is 404 and removes nothing.
    current = await revision(client, uid)
    nothing = await client.post(f"/v1/threads/{uid}/messages:remove", json={"after_seq": 100})
    assert nothing.json() == {"data": [], "thread_revision": current}
    missing = await client.post(f"/v1/threads/{uid}/messages:remove", json={"ids": ["m3", "m1"]})
    assert missing.status_code == 404
    assert [m["id"] for m in await live(client, uid)][:1] == ["m3"]
    assert await revision(client, uid) == current
    # Stale If-Match: 412, nothing removed.
    stale = await client.post(f"/v1/threads/{uid}/messages:remove", json={"last": 1},
                              headers={"If-Match": '"1"'})
    assert stale.status_code == 412 and stale.json()["current_revision"] == current
    assert len(await live(client, uid)) == 4
    for bad in ({}, {"last": 1, "ids": ["m3"]}, {"last": 0}, {"ids": []}, {"last": 1, "x": 1}):
        response = await client.post(f"/v1/threads/{uid}/messages:remove", json=bad)
        assert response.status_code == 422, bad
    # The rows are gone from the database, and the audit trail names no content.
    async with app.state.db.read() as connection:
        texts = (await connection.execute(select(Message.content))).scalars().all()
        events = (await connection.execute(
            select(Event.type, Event.resource).where(Event.thread_id == uid)
            .order_by(Event.seq))).all()
    # Contents are unique to this test (the database is shared with other tests).
    assert not {f"{uid} text {i}" for i in (1, 2, 4, 7, 8)} & {str(t) for t in texts}
    assert {f"{uid} text {i}" for i in (3, 5, 6)} <= {str(t) for t in texts}
    assert [e.type for e in events].count("message.removed") == 3
    assert all("text" not in e.resource for e in events)


async def test_redaction_overwrites_the_content(client: httpx.AsyncClient, app: FastAPI,
                                                uid: str) -> None:
    secret = f"my card is 4111-{uid}"
    await client.post(f"/v1/threads/{uid}/messages",
                      json={"messages": [{"id": "a", "role": "user", "content": secret,
                                          "item": {"text": secret}},
                                         {"id": "b", "role": "assistant", "content": "ok"}]},
                      headers={"Idempotency-Key": f"k-{uid}"})
    current = await revision(client, uid)
    redacted = await client.patch(f"/v1/threads/{uid}/messages/a",
                                  json={"content": "[redacted]", "item": None},
                                  headers={"If-Match": f'"{current}"'})
    assert redacted.status_code == 200, redacted.text
    assert redacted.json()["content"] == "[redacted]" and "item" not in redacted.json()
    assert redacted.headers["etag"] == f'"{current + 1}"'
    assert (await client.get(f"/v1/threads/{uid}/messages/a")).json()["seq"] == 1
    again = await client.patch(f"/v1/threads/{uid}/messages/a", json={"content": "x"},
                               headers={"If-Match": f'"{current}"'})
    assert again.status_code == 412
    bad = await client.patch(f"/v1/threads/{uid}/messages/a",
                             json={"content": [{"text": "no type"}]})
    assert bad.status_code == 422 and bad.json()["errors"][0]["pointer"] == "/content"
    assert (await client.patch(f"/v1/threads/{uid}/messages/zz",
                               json={"content": "x"})).status_code == 404
    async with app.state.db.read() as connection:
        texts = [json.dumps(list(v)) for v in (await connection.execute(
            select(Message.content, Message.item))).all()]
        kept = [json.dumps(r) for r in (await connection.execute(
            select(IdempotencyKey.response))).scalars().all()]
        types = (await connection.execute(
            select(Event.type).where(Event.thread_id == uid))).scalars().all()
    assert not any(secret in text for text in texts + kept)
    assert "message.redacted" in types
    # The audit trail answers by type, and says which message, never what it said.
    feed = await client.get("/v1/events", params={"thread_id": uid,
                                                  "type": ["message.redacted", "message.removed"]})
    assert feed.status_code == 200, feed.text
    assert [(e["type"], e["resource"]) for e in feed.json()["data"]] == [
        ("message.redacted", f"/v1/threads/{uid}/messages/a")]
    assert secret not in feed.text


async def test_compacted_messages_cannot_be_removed_or_redacted(
        client: httpx.AsyncClient, uid: str) -> None:
    await append(client, uid, *({"id": f"m{i}", "role": "user", "content": str(i)}
                                for i in range(1, 5)))
    made = await client.post(f"/v1/threads/{uid}/compactions", json={
        "source_message_ids": ["m1", "m2"], "summary": {"id": "s", "role": "system",
                                                        "content": "one, two"}})
    assert made.status_code == 201, made.text
    current = await revision(client, uid)
    for method, path, body in (
            ("POST", "messages:remove", {"ids": ["m2"]}),
            ("POST", "messages:remove", {"before_seq": 4}),
            ("DELETE", "messages/s", None),
            ("PATCH", "messages/m1", {"content": "x"})):
        response = await client.request(method, f"/v1/threads/{uid}/{path}", json=body)
        assert response.status_code == 409, (path, body, response.text)
        assert response.json()["code"] == "message_compacted"
    assert await revision(client, uid) == current
    # After the compaction is reverted, the run can go.
    assert (await client.delete(f"/v1/threads/{uid}/compactions/{made.json()['id']}")
            ).status_code == 204
    removed = await client.post(f"/v1/threads/{uid}/messages:remove", json={"before_seq": 3})
    assert [m["id"] for m in removed.json()["data"]] == ["m1", "m2", "s"]
    assert [m["id"] for m in await live(client, uid)] == ["m3", "m4"]


async def test_created_after_and_threads_by_activity(client: httpx.AsyncClient,
                                                     uid: str) -> None:
    first = await append(client, f"{uid}-a", {"role": "user", "content": "1"})
    at = first.json()["data"][0]["created_at"]
    await append(client, f"{uid}-a", {"role": "user", "content": "2"})
    later = await live(client, f"{uid}-a", created_after=at)
    assert [m["content"] for m in later] == ["2"]
    for bad in ("yesterday", "2026-01-01T00:00:00"):  # a time without its offset is ambiguous
        assert (await client.get(f"/v1/threads/{uid}-a/messages",
                                 params={"created_after": bad})).status_code == 422
    for name in ("b", "c", "d"):
        await append(client, f"{uid}-{name}", {"role": "user", "content": name})
    await append(client, f"{uid}-b", {"role": "user", "content": "b again"})
    order: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"order_by": "updated_at", "limit": 2,
                                  "metadata": "{}"} | ({"cursor": cursor} if cursor else {})
        page = (await client.get("/v1/threads", params=params)).json()
        order += [t["thread_id"] for t in page["data"] if t["thread_id"].startswith(uid)]
        cursor = page["next_cursor"]
        if cursor is None or len(order) == 4:
            break
    assert order == [f"{uid}-b", f"{uid}-d", f"{uid}-c", f"{uid}-a"]
    # A cursor of one order is refused by the other.
    assert (await client.get("/v1/threads", params={"cursor": cursor})).status_code == 400
    assert (await client.get("/v1/threads", params={"order_by": "name"})).status_code == 422
