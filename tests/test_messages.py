"""Messages over HTTP: API.md section 4 (and `append_messages` / `?include=messages` of
section 3), on SQLite and Postgres."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import select

from app.events.models import Event
from tests.support import ServerProcess, statements

pytestmark = pytest.mark.anyio

JSON = {"content-type": "application/json"}


async def events_of(app: FastAPI, thread_id: str) -> list[tuple[str, int | None, str]]:
    # The events router is another slice; read the audit rows the write committed, by id: the
    # order the sequencer numbers them in (on Postgres an event has no seq until a pass after
    # its commit numbers it, which may not have run yet, and NULLs come in any order).
    async with app.state.db.read() as session:
        rows = await session.execute(
            select(Event.type, Event.revision, Event.resource)
            .where(Event.thread_id == thread_id).order_by(Event.id)
        )
        return [tuple(row) for row in rows]


def msg(i: int, **extra: object) -> dict:
    return {"role": "user", "content": f"message {i}", **extra}


async def all_messages(client: httpx.AsyncClient, thread_id: str, **params: object) -> list[dict]:
    seen: list[dict] = []
    cursor = None
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        page = await client.get(f"/v1/threads/{thread_id}/messages", params=query)
        assert page.status_code == 200, page.text
        body = page.json()
        seen += body["data"]
        if not body["has_more"]:
            assert body["next_cursor"] is None and "link" not in page.headers
            return seen
        assert body["next_cursor"] in page.headers["link"]
        cursor = body["next_cursor"]


async def test_append_creates_the_thread_and_numbers_messages(app, client: httpx.AsyncClient,
                                                              uid: str) -> None:
    url = f"/v1/threads/{uid}/messages"
    one = await client.post(url, json={"role": "user", "content": "hello", "agent_name": "a1"})
    assert one.status_code == 201, one.text
    assert one.headers["etag"] == '"2"', "created at revision 1, the append is revision 2"
    body = one.json()
    assert body["thread_revision"] == 2
    [stored] = body["data"]
    assert stored["id"].startswith("msg_")
    assert {k: v for k, v in stored.items() if k not in ("id", "created_at")} == {
        "seq": 1, "position": 1, "role": "user", "content": "hello", "agent_name": "a1",
        "metadata": {}, "status": "live",
    }
    batch = await client.post(url, json={"messages": [msg(2), msg(3, id="client-id")]})
    assert batch.status_code == 201 and batch.headers["etag"] == '"3"'
    assert [(m["seq"], m["position"]) for m in batch.json()["data"]] == [(2, 2), (3, 3)]
    assert batch.json()["data"][1]["id"] == "client-id"
    ids = [stored["id"]] + [m["id"] for m in batch.json()["data"]]
    assert ids[:2] == sorted(ids[:2]), "server ids sort by creation"

    thread = (await client.get(f"/v1/threads/{uid}")).json()
    assert thread["revision"] == 3 and thread["message_count"] == 3 and thread["state"] == {}
    by_id = await client.get(f"{url}/client-id")
    assert by_id.status_code == 200 and by_id.json() == batch.json()["data"][1]
    assert await events_of(app, uid) == [
        ("thread.created", 1, f"/v1/threads/{uid}"),
        ("message.appended", 2, url),
        ("message.appended", 3, url),
    ]


async def test_openai_fields_and_content_parts_round_trip_exactly(client: httpx.AsyncClient,
                                                                  uid: str) -> None:
    # Sent as raw bytes: key order, unicode, floats and nesting must come back unchanged.
    parts = '[{"type":"text","text":"héllo ✓","z":[1,2.5,{"b":1,"a":null}]},' \
            '{"type":"image_url","image_url":{"url":"https://x/y.png","detail":"low"}}]'
    calls = ('[{"id":"call_1","type":"function",'
             '"function":{"name":"get","arguments":"{\\"q\\": 1}"}}]')
    messages = [
        f'{{"role":"user","content":{parts},"name":"alice"}}',
        f'{{"role":"assistant","content":null,"tool_calls":{calls}}}',
        '{"role":"tool","tool_call_id":"call_1","content":"42","metadata":{"z":1,"a":2}}',
        '{"role":"developer","content":""}',
    ]
    raw = ('{"messages":[' + ",".join(messages) + "]}").encode()
    posted = await client.post(f"/v1/threads/{uid}/messages", content=raw, headers=JSON)
    assert posted.status_code == 201, posted.text
    for response in (posted, await client.get(f"/v1/threads/{uid}/messages")):
        text = response.text
        assert f'"content":{parts},"name":"alice"' in text
        assert f'"tool_calls":{calls}' in text
        assert '"tool_call_id":"call_1","agent_name"' not in text, "absent members stay absent"
        assert '"metadata":{"z":1,"a":2}' in text
    data = (await client.get(f"/v1/threads/{uid}/messages")).json()["data"]
    assert [sorted(m) for m in data] == [
        sorted(["id", "seq", "position", "role", "content", "name", "metadata", "created_at",
                "status"]),
        sorted(["id", "seq", "position", "role", "content", "tool_calls", "metadata",
                "created_at", "status"]),
        sorted(["id", "seq", "position", "role", "content", "tool_call_id", "metadata",
                "created_at", "status"]),
        sorted(["id", "seq", "position", "role", "content", "metadata", "created_at", "status"]),
    ]
    assert data[1]["content"] is None and data[3]["content"] == ""


@pytest.mark.parametrize("body, pointer, code", [
    ({"role": "user", "content": "x", "contnet": "typo"}, "/contnet", "unknown_field"),
    ({"messages": [{"role": "user"}, {"role": "user", "extra": 1}]}, "/messages/1/extra",
     "unknown_field"),
    ({"messages": [{"role": "user"}], "other": 1}, "/other", "unknown_field"),
    # Any short name is a role; an empty, long or control-character one is not.
    ({"role": ""}, "/role", "validation_failed"),
    ({"role": "r" * 65}, "/role", "validation_failed"),
    ({"role": "robot\n"}, "/role", "validation_failed"),
    ({"content": "no role"}, "/role", "validation_failed"),
    ({"role": "user", "content": 5}, "/content", "validation_failed"),
    ({"role": "user", "content": [{"text": "no type"}]}, "/content", "validation_failed"),
    ({"role": "user", "content": ["a string part"]}, "/content", "validation_failed"),
    ({"role": "user", "tool_calls": [{"id": "c", "type": "function"}]}, "/tool_calls",
     "validation_failed"),
    ({"role": "assistant", "tool_calls": [{"type": "function"}]}, "/tool_calls",
     "validation_failed"),
    ({"role": "assistant", "tool_call_id": "c"}, "/tool_call_id", "validation_failed"),
    ({"role": "user", "id": ".hidden"}, "/id", "validation_failed"),
    ({"role": "user", "metadata": []}, "/metadata", "validation_failed"),
    ({"messages": []}, "/messages", "validation_failed"),
])
async def test_bad_messages_are_422_naming_the_member(client: httpx.AsyncClient, uid: str,
                                                      body: dict, pointer: str, code: str) -> None:
    response = await client.post(f"/v1/threads/{uid}/messages", json=body)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["code"] == code
    assert pointer in [e.get("pointer") for e in problem["errors"]], problem
    assert (await client.get(f"/v1/threads/{uid}")).status_code == 404, "nothing was written"


async def test_limits(client: httpx.AsyncClient, uid: str) -> None:
    url = f"/v1/threads/{uid}/messages"
    too_many = await client.post(url, json={"messages": [msg(i) for i in range(101)]})
    assert too_many.status_code == 422 and too_many.json()["errors"][0]["pointer"] == "/messages"
    keys = {f"k{i}": i for i in range(65)}
    meta = await client.post(url, json={"messages": [msg(1), msg(2, metadata=keys)]})
    assert meta.status_code == 422
    assert meta.json()["errors"][0]["pointer"] == "/messages/1/metadata"
    ok = await client.post(url, json={"messages": [msg(i) for i in range(100)]})
    assert ok.status_code == 201 and len(ok.json()["data"]) == 100


async def test_taken_ids_write_nothing(client: httpx.AsyncClient, uid: str) -> None:
    url = f"/v1/threads/{uid}/messages"
    assert (await client.post(url, json=msg(1, id="a"))).status_code == 201
    for body in ({"messages": [msg(2, id="b"), msg(3, id="a")]},
                 {"messages": [msg(2, id="c"), msg(3, id="c")]}):
        conflict = await client.post(url, json=body)
        assert conflict.status_code == 409, conflict.text
        assert conflict.json()["code"] == "message_exists"
    thread = (await client.get(f"/v1/threads/{uid}")).json()
    assert (thread["revision"], thread["message_count"]) == (2, 1)
    assert (await client.get(f"{url}/b")).status_code == 404
    after = await client.post(url, json=msg(4))
    assert after.json()["data"][0]["seq"] == 2, "a refused append leaves no gap"


async def test_an_append_of_one_message_is_one_statement_on_postgres(
        app: FastAPI, client: httpx.AsyncClient, uid: str, backend: str) -> None:
    """One message (no parent link, no Idempotency-Key) is stored with its thread's new
    revision and its event in one statement on Postgres; whatever that statement cannot
    store (a taken id, a stale If-Match, a thread to create) is answered by the transaction,
    as on SQLite, and leaves nothing behind."""
    url = f"/v1/threads/{uid}/messages"
    created = await client.post(url, json=msg(1, id="a"))  # creates the thread
    assert created.status_code == 201 and created.headers["etag"] == '"2"'
    with statements(app) as heard:
        ok = await client.post(url, json=msg(2, id="b", item={"n": 2}, metadata={"k": 1}),
                               headers={"If-Match": '"2"'})
    assert ok.status_code == 201, ok.text
    body = ok.json()
    assert ok.headers["etag"] == '"3"' and body["thread_revision"] == 3
    assert body["data"] == [(await client.get(f"{url}/b")).json()]
    assert (body["data"][0]["seq"], body["data"][0]["item"]) == (2, {"n": 2})
    writes = [s.sql for s in heard if s.sql.startswith(("WITH", "UPDATE", "INSERT"))]
    if backend == "postgres":
        assert len(writes) == 1 and all(part in writes[0] for part in (
            "UPDATE threads", "INSERT INTO messages", "INSERT INTO events")), writes
    for refused, status in ((msg(3, id="a"), 409), (msg(3, id="c"), 412)):
        answer = await client.post(url, json=refused, headers={"If-Match": '"3"'}
                                   if status == 409 else {"If-Match": '"2"'})
        assert answer.status_code == status, answer.text
    thread = (await client.get(f"/v1/threads/{uid}")).json()
    assert (thread["revision"], thread["message_count"]) == (3, 2)
    assert await events_of(app, uid) == [("thread.created", 1, "/v1/threads/" + uid),
                                         ("message.appended", 2, url),
                                         ("message.appended", 3, url)]
    # Racing appends of one id: one stores it, the others are 409, and nothing else moved.
    racers = await asyncio.gather(*(client.post(url, json=msg(n, id="same"))
                                    for n in range(8)))
    assert sorted(r.status_code for r in racers) == [201] + [409] * 7, [r.text for r in racers]
    thread = (await client.get(f"/v1/threads/{uid}")).json()
    assert (thread["revision"], thread["message_count"]) == (4, 3)
    assert [m["id"] for m in await all_messages(client, uid)] == ["a", "b", "same"]


async def test_an_append_of_several_messages_stores_what_the_transaction_stores(
        app: FastAPI, client: httpx.AsyncClient, uid: str, backend: str) -> None:
    """Several messages go in one statement too (an array per column, unnested in order);
    what it stores and answers is what the transaction stores and answers (an
    Idempotency-Key takes the transaction), content parts and bare-number items included."""
    messages = [msg(1, content=[{"type": "text", "text": "é ✓"}, {"type": "text", "text": ""}],
                    name="al"),
                msg(2, role="assistant", content=None, tool_calls=[
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]),
                msg(3, role="tool", content="42", tool_call_id="c", item=2.5,
                    metadata={"z": 1, "a": 2}, agent_name="ag"),
                msg(4, item=[1, [2, {"k": None}]])]
    answers, ids = {}, {}
    for name, headers in (("alone", {}), ("transaction", {"Idempotency-Key": f"k-{uid}"})):
        await client.post("/v1/threads", json={"thread_id": f"{uid}-{name}"})
        with statements(app) as heard:
            posted = await client.post(f"/v1/threads/{uid}-{name}/messages",
                                       json={"messages": messages}, headers=headers)
        assert posted.status_code == 201, posted.text
        writes = [s.sql for s in heard if s.sql.startswith(("WITH", "UPDATE", "INSERT"))]
        if backend == "postgres":
            assert (len(writes) == 1) == (name == "alone"), writes
        page = (await client.get(f"/v1/threads/{uid}-{name}/messages")).json()["data"]
        assert posted.json()["data"] == page
        answers[name] = [{k: v for k, v in m.items() if k not in ("id", "created_at")}
                         for m in page]
        ids[name] = [m["id"] for m in page]
    assert answers["alone"] == answers["transaction"]
    assert [m["seq"] for m in answers["alone"]] == [1, 2, 3, 4]
    assert await events_of(app, f"{uid}-alone") == [
        ("thread.created", 1, f"/v1/threads/{uid}-alone"),
        ("message.appended", 2, f"/v1/threads/{uid}-alone/messages")]
    # A taken id among several: nothing is written, as by the transaction.
    taken = await client.post(f"/v1/threads/{uid}-alone/messages", json={"messages": [
        msg(5, id="fresh"), msg(6, id=ids["alone"][0])]})
    assert taken.status_code == 409, taken.text
    thread = (await client.get(f"/v1/threads/{uid}-alone")).json()
    assert (thread["revision"], thread["message_count"]) == (2, 4)


async def test_if_match_on_append_and_deleted_threads(client: httpx.AsyncClient,
                                                      uid: str) -> None:
    url = f"/v1/threads/{uid}/messages"
    missing = await client.post(url, json=msg(1), headers={"If-Match": '"1"'})
    assert missing.status_code == 412 and missing.json()["current_revision"] is None
    assert (await client.get(f"/v1/threads/{uid}")).status_code == 404
    await client.post("/v1/threads", json={"thread_id": uid})
    stale = await client.post(url, json=msg(1), headers={"If-Match": '"7"'})
    assert stale.status_code == 412
    assert (stale.json()["code"], stale.json()["current_revision"]) == ("revision_mismatch", 1)
    ok = await client.post(url, json=msg(1), headers={"If-Match": '"1"'})
    assert ok.status_code == 201 and ok.headers["etag"] == '"2"'

    deleted = await client.delete(f"/v1/threads/{uid}", headers={"If-Match": '"2"'})
    assert deleted.status_code == 204
    for headers in ({}, {"If-Match": '"2"'}, {"Idempotency-Key": "late"}):
        late = await client.post(url, json=msg(2), headers=headers)
        assert late.status_code == 410, late.text
        assert late.json()["code"] == "thread_deleted"
    assert (await client.get(url)).status_code == 404
    assert (await client.get(f"{url}/{ok.json()['data'][0]['id']}")).status_code == 404

    again = await client.put(f"/v1/threads/{uid}", json={"state": {}},
                             headers={"If-None-Match": "*"})
    assert again.status_code == 201
    fresh = await client.post(url, json=msg(3))
    assert fresh.json()["data"][0]["seq"] == 1, "the deleted thread's messages went with it"
    assert (await client.get(url)).json()["data"] == fresh.json()["data"]


async def test_reads_404(client: httpx.AsyncClient, uid: str) -> None:
    assert (await client.get(f"/v1/threads/{uid}/messages")).status_code == 404
    await client.post(f"/v1/threads/{uid}/messages", json=msg(1))
    missing = await client.get(f"/v1/threads/{uid}/messages/nope")
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"
    huge = base64.urlsafe_b64encode(json.dumps(["messages", 2**70, 1]).encode()).decode()
    for params in ({"cursor": "junk"}, {"cursor": "WyJ0aHJlYWRzIiwxXQ"}, {"cursor": huge}):
        assert (await client.get(f"/v1/threads/{uid}/messages", params=params)).status_code == 400
    for params in ({"limit": 0}, {"limit": 1001}, {"view": "all"}, {"order": "up"},
                   {"role": "r" * 65}, {"after_seq": 2**63}, {"before_seq": -1},
                   {"fields": "bogus"}, {"fields": ""}, {"fields": "item,"},
                   {"fields": "item, id"}, {"fields": "item,thread_id"}):
        bad = await client.get(f"/v1/threads/{uid}/messages", params=params)
        assert bad.status_code == 422, params
    unknown = await client.get(f"/v1/threads/{uid}/messages", params={"fields": "id,bogus"})
    assert unknown.headers["content-type"] == "application/problem+json"
    assert "no message member 'bogus'" in unknown.json()["detail"], unknown.text


async def test_a_page_reads_the_thread_and_its_messages_in_one_statement(
        app: FastAPI, client: httpx.AsyncClient, uid: str) -> None:
    """A page names its thread by id inside the statement that reads the messages; only an
    empty page asks again whether the thread is there, so a thread without messages is an
    empty page and a missing or deleted one a 404, as before."""
    url = f"/v1/threads/{uid}/messages"
    await client.post(url, json={"messages": [msg(1), msg(2), msg(3)]})
    with statements(app) as heard:
        page = await client.get(url, params={"order": "desc", "limit": 2})
    assert page.status_code == 200, page.text
    assert [m["content"] for m in page.json()["data"]] == ["message 3", "message 2"]
    # The request's own (not SQLite's BEGIN, nor the feed numbering the append's event).
    reads = [s.sql for s in heard if s.sql.startswith("SELECT") and "FROM" in s.sql]
    assert len(reads) == 1 and "FROM messages" in reads[0] and "FROM threads" in reads[0]
    rest = await client.get(url, params={"order": "desc", "cursor": page.json()["next_cursor"]})
    assert [m["content"] for m in rest.json()["data"]] == ["message 1"]
    with statements(app) as heard:
        none = await client.get(url, params={"after_seq": 3})
    assert none.status_code == 200 and none.json()["data"] == []
    assert len([s for s in heard if s.sql.startswith("SELECT") and "FROM" in s.sql]) == 2
    await client.post("/v1/threads", json={"thread_id": f"{uid}-empty"})
    empty = await client.get(f"/v1/threads/{uid}-empty/messages")
    assert empty.status_code == 200 and empty.json()["data"] == []
    missing = await client.get(f"/v1/threads/{uid}-none/messages", params={"cursor": "junk"})
    assert missing.status_code == 404, "a missing thread is said before a bad cursor"
    revision = (await client.get(f"/v1/threads/{uid}")).headers["etag"]
    assert (await client.delete(f"/v1/threads/{uid}",
                                headers={"If-Match": revision})).status_code == 204
    for params in ({}, {"order": "desc"}, {"view": "full"}):
        assert (await client.get(url, params=params)).status_code == 404


async def test_pagination_over_250_messages_both_orders(client: httpx.AsyncClient,
                                                        uid: str) -> None:
    url = f"/v1/threads/{uid}/messages"
    for start in range(0, 260, 100):
        batch = [msg(i, agent_name=f"agent{i % 3}", role="user" if i % 2 else "assistant")
                 for i in range(start, min(start + 100, 260))]
        assert (await client.post(url, json={"messages": batch})).status_code == 201
    ascending = await all_messages(client, uid, limit=7)
    assert [m["seq"] for m in ascending] == list(range(1, 261))
    descending = await all_messages(client, uid, limit=13, order="desc")
    assert [m["seq"] for m in descending] == list(range(260, 0, -1))
    assert len({m["id"] for m in descending}) == 260
    big = await client.get(url, params={"limit": 1000})
    assert len(big.json()["data"]) == 260 and big.json()["has_more"] is False

    # Filters narrow first; order and limit then take from the start of the ordered set.
    first = await client.get(url, params={"before_seq": 100, "limit": 5})
    assert [m["seq"] for m in first.json()["data"]] == [1, 2, 3, 4, 5]
    last = await client.get(url, params={"before_seq": 100, "limit": 5, "order": "desc"})
    assert [m["seq"] for m in last.json()["data"]] == [99, 98, 97, 96, 95]
    window = await all_messages(client, uid, after_seq=10, before_seq=31, limit=4)
    assert [m["seq"] for m in window] == list(range(11, 31))
    window = await all_messages(client, uid, after_seq=10, before_seq=31, limit=4, order="desc")
    assert [m["seq"] for m in window] == list(range(30, 10, -1))
    agents = await all_messages(client, uid, agent_name="agent1", role="user", limit=9)
    assert [m["seq"] for m in agents] == [i + 1 for i in range(260) if i % 3 == 1 and i % 2]


async def test_put_with_append_messages_is_one_revision(app, client: httpx.AsyncClient,
                                                        uid: str) -> None:
    url = f"/v1/threads/{uid}"
    created = await client.put(url, headers={"If-None-Match": "*"}, json={
        "state": {"step": 1}, "append_messages": [msg(1), msg(2)]})
    assert created.status_code == 201, created.text
    assert (created.json()["revision"], created.json()["message_count"]) == (1, 2)
    replaced = await client.put(url, headers={"If-Match": '"1"'}, json={
        "state": {"step": 2}, "append_messages": [msg(3, id="turn-2")]})
    assert replaced.status_code == 200 and replaced.headers["etag"] == '"2"'
    assert replaced.json()["message_count"] == 3 and replaced.json()["state"] == {"step": 2}
    plain = await client.put(url, headers={"If-Match": '"2"'}, json={"state": {"step": 3}})
    assert plain.json()["message_count"] == 3
    messages = (await client.get(f"{url}/messages")).json()["data"]
    assert [(m["seq"], m["content"]) for m in messages] == [
        (1, "message 1"), (2, "message 2"), (3, "message 3")]
    assert await events_of(app, uid) == [
        ("thread.created", 1, url), ("message.appended", 1, f"{url}/messages"),
        ("thread.updated", 2, url), ("message.appended", 2, f"{url}/messages"),
        ("thread.updated", 3, url),
    ]

    # A refused PUT writes neither the state nor the messages.
    taken = await client.put(url, headers={"If-Match": '"3"'}, json={
        "state": {"step": 4}, "append_messages": [msg(4, id="turn-2")]})
    assert taken.status_code == 409 and taken.json()["code"] == "message_exists"
    stale = await client.put(url, headers={"If-Match": '"1"'}, json={
        "state": {"step": 4}, "append_messages": [msg(4)]})
    assert stale.status_code == 412
    bad = await client.put(url, headers={"If-Match": '"3"'}, json={
        "state": {}, "append_messages": [{"role": "user", "bogus": 1}]})
    assert bad.status_code == 422
    assert bad.json()["errors"][0]["pointer"] == "/append_messages/0/bogus"
    final = (await client.get(url)).json()
    assert (final["revision"], final["state"], final["message_count"]) == (3, {"step": 3}, 3)


async def test_patch_with_append_messages_is_one_revision(app, client: httpx.AsyncClient,
                                                          uid: str) -> None:
    url = f"/v1/threads/{uid}"
    assert (await client.put(url, headers={"If-None-Match": "*"},
                             json={"state": {"step": 1, "keep": True}})).status_code == 201
    patched = await client.patch(url, headers={"If-Match": '"1"'}, json={
        "state": {"step": 2}, "metadata": {"at": 5},
        "append_messages": [msg(1, id="e-1"), msg(2)]})
    assert patched.status_code == 200 and patched.headers["etag"] == '"2"', patched.text
    body = patched.json()
    assert (body["state"], body["metadata"], body["message_count"]) == (
        {"step": 2, "keep": True}, {"at": 5}, 2)
    only = await client.patch(url, headers={"If-Match": '"2"'},
                              json={"append_messages": [msg(3)]})
    assert only.headers["etag"] == '"3"' and only.json()["state"] == body["state"]
    messages = (await client.get(f"{url}/messages")).json()["data"]
    assert [(m["seq"], m["id"] == "e-1", m["content"]) for m in messages] == [
        (1, True, "message 1"), (2, False, "message 2"), (3, False, "message 3")]
    assert await events_of(app, uid) == [
        ("thread.created", 1, url),
        ("thread.updated", 2, url), ("message.appended", 2, f"{url}/messages"),
        ("thread.updated", 3, url), ("message.appended", 3, f"{url}/messages"),
    ]

    # Refused (a taken id, a stale revision, a bad message): neither state nor messages.
    taken = await client.patch(url, headers={"If-Match": '"3"'}, json={
        "state": {"step": 9}, "append_messages": [msg(4, id="e-1")]})
    assert taken.status_code == 409 and taken.json()["code"] == "message_exists"
    stale = await client.patch(url, headers={"If-Match": '"2"'}, json={
        "state": {"step": 9}, "append_messages": [msg(4)]})
    assert stale.status_code == 412
    bad = await client.patch(url, headers={"If-Match": '"3"'}, json={
        "state": {"step": 9}, "append_messages": [{"role": "user", "bogus": 1}]})
    assert bad.status_code == 422
    assert bad.json()["errors"][0]["pointer"] == "/append_messages/0/bogus"
    final = (await client.get(url)).json()
    assert (final["revision"], final["state"]["step"], final["message_count"]) == (3, 2, 3)
    assert len(await events_of(app, uid)) == 5


async def test_get_thread_include_messages(client: httpx.AsyncClient, uid: str) -> None:
    url = f"/v1/threads/{uid}"
    await client.post(f"{url}/messages", json={"messages": [msg(i) for i in range(5)]})
    plain = (await client.get(url)).json()
    assert "messages" not in plain and "messages_next_cursor" not in plain
    full = await client.get(url, params={"include": "messages"})
    assert full.status_code == 200 and full.headers["etag"] == '"2"'
    assert len(full.json()["messages"]) == 5 and full.json()["messages_next_cursor"] is None
    assert {k: v for k, v in full.json().items()
            if k not in ("messages", "messages_next_cursor")} == plain
    paged = (await client.get(url, params={"include": "messages", "messages_limit": 2})).json()
    assert [m["seq"] for m in paged["messages"]] == [1, 2]
    rest = await client.get(f"{url}/messages", params={"cursor": paged["messages_next_cursor"]})
    assert [m["seq"] for m in rest.json()["data"]] == [3, 4, 5]
    for params in ({"include": "nothing"}, {"include": "messages", "messages_limit": 1001}):
        assert (await client.get(url, params=params)).status_code == 422
    cached = await client.get(url, params={"include": "messages"}, headers={"If-None-Match": '"2"'})
    assert cached.status_code == 304


async def append_many(client: httpx.AsyncClient, url: str, agent: int, count: int) -> list[int]:
    seqs = []
    for i in range(count):
        response = await client.post(url, json=msg(i, agent_name=f"agent-{agent}"))
        assert response.status_code == 201, response.text
        seqs.append(response.json()["data"][0]["seq"])
    assert seqs == sorted(seqs), "one agent's messages keep their order"
    return seqs


async def check_thousand(client: httpx.AsyncClient, thread_id: str, seqs: list[int]) -> None:
    assert sorted(seqs) == list(range(1, 1001)), "no gap, no repeat"
    stored = await all_messages(client, thread_id, limit=1000)
    assert [m["seq"] for m in stored] == list(range(1, 1001))
    thread = (await client.get(f"/v1/threads/{thread_id}")).json()
    assert thread["message_count"] == 1000 and thread["revision"] == 1001


async def test_twenty_agents_append_concurrently(app, uid: str) -> None:
    clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
               for _ in range(20)]
    url = f"/v1/threads/{uid}/messages"
    try:
        results = await asyncio.gather(*(append_many(c, url, i, 50) for i, c in enumerate(clients)))
        await check_thousand(clients[0], uid, [s for seqs in results for s in seqs])
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))


@pytest.mark.slow
async def test_twenty_agents_across_two_server_processes(database_url: str, uid: str) -> None:
    with ServerProcess(database_url) as one, ServerProcess(database_url) as two:
        clients = [httpx.AsyncClient(base_url=(one, two)[i % 2].base_url, timeout=60)
                   for i in range(20)]
        url = f"/v1/threads/{uid}/messages"
        try:
            results = await asyncio.gather(
                *(append_many(c, url, i, 50) for i, c in enumerate(clients)))
            await check_thousand(clients[0], uid, [s for seqs in results for s in seqs])
        finally:
            await asyncio.gather(*(c.aclose() for c in clients))
        assert "Traceback" not in one.logs() + two.logs()


async def test_openapi_declares_the_message_routes(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    append = spec["paths"]["/v1/threads/{thread_id}/messages"]["post"]
    assert {"201", "409", "410", "412", "422"} <= set(append["responses"])
    assert "oneOf" in json.dumps(append["requestBody"])
    assert "Idempotency-Key" in [p["name"] for p in append["parameters"]]


async def test_appends_racing_a_delete_leave_nothing_behind(app, uid: str) -> None:
    clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
               for _ in range(9)]
    url = f"/v1/threads/{uid}/messages"
    try:
        await clients[0].post(url, json=msg(0))

        answered: list[int] = []
        under_way = asyncio.Event()

        async def appender(c: httpx.AsyncClient) -> list[int]:
            statuses = []
            for i in range(10):
                statuses.append((await c.post(url, json=msg(i))).status_code)
                answered.append(statuses[-1])
                if len(answered) == 8:
                    under_way.set()
            return statuses

        async def deleter(c: httpx.AsyncClient) -> int:
            # Sent once 8 of the 80 appends are answered (201: the thread still exists), while
            # each agent still has most of its appends to make, one at a time: the DELETE
            # lands in the middle of the run, so appends precede it and follow it (410).
            await under_way.wait()
            return (await c.delete(f"/v1/threads/{uid}", headers={"If-Match": "*"})).status_code

        *appends, deleted = await asyncio.gather(*(appender(c) for c in clients[:8]),
                                                 deleter(clients[8]))
        assert deleted == 204
        statuses = [s for seqs in appends for s in seqs]
        assert set(statuses) == {201, 410}, statuses
        # Once gone, every later append of each agent is refused: nothing resurrects it.
        assert all(seqs[seqs.index(410):] == [410] * (10 - seqs.index(410))
                   for seqs in appends if 410 in seqs)
        assert (await clients[0].get(url)).status_code == 404
        again = await clients[0].put(f"/v1/threads/{uid}", json={"state": {}},
                                     headers={"If-None-Match": "*"})
        assert again.status_code == 201 and again.json()["message_count"] == 0
        assert (await clients[0].get(url)).json()["data"] == [], "no orphans survived"
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))


async def test_items_that_are_bare_numbers_read_back_as_written(client: httpx.AsyncClient,
                                                                uid: str) -> None:
    """An item may be any JSON document, a bare number too: `2.0` stays a float, `-0.0`
    keeps its sign and a 20-digit integer every digit, on every read path and after a
    redaction (SQLite's NUMERIC affinity used to turn them into `2`, `0` and 1.23e19)."""
    url = f"/v1/threads/{uid}/messages"
    items = ["2.0", "-0.0", "12345678901234567890", "100.0", "0", "true", '"2.0"', "[1.0]"]
    body = '{"messages":[' + ",".join(
        f'{{"id":"m{i}","role":"x","item":{item}}}' for i, item in enumerate(items)) + "]}"
    appended = await client.post(url, content=body, headers={"Content-Type": "application/json"})
    assert appended.status_code == 201, appended.text

    def tokens(text: str) -> list[Any]:
        """The items as written: numbers as their text, so 2.0 and 2 differ."""
        parsed = json.loads(text, parse_float=lambda t: ("number", t),
                            parse_int=lambda t: ("number", t))
        rows = parsed.get("data", parsed.get("messages", [parsed]))
        return [row.get("item") for row in rows]

    written = tokens(json.dumps({"data": [{"item": json.loads(i)} for i in items]}))
    assert written[0] == ("number", "2.0") and written[1] == ("number", "-0.0")
    assert tokens(appended.text) == written
    assert tokens((await client.get(url)).text) == written
    assert tokens((await client.get(f"/v1/threads/{uid}",
                                    params={"include": "messages"})).text) == written
    for i, item in enumerate(written):
        assert tokens((await client.get(f"{url}/m{i}")).text) == [item]
    redacted = await client.patch(f"{url}/m4", content='{"item":-0.0}',
                                  headers={"Content-Type": "application/json"})
    assert redacted.status_code == 200, redacted.text
    assert tokens((await client.get(url)).text)[4] == ("number", "-0.0")


def ordered(response: httpx.Response) -> Any:
    """The body with every object as its list of (member, value) pairs, in order."""
    return json.loads(response.text, object_pairs_hook=list)


async def every_kind_of_message(client: httpx.AsyncClient, uid: str) -> None:
    """Messages with every member set and unset: parts, tool calls and results, framework
    items (and a null one), odd text, a compaction (a summary, two compacted), a redaction."""
    url = f"/v1/threads/{uid}/messages"
    odd = 'quote " back \\ tab \t ünïcode ✓ \U0001f600'
    sent = [
        {"id": "plain", "role": "user", "content": "hello"},
        {"id": "parts", "role": "user", "name": odd, "metadata": {"z": 1, "a": [1.5, None]},
         "content": [{"type": "text", "text": odd, "z": {"b": 1, "a": None}}]},
        {"id": "calls", "role": "assistant", "content": None, "agent_name": "planner",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "f", "arguments": "{}"}}]},
        {"id": "result", "role": "tool", "content": "42", "tool_call_id": odd},
        {"id": "framework", "role": "model", "content": None,
         "item": {"type": "function_call", "z": [], "a": {"nested": [1, 2.0, "x"]}}},
        {"id": "null-item", "role": "quote \" back \\ ✓", "content": "", "item": None},
        {"id": "gone", "role": "user", "content": "to be compacted"},
        {"id": "gone-2", "role": "user", "content": "also compacted"},
    ]
    assert (await client.post(url, json={"messages": sent})).status_code == 201
    compacted = await client.post(f"/v1/threads/{uid}/compactions", json={
        "source_message_ids": ["gone", "gone-2"],
        "summary": {"id": "summary", "role": "system", "content": "earlier: two messages"}})
    assert compacted.status_code == 201, compacted.text
    redacted = await client.patch(f"{url}/parts", json={"content": None, "item": {"r": 1}})
    assert redacted.status_code == 200, redacted.text


