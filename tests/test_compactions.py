"""Compactions over HTTP: API.md section 5, on SQLite and Postgres."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.test_messages import all_messages, events_of

pytestmark = pytest.mark.anyio


async def thread_with(client: httpx.AsyncClient, uid: str, count: int) -> str:
    """A thread with messages m1..m<count> (seq i, position i); returns its messages URL."""
    url = f"/v1/threads/{uid}/messages"
    messages = [{"id": f"m{i}", "role": "user" if i % 2 else "assistant", "content": f"c{i}"}
                for i in range(1, count + 1)]
    assert (await client.post(url, json={"messages": messages})).status_code == 201
    return url


def summary(text: str, **extra: object) -> dict:
    return {"role": "system", "content": text, **extra}


async def compact(client: httpx.AsyncClient, uid: str, ids: list[str], text: str,
                  **extra: object) -> httpx.Response:
    return await client.post(f"/v1/threads/{uid}/compactions",
                             json={"source_message_ids": ids, "summary": summary(text), **extra})


async def view(client: httpx.AsyncClient, uid: str, name: str) -> list[tuple[str, str]]:
    return [(m["id"], m["status"]) for m in await all_messages(client, uid, view=name, limit=3)]


async def revision(client: httpx.AsyncClient, uid: str) -> int:
    return (await client.get(f"/v1/threads/{uid}")).json()["revision"]


async def test_compact_a_contiguous_run(app, client: httpx.AsyncClient, uid: str) -> None:
    url = await thread_with(client, uid, 5)
    response = await client.post(f"/v1/threads/{uid}/compactions", json={
        "source_message_ids": ["m2", "m3", "m4"],
        "summary": {"id": "sum-1", "role": "system", "content": [
            {"type": "text", "text": "Earlier:"}, {"type": "text", "text": "m2-m4"}]},
        "reason": "context window", "model": "gpt-x", "input_token_count": 900,
        "output_token_count": 40, "metadata": {"k": "v"},
    })
    assert response.status_code == 201, response.text
    record = response.json()
    assert response.headers["location"] == f"/v1/threads/{uid}/compactions/{record['id']}"
    assert record["id"].startswith("cmp_")
    assert {k: v for k, v in record.items() if k not in ("id", "created_at")} == {
        "thread_id": uid, "source_message_ids": ["m2", "m3", "m4"],
        "summary_message_id": "sum-1", "summary_text": "Earlier:\nm2-m4",
        "reason": "context window", "model": "gpt-x", "input_token_count": 900,
        "output_token_count": 40, "metadata": {"k": "v"}, "thread_revision": 3,
    }
    assert await view(client, uid, "live") == [("m1", "live"), ("sum-1", "live"), ("m5", "live")]
    assert await view(client, uid, "full") == [
        ("m1", "live"), ("m2", "compacted"), ("m3", "compacted"), ("m4", "compacted"),
        ("sum-1", "live"), ("m5", "live")]
    summary_message = (await client.get(f"{url}/sum-1")).json()
    assert (summary_message["seq"], summary_message["position"]) == (6, 4)
    assert summary_message["compaction_id"] == record["id"]
    source = (await client.get(f"{url}/m3")).json()
    assert (source["status"], source["compaction_id"]) == ("compacted", record["id"])
    thread = (await client.get(f"/v1/threads/{uid}")).json()
    assert (thread["revision"], thread["message_count"]) == (3, 3)

    detail = await client.get(f"/v1/threads/{uid}/compactions/{record['id']}")
    assert detail.status_code == 200
    assert {k: v for k, v in detail.json().items() if k != "source_messages"} == record
    assert [m["id"] for m in detail.json()["source_messages"]] == ["m2", "m3", "m4"]
    listed = (await client.get(f"/v1/threads/{uid}/compactions")).json()
    assert listed["data"] == [record] and listed["has_more"] is False

    # An append after the compaction takes the next seq, after the summary's.
    later = await client.post(url, json={"role": "user", "content": "after"})
    assert later.json()["data"][0]["seq"] == 7
    assert (await view(client, uid, "live"))[-1] == (later.json()["data"][0]["id"], "live")
    assert [e[:2] for e in await events_of(app, uid)] == [
        ("thread.created", 1), ("message.appended", 2), ("compaction.created", 3),
        ("message.appended", 4)]


async def test_invalid_runs_are_422_and_write_nothing(client: httpx.AsyncClient,
                                                      uid: str) -> None:
    await thread_with(client, uid, 6)
    await thread_with(client, f"{uid}-other", 2)
    assert (await compact(client, uid, ["m5", "m6"], "done")).status_code == 201
    before = await revision(client, uid)
    cases = [
        (["m1", "m3"], "compaction_not_contiguous"),
        (["m2", "m1"], "compaction_not_contiguous"),
        (["m1", "m1"], "compaction_not_contiguous"),
        (["m4", "m5"], "message_not_live"),
        (["m5"], "message_not_live"),
        (["m1", "nope"], "message_not_found"),
    ]
    for ids, code in cases:
        response = await compact(client, uid, ids, "bad")
        assert response.status_code == 422, (ids, response.text)
        assert response.json()["code"] == code, (ids, response.json())
    other_thread = await client.post(f"/v1/threads/{uid}-other/compactions", json={
        "source_message_ids": ["m1", "m2"], "summary": summary("x")})
    assert other_thread.status_code == 201, "the same ids in another thread are its own"
    await client.post(f"/v1/threads/{uid}-x/messages", json={"id": "foreign", "role": "user"})
    foreign = await compact(client, uid, ["m4", "foreign"], "x")
    assert foreign.status_code == 422 and foreign.json()["code"] == "message_not_found"
    assert foreign.json()["errors"][0]["pointer"] == "/source_message_ids/1"
    for body, status in [({"source_message_ids": [], "summary": summary("x")}, 422),
                         ({"source_message_ids": ["m1"]}, 422),
                         ({"source_message_ids": ["m1"], "summary": summary("x"), "x": 1}, 422),
                         ({"source_message_ids": ["m1"], "summary": {"role": "b" * 65}}, 422),
                         ({"source_message_ids": ["m1"], "summary": summary("x", id="m2")}, 409)]:
        response = await client.post(f"/v1/threads/{uid}/compactions", json=body)
        assert response.status_code == status, (body, response.text)
    assert await revision(client, uid) == before, "nothing was written"
    assert len((await client.get(f"/v1/threads/{uid}/compactions")).json()["data"]) == 1
    missing = await compact(client, f"{uid}-none", ["m1"], "x")
    assert missing.status_code == 404
    assert (await client.get(f"/v1/threads/{uid}-none")).status_code == 404, "not created"


async def test_nested_compaction_and_revert_rules(app, client: httpx.AsyncClient,
                                                  uid: str) -> None:
    url = await thread_with(client, uid, 6)
    first = (await compact(client, uid, ["m2", "m3"], "S1")).json()
    s1 = first["summary_message_id"]
    assert await view(client, uid, "live") == [
        ("m1", "live"), (s1, "live"), ("m4", "live"), ("m5", "live"), ("m6", "live")]
    # A run that contains an earlier summary: nested compaction.
    second = await compact(client, uid, ["m1", s1, "m4"], "S2")
    assert second.status_code == 201, second.text
    second = second.json()
    s2 = second["summary_message_id"]
    assert await view(client, uid, "live") == [(s2, "live"), ("m5", "live"), ("m6", "live")]
    assert await view(client, uid, "full") == [
        ("m1", "compacted"), ("m2", "compacted"), ("m3", "compacted"), (s1, "compacted"),
        ("m4", "compacted"), (s2, "live"), ("m5", "live"), ("m6", "live")]
    assert (await client.get(f"{url}/{s1}")).json()["compaction_id"] == second["id"]
    assert (await client.get(f"/v1/threads/{uid}")).json()["message_count"] == 3

    covered = await client.delete(f"/v1/threads/{uid}/compactions/{first['id']}")
    assert covered.status_code == 409 and covered.json()["code"] == "compaction_covered"
    stale = await client.delete(f"/v1/threads/{uid}/compactions/{second['id']}",
                                headers={"If-Match": '"3"'})
    assert stale.status_code == 412 and stale.json()["current_revision"] == 4

    # Revert the newest: its sources (the first summary among them) are live again.
    reverted = await client.delete(f"/v1/threads/{uid}/compactions/{second['id']}",
                                   headers={"If-Match": '"4"'})
    assert reverted.status_code == 204 and reverted.content == b""
    assert await view(client, uid, "live") == [
        ("m1", "live"), (s1, "live"), ("m4", "live"), ("m5", "live"), ("m6", "live")]
    assert (await client.get(f"{url}/{s2}")).json()["status"] == "reverted"
    assert (await client.get(f"/v1/threads/{uid}/compactions/{second['id']}")).status_code == 404
    again = await client.delete(f"/v1/threads/{uid}/compactions/{second['id']}")
    assert again.status_code == 404
    listed = (await client.get(f"/v1/threads/{uid}/compactions")).json()["data"]
    assert [c["id"] for c in listed] == [first["id"]]

    # Now the first is no longer covered.
    assert (await client.delete(f"/v1/threads/{uid}/compactions/{first['id']}")).status_code == 204
    assert await view(client, uid, "live") == [(f"m{i}", "live") for i in range(1, 7)]
    assert await view(client, uid, "full") == [
        ("m1", "live"), ("m2", "live"), ("m3", "live"), (s1, "reverted"), ("m4", "live"),
        (s2, "reverted"), ("m5", "live"), ("m6", "live")]
    thread = (await client.get(f"/v1/threads/{uid}")).json()
    assert (thread["revision"], thread["message_count"]) == (6, 6)
    assert (await client.get(f"/v1/threads/{uid}/compactions")).json()["data"] == []
    # A reverted summary cannot be compacted; the restored run can be, again.
    assert (await compact(client, uid, [s1], "x")).json()["code"] == "message_not_live"
    assert (await compact(client, uid, ["m1", "m2", "m3"], "S3")).status_code == 201
    assert [e[:2] for e in await events_of(app, uid)][-4:] == [
        ("compaction.created", 4), ("compaction.reverted", 5), ("compaction.reverted", 6),
        ("compaction.created", 7)]


async def test_stale_if_match_writes_nothing(client: httpx.AsyncClient, uid: str) -> None:
    await thread_with(client, uid, 3)
    stale = await compact(client, uid, ["m1", "m2"], "x")
    assert stale.status_code == 201
    refused = await client.post(f"/v1/threads/{uid}/compactions", headers={"If-Match": '"2"'},
                                json={"source_message_ids": ["m3"], "summary": summary("y")})
    assert refused.status_code == 412
    assert (refused.json()["code"], refused.json()["current_revision"]) == ("revision_mismatch", 3)
    ok = await client.post(f"/v1/threads/{uid}/compactions", headers={"If-Match": '"3"'},
                           json={"source_message_ids": ["m3"], "summary": summary("y")})
    assert ok.status_code == 201 and ok.json()["thread_revision"] == 4
    assert (await client.get(f"/v1/threads/{uid}/messages/m3")).json()["status"] == "compacted"


async def test_a_summary_id_the_thread_has_is_409(client: httpx.AsyncClient,
                                                  uid: str) -> None:
    await thread_with(client, uid, 3)
    before = (await client.get(f"/v1/threads/{uid}")).json()
    first = await compact(client, uid, ["m1", "m2"], "x")
    assert first.status_code == 201
    for summary_id in ("m3", "m1"):
        refused = await client.post(f"/v1/threads/{uid}/compactions", json={
            "source_message_ids": ["m3"], "summary": summary("y", id=summary_id)})
        assert refused.status_code == 409, refused.text
        assert refused.json()["code"] == "message_exists"
        assert refused.json()["detail"] == (f"Message {summary_id!r} already exists in this "
                                            "thread; nothing was written.")
    assert (await client.get(f"/v1/threads/{uid}")).json()["revision"] == before["revision"] + 1
    assert (await client.get(f"/v1/threads/{uid}/messages/m3")).json()["status"] == "live"


async def test_list_pages_oldest_first(client: httpx.AsyncClient, uid: str) -> None:
    await thread_with(client, uid, 7)
    ids = [(await compact(client, uid, [f"m{i}"], f"s{i}")).json()["id"] for i in range(1, 8)]
    seen, cursor = [], None
    while True:
        page = (await client.get(f"/v1/threads/{uid}/compactions",
                                 params={"limit": 3, **({"cursor": cursor} if cursor else {})}))
        seen += [c["id"] for c in page.json()["data"]]
        cursor = page.json()["next_cursor"]
        if cursor is None:
            break
    assert seen == ids
    assert (await client.get(f"/v1/threads/{uid}/compactions/cmp_nope")).status_code == 404
    assert (await client.get(f"/v1/threads/{uid}-none/compactions")).status_code == 404


async def test_thread_delete_removes_compactions(client: httpx.AsyncClient, uid: str) -> None:
    await thread_with(client, uid, 3)
    cmp = (await compact(client, uid, ["m1", "m2"], "x")).json()
    rev = await revision(client, uid)
    deleted = await client.delete(f"/v1/threads/{uid}", headers={"If-Match": f'"{rev}"'})
    assert deleted.status_code == 204
    assert (await client.get(f"/v1/threads/{uid}/compactions/{cmp['id']}")).status_code == 404
    late = await compact(client, uid, ["m3"], "late")
    assert late.status_code == 410 and late.json()["code"] == "thread_deleted"
    gone = await client.delete(f"/v1/threads/{uid}/compactions/{cmp['id']}")
    assert gone.status_code == 410


async def test_compactions_race_appends_without_breaking_seq(app, uid: str) -> None:
    """Appends and compactions of one thread at once: every seq is handed out exactly once,
    and each compaction either wins or is refused cleanly."""
    base = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
    clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
               for _ in range(8)]
    try:
        await thread_with(base, uid, 20)

        async def appender(c: httpx.AsyncClient) -> None:
            for i in range(10):
                r = await c.post(f"/v1/threads/{uid}/messages",
                                 json={"role": "user", "content": str(i)})
                assert r.status_code == 201, r.text

        async def compactor(c: httpx.AsyncClient, start: int) -> int:
            r = await compact(c, uid, [f"m{start}", f"m{start + 1}"], "s")
            assert r.status_code in (201, 422), r.text
            return r.status_code

        statuses = await asyncio.gather(
            *(appender(c) for c in clients[:4]),
            # Overlapping runs: whichever commits first wins, the others find a source gone.
            *(compactor(c, 1 + i) for i, c in enumerate(clients[4:])),
        )
        won = sum(1 for s in statuses if s == 201)
        assert 1 <= won <= 2
        full = await all_messages(base, uid, view="full", limit=1000)
        assert sorted(m["seq"] for m in full) == list(range(1, 20 + 40 + won + 1))
        live = await all_messages(base, uid, limit=1000)
        thread = (await base.get(f"/v1/threads/{uid}")).json()
        assert thread["message_count"] == len(live) == 20 + 40 - won
    finally:
        await asyncio.gather(base.aclose(), *(c.aclose() for c in clients))
