"""A thread's state history and forks (plain threads, no checkpoints), on SQLite and
Postgres, through HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI

from app.core.settings import Settings
from tests.conftest import http_client, running
from tests.support import drain, statements
from tests.test_compactions import compact, thread_with, view
from tests.test_messages import all_messages

pytestmark = pytest.mark.anyio


def put(client: httpx.AsyncClient, uid: str, state: dict, revision: int | None = None,
        **body: object) -> object:
    headers = {"If-Match": f'"{revision}"'} if revision else {"If-None-Match": "*"}
    return client.put(f"/v1/threads/{uid}", json={"state": state, **body}, headers=headers)


async def history(client: httpx.AsyncClient, uid: str) -> list[tuple[int, dict]]:
    entries: list[tuple[int, dict]] = []
    cursor = None
    while True:
        page = await client.get(f"/v1/threads/{uid}/revisions",
                                params={"limit": 2, **({"cursor": cursor} if cursor else {})})
        assert page.status_code == 200, page.text
        body = page.json()
        entries += [(e["revision"], e["state"]) for e in body["data"]]
        for entry in body["data"]:
            assert entry["state_revision"] == entry["revision"]
        if not body["has_more"]:
            return entries
        cursor = body["next_cursor"]


async def test_every_state_write_is_kept_and_any_revision_reads_back(
        client: httpx.AsyncClient, uid: str) -> None:
    assert (await put(client, uid, {"step": 1}, metadata={"m": 1})).status_code == 201  # 1
    assert (await put(client, uid, {"step": 2}, 1)).status_code == 200  # 2
    await client.post(f"/v1/threads/{uid}/messages", json={"role": "user", "content": "hi"})  # 3
    patched = await client.patch(f"/v1/threads/{uid}", json={"state": {"extra": True}},
                                 headers={"If-Match": '"3"'})  # 4
    assert patched.status_code == 200 and patched.json()["revision"] == 4

    assert await history(client, uid) == [
        (4, {"step": 2, "extra": True}), (2, {"step": 2}), (1, {"step": 1})]
    at3 = await client.get(f"/v1/threads/{uid}/revisions/3")
    assert at3.status_code == 200
    assert at3.json()["revision"] == 3 and at3.json()["state_revision"] == 2, \
        "an append keeps the state it found"
    assert at3.json()["state"] == {"step": 2} and at3.json()["metadata"] == {"m": 1}
    for missing in (5, 10**12):
        response = await client.get(f"/v1/threads/{uid}/revisions/{missing}")
        assert response.status_code == 404, missing
        assert response.headers["content-type"] == "application/problem+json"
    assert (await client.get(f"/v1/threads/{uid}/revisions/0")).status_code == 422
    assert (await client.get(f"/v1/threads/nope-{uid}/revisions")).status_code == 404


async def test_history_keeps_only_the_window(client: httpx.AsyncClient, uid: str) -> None:
    """`history_limit` revisions, pruned by the write itself: storage stays bounded."""
    assert (await put(client, uid, {"n": 1}, history_limit=3)).json()["history_limit"] == 3
    for n in range(2, 11):
        assert (await put(client, uid, {"n": n}, n - 1)).status_code == 200
    assert await history(client, uid) == [(10, {"n": 10}), (9, {"n": 9}), (8, {"n": 8})]
    assert (await client.get(f"/v1/threads/{uid}/revisions/7")).status_code == 404

    # Appends take revisions without changing the state: the entry that still tells the
    # state of the window's oldest revision stays.
    for _ in range(4):
        await client.post(f"/v1/threads/{uid}/messages", json={"role": "user", "content": "x"})
    assert await history(client, uid) == [(10, {"n": 10}), (9, {"n": 9}), (8, {"n": 8})]
    assert (await put(client, uid, {"n": 15}, 14)).status_code == 200
    assert await history(client, uid) == [(15, {"n": 15}), (10, {"n": 10})]
    assert (await client.get(f"/v1/threads/{uid}/revisions/13")).json()["state"] == {"n": 10}

    # null goes back to the server's setting; 0 keeps nothing.
    reset = await client.patch(f"/v1/threads/{uid}", json={"history_limit": None},
                               headers={"If-Match": '"15"'})
    assert reset.status_code == 200 and "history_limit" not in reset.json()
    none = await client.patch(f"/v1/threads/{uid}", json={"history_limit": 0},
                              headers={"If-Match": '"16"'})
    assert none.json()["history_limit"] == 0
    assert await history(client, uid) == []
    assert (await client.get(f"/v1/threads/{uid}/revisions/17")).status_code == 404
    bad = await client.patch(f"/v1/threads/{uid}", json={"history_limit": -1},
                             headers={"If-Match": '"17"'})
    assert bad.status_code == 422


@pytest.fixture
async def short_history(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with running(settings.model_copy(update={"thread_history": 2})) as app, \
            http_client(app) as c:
        yield c


async def test_the_server_setting_is_the_default_window(short_history: httpx.AsyncClient,
                                                        uid: str) -> None:
    await put(short_history, uid, {"n": 1})
    for n in range(2, 6):
        await put(short_history, uid, {"n": n}, n - 1)
    assert [r for r, _ in await history(short_history, uid)] == [5, 4]


async def test_a_limit_lowered_to_0_keeps_nothing_after_any_write(
        client: httpx.AsyncClient, uid: str) -> None:
    """Every way of setting 0 prunes, and no later write (PATCH, PUT, append, batch) keeps
    anything: writes to such a thread skip the prune, so this pins that nothing is left."""
    url = f"/v1/threads/{uid}"
    for how in ("patch", "put", "batch"):
        await put(client, f"{uid}-{how}", {"n": 0}, history_limit=5)
        for n in range(1, 4):
            await put(client, f"{uid}-{how}", {"n": n}, n)
        assert len(await history(client, f"{uid}-{how}")) == 4
        lowered = {
            "patch": lambda u: client.patch(u, json={"history_limit": 0},
                                            headers={"If-Match": '"4"'}),
            "put": lambda u: client.put(u, json={"state": {"n": 4}, "history_limit": 0},
                                        headers={"If-Match": '"4"'}),
            "batch": lambda u: client.post("/v1/batch", json={"operations": [
                {"op": "thread.patch", "thread_id": u.rsplit("/", 1)[1], "if_match": '"4"',
                 "body": {"history_limit": 0}}]}),
        }[how](f"{url}-{how}")
        assert (await lowered).status_code == 200, how
        assert await history(client, f"{uid}-{how}") == [], how
    thread = f"{uid}-patch"
    writes = [
        lambda: client.patch(f"{url}-patch", json={"state": {"a": 1}},
                             headers={"If-Match": '"5"'}),
        lambda: put(client, thread, {"b": 2}, 6),
        lambda: client.post(f"{url}-patch/messages", json={"role": "user", "content": "x"}),
        lambda: client.post("/v1/batch", json={"operations": [
            {"op": "messages.append", "thread_id": thread, "if_match": '"8"',
             "body": {"messages": [{"role": "user", "content": "y"}]}},
            {"op": "thread.patch", "thread_id": thread, "if_match": '"9"',
             "body": {"state": {"c": 3}, "metadata": {"m": 1}}}]}),
        lambda: client.patch(f"{url}-patch", json={"history_limit": 0, "state": {"d": 4}},
                             headers={"If-Match": '"10"'}),
    ]
    for write in writes:
        assert (await write()).status_code in (200, 201)
        assert await history(client, thread) == []
    final = (await client.get(f"{url}-patch")).json()
    assert (final["revision"], final["state"]) == (11, {"b": 2, "c": 3, "d": 4})
    # Set to 0 at creation: nothing kept either; raised again, it keeps from there on.
    await put(client, f"{uid}-new", {"n": 1}, history_limit=0)
    await put(client, f"{uid}-new", {"n": 2}, 1)
    assert await history(client, f"{uid}-new") == []
    raised = await client.patch(f"{url}-new", json={"history_limit": 2, "state": {"n": 3}},
                                headers={"If-Match": '"2"'})
    assert raised.status_code == 200
    assert await history(client, f"{uid}-new") == [(3, {"n": 3})]


async def test_a_server_setting_lowered_to_0_prunes_at_the_next_write(
        settings: Settings, uid: str) -> None:
    """A thread without a limit of its own follows the server's setting, which may have been
    higher when it was last written: its next write under 0 drops what was kept."""
    async with running(settings.model_copy(update={"thread_history": 2})) as app, \
            http_client(app) as client:
        await put(client, uid, {"n": 1})
        await put(client, uid, {"n": 2}, 1)
        assert [r for r, _ in await history(client, uid)] == [2, 1]
    async with running(settings.model_copy(update={"thread_history": 0})) as app, \
            http_client(app) as client:
        assert [r for r, _ in await history(client, uid)] == [2, 1]
        await client.patch(f"/v1/threads/{uid}", json={"state": {"n": 3}},
                           headers={"If-Match": '"2"'})
        assert await history(client, uid) == []


async def test_concurrent_writers_still_get_412(client: httpx.AsyncClient, uid: str) -> None:
    """Keeping history adds statements to a write; the check-and-increment stays atomic."""
    await put(client, uid, {"n": 0})
    answers = await asyncio.gather(*(put(client, uid, {"n": i}, 1) for i in range(1, 21)))
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200] + [412] * 19
    winner = next(a for a in answers if a.status_code == 200).json()["state"]
    assert await history(client, uid) == [(2, winner), (1, {"n": 0})]


async def test_fork_takes_the_thread_as_it_was(app, client: httpx.AsyncClient, uid: str) -> None:
    url = await thread_with(client, uid, 4)  # revision 2: created (1), appended m1..m4 (2)
    await client.patch(f"/v1/threads/{uid}", json={"state": {"phase": "a"}},
                       headers={"If-Match": '"2"'})  # 3
    await client.put(f"/v1/threads/{uid}/agents/planner/state", json={"state": {"p": 1}})
    assert (await compact(client, uid, ["m2", "m3"], "sum")).status_code == 201  # 4
    await client.post(url, json={"id": "m5", "role": "user", "content": "later"})  # 5
    await client.patch(f"/v1/threads/{uid}", json={"state": {"phase": "b"}},
                       headers={"If-Match": '"5"'})  # 6
    source_full = await view(client, uid, "full")
    _, cursor = await drain(client)

    # At revision 3: four live messages, the state then, no compaction yet.
    early = await client.post(f"/v1/threads/{uid}/fork",
                              json={"thread_id": f"early-{uid}", "revision": 3})
    assert early.status_code == 201, early.text
    assert early.headers["location"] == f"/v1/threads/early-{uid}"
    body = early.json()
    assert (body["revision"], body["state"], body["message_count"]) == (1, {"phase": "a"}, 4)
    assert await view(client, f"early-{uid}", "full") == [
        ("m1", "live"), ("m2", "live"), ("m3", "live"), ("m4", "live")]
    assert (await client.get(f"/v1/threads/early-{uid}/compactions")).json()["data"] == []
    agent = await client.get(f"/v1/threads/early-{uid}/agents/planner/state")
    assert agent.status_code == 200 and agent.json()["state"] == {"p": 1}
    assert agent.json()["revision"] == 1

    # At the current revision: the same views, seqs, ids and compaction record.
    now = await client.post(f"/v1/threads/{uid}/fork", json={"thread_id": f"now-{uid}"})
    assert now.status_code == 201 and now.json()["state"] == {"phase": "b"}
    assert await view(client, f"now-{uid}", "full") == source_full
    assert [(m["id"], m["seq"], m["position"]) for m in await all_messages(client, f"now-{uid}")] \
        == [(m["id"], m["seq"], m["position"]) for m in await all_messages(client, uid)]
    records = (await client.get(f"/v1/threads/now-{uid}/compactions")).json()["data"]
    assert [r["source_message_ids"] for r in records] == [["m2", "m3"]]
    assert now.json()["message_count"] == (await client.get(f"/v1/threads/{uid}")).json()[
        "message_count"]

    # The fork is a thread of its own: the next append takes the next seq there only.
    appended = await client.post(f"/v1/threads/now-{uid}/messages",
                                 json={"role": "user", "content": "only in the fork"})
    assert appended.json()["data"][0]["seq"] == 7
    assert len(await all_messages(client, uid, view="full")) == 6
    events, _ = await drain(client, cursor)
    assert [(e["type"], e["thread_id"]) for e in events if e["thread_id"] == f"now-{uid}"] == [
        ("thread.created", f"now-{uid}"), ("agent_state.created", f"now-{uid}"),
        ("thread.forked", f"now-{uid}"), ("message.appended", f"now-{uid}")]


async def test_fork_undoes_a_later_revert(client: httpx.AsyncClient, uid: str) -> None:
    await thread_with(client, uid, 3)  # 2
    made = await compact(client, uid, ["m1", "m2"], "sum")  # 3
    reverted = await client.delete(f"/v1/threads/{uid}/compactions/{made.json()['id']}")  # 4
    assert reverted.status_code == 204
    at3 = await client.post(f"/v1/threads/{uid}/fork",
                            json={"thread_id": f"at3-{uid}", "revision": 3})
    assert await view(client, f"at3-{uid}", "live") == [
        (made.json()["summary_message_id"], "live"), ("m3", "live")]
    assert at3.json()["message_count"] == 2
    at4 = await client.post(f"/v1/threads/{uid}/fork", json={"thread_id": f"at4-{uid}"})
    assert await view(client, f"at4-{uid}", "full") == await view(client, uid, "full")
    assert at4.json()["message_count"] == 3


async def test_fork_refusals(client: httpx.AsyncClient, uid: str) -> None:
    await put(client, uid, {"n": 1}, history_limit=1)
    await put(client, uid, {"n": 2}, 1)
    await put(client, f"taken-{uid}", {})
    cases = [
        ({"thread_id": f"taken-{uid}"}, 412, "already_exists"),
        ({"thread_id": f"new-{uid}", "revision": 1}, 422, "revision_not_kept"),
        ({"thread_id": f"new-{uid}", "revision": 3}, 422, "revision_not_kept"),
        ({"thread_id": ".bad"}, 422, "string_pattern_mismatch"),
        ({"thread_id": f"new-{uid}", "extra": 1}, 422, "unknown_field"),
    ]
    for body, status, code in cases:
        response = await client.post(f"/v1/threads/{uid}/fork", json=body)
        assert response.status_code == status, (body, response.text)
        problem = response.json()
        assert code in (problem["code"], *(e["code"] for e in problem.get("errors", []))), body
    missing = await client.post(f"/v1/threads/nope-{uid}/fork", json={"thread_id": f"x-{uid}"})
    assert missing.status_code == 404
    assert (await client.get(f"/v1/threads/new-{uid}")).status_code == 404, "nothing written"
    # A deleted id is started afresh, its revisions continuing after the deletion's.
    await client.delete(f"/v1/threads/taken-{uid}", headers={"If-Match": '"1"'})
    revived = await client.post(f"/v1/threads/{uid}/fork", json={"thread_id": f"taken-{uid}"})
    assert revived.status_code == 201 and revived.json()["revision"] == 3
    assert revived.json()["state"] == {"n": 2}


async def test_a_state_replace_on_postgres_is_one_statement(
        app: FastAPI, client: httpx.AsyncClient, uid: str, backend: str) -> None:
    """A PUT with If-Match writes the row, its history entry, the pruning of the history
    and its audit event in one statement on Postgres (`ThreadRepository.advance_keeping`);
    in a batch whose earlier operation has an event pending, the PUT's event is written
    after it, in order. The answers and the stored events are the same on both backends."""
    base = f"/v1/threads/{uid}"
    assert (await client.put(base, json={"state": {"n": 0}, "history_limit": 2})).status_code == 201
    with statements(app) as heard:
        for n in range(1, 4):
            put = await client.put(base, json={"state": {"n": n}, "history_limit": 2},
                                   headers={"If-Match": f'"{n}"'})
            assert put.status_code == 200, put.text
            assert put.json()["revision"] == n + 1
    writes = [s.sql for s in heard if s.sql.lstrip().upper().startswith(("WITH", "UPDATE",
                                                                         "INSERT", "DELETE"))]
    if backend == "postgres":
        assert len(writes) == 3 and all(
            all(part in sql for part in ("UPDATE threads", "INSERT INTO thread_revisions",
                                         "DELETE FROM thread_revisions", "INSERT INTO events"))
            for sql in writes), writes
    stale = await client.put(base, json={"state": {}}, headers={"If-Match": '"1"'})
    assert stale.status_code == 412 and stale.json()["current_revision"] == 4
    revisions = (await client.get(f"{base}/revisions")).json()["data"]
    assert [r["revision"] for r in revisions][:2] == [4, 3]
    assert all(r["revision"] >= 3 for r in revisions), revisions  # a window of two
    batch = await client.post("/v1/batch", json={"operations": [
        {"op": "messages.append", "thread_id": uid, "body": {"messages": [
            {"role": "user", "content": "first"}]}},
        {"op": "thread.put", "thread_id": uid, "if_match": '"5"',
         "body": {"state": {"n": 9}, "history_limit": 2}}]})
    assert batch.status_code == 200, batch.text
    events = (await client.get("/v1/events", params={"thread_id": uid})).json()["data"]
    assert [(e["type"], e["revision"]) for e in events] == [
        ("thread.created", 1), ("thread.updated", 2), ("thread.updated", 3),
        ("thread.updated", 4), ("message.appended", 5), ("thread.updated", 6)], events