async def test_pages_render_every_message_as_the_single_read_does(client: httpx.AsyncClient,
                                                                 uid: str) -> None:
    """Pages (the list and `?include=messages`) are rendered from the stored JSON text
    without a model per message; each message must read exactly as `GET .../{id}` (the
    model) renders it: the same members, values and key order, for every kind of message."""
    url = f"/v1/threads/{uid}/messages"
    await every_kind_of_message(client, uid)
    listed = ordered(await client.get(url, params={"view": "full", "limit": 100}))
    rows = dict(listed)["data"]
    assert len(rows) == 9
    by_id = {dict(row)["id"]: row for row in rows}
    for message_id, row in by_id.items():
        assert row == ordered(await client.get(f"{url}/{message_id}")), message_id
    thread = dict(ordered(await client.get(f"/v1/threads/{uid}",
                                           params={"include": "messages"})))
    live = [dict(row)["id"] for row in thread["messages"]]
    assert live == ["plain", "parts", "calls", "result", "framework", "null-item", "summary"]
    assert thread["messages"] == [by_id[i] for i in live]
    assert thread["messages_next_cursor"] is None


MEMBERS = ["id", "seq", "position", "role", "content", "item", "name", "tool_calls",
           "tool_call_id", "agent_name", "metadata", "created_at", "status", "compaction_id",
           "parent_id"]


async def test_a_page_with_fields_is_the_page_with_only_those_members(
        app: FastAPI, client: httpx.AsyncClient, uid: str) -> None:
    """`?fields=` leaves out the other members of each message and nothing else: for each
    member alone, a few together (in any order named) and all of them, each message is the
    full page's with only those members, in the same order; a member a message lacks stays
    out (an empty object if it was the only one). Paging is unchanged, and the page is still
    one statement."""
    url = f"/v1/threads/{uid}/messages"
    await every_kind_of_message(client, uid)
    linked = await client.post(url, json={"messages": [
        {"id": f"{uid}-parent", "role": "user", "content": "x"},
        {"id": "child", "role": "user", "content": "y", "parent_id": f"{uid}-parent"}]})
    assert linked.status_code == 201, linked.text
    full = ordered(await client.get(url, params={"view": "full"}))[0][1]
    assert len(full) == 11
    assert {name for message in full for name, _ in message} == set(MEMBERS)
    choices = [[name] for name in MEMBERS] + [
        ["item"], ["item", "id"], ["created_at", "content", "compaction_id"],
        ["metadata", "tool_calls", "status"], list(reversed(MEMBERS))]
    for fields in choices:
        with statements(app) as heard:
            page = await client.get(url, params={"view": "full", "fields": ",".join(fields)})
        assert page.status_code == 200, page.text
        assert len([s for s in heard if s.sql.startswith("SELECT") and "FROM" in s.sql]) == 1
        assert ordered(page)[0][1] == [[(name, value) for name, value in message
                                        if name in fields] for message in full], fields
    items, cursor = [], None
    while True:
        page = (await client.get(url, params={"fields": "item", "limit": 2, "order": "desc",
                                              **({"cursor": cursor} if cursor else {})})).json()
        items += page["data"]
        if not (cursor := page["next_cursor"]):
            break
    live = (await client.get(url, params={"order": "desc"})).json()["data"]
    assert items == [{"item": m["item"]} if "item" in m else {} for m in live]
    assert len(items) == 9 and {} in items
    # `?include=messages` takes the same choice as `messages_fields`, on one thread and on
    # the list, and leaves the thread's own members whole.
    whole = (await client.get(f"/v1/threads/{uid}", params={"include": "messages"})).json()
    for fields in (["item"], ["id", "compaction_id", "created_at"]):
        thread = (await client.get(f"/v1/threads/{uid}", params={
            "include": "messages", "messages_fields": ",".join(fields)})).json()
        listed = (await client.get("/v1/threads", params={
            "thread_id": uid, "include": "messages",
            "messages_fields": ",".join(fields)})).json()["data"]
        expected = [{name: value for name, value in m.items() if name in fields}
                    for m in whole["messages"]]
        assert thread["messages"] == listed[0]["messages"] == expected, fields
        assert {k: v for k, v in thread.items() if k != "messages"} == {
            k: v for k, v in whole.items() if k != "messages"}
    for path, params in ((f"/v1/threads/{uid}", {"include": "messages"}),
                         ("/v1/threads", {"include": "messages"})):
        bad = await client.get(path, params={**params, "messages_fields": "item,state"})
        assert bad.status_code == 422 and "'state'" in bad.json()["detail"], bad.text
