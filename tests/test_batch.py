"""`POST /v1/batch`: operations in one transaction, all or nothing, on SQLite and
Postgres."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import select

from app.events.models import Event
from tests.conftest import http_client

pytestmark = pytest.mark.anyio


async def batch(client: httpx.AsyncClient, *operations: dict[str, Any],
                **headers: str) -> httpx.Response:
    return await client.post("/v1/batch", json={"operations": list(operations)},
                             headers=headers)


async def events(app: FastAPI, thread_id: str) -> list[str]:
    """The thread's event types in the order they were written: by id, the order the
    sequencer numbers them in (on Postgres an event has no seq until a pass after its
    commit has numbered it, which may not have run yet)."""
    async with app.state.db.read() as connection:
        return list((await connection.execute(
            select(Event.type).where(Event.thread_id == thread_id).order_by(Event.id)
        )).scalars().all())


async def test_operations_answer_as_their_single_requests(client: httpx.AsyncClient,
                                                          app: FastAPI, uid: str) -> None:
    response = await batch(
        client,
        {"op": "thread.put", "thread_id": uid, "if_none_match": "*",
         "body": {"state": {"step": 1}, "metadata": {"app": "a"}}},
        {"op": "messages.append", "thread_id": uid, "if_match": '"1"',
         "body": {"messages": [{"id": "first", "role": "user", "content": "hi"},
                               {"role": "model", "item": {"b": 1, "a": 2}}]}},
        {"op": "agent_state.put", "thread_id": uid, "agent_name": "app:x",
         "body": {"state": {"k": 1}}},
        {"op": "agent_state.patch", "thread_id": uid, "agent_name": "app:x", "if_match": '"1"',
         "body": {"state": {"j": 2}}},
        {"op": "thread.patch", "thread_id": uid, "if_match": '"2"',
         "body": {"state": {"step": 2}}},
        {"op": "messages.remove", "thread_id": uid, "body": {"last": 1}},
        {"op": "messages.redact", "thread_id": uid, "message_id": "first", "if_match": '"4"',
         "body": {"content": "[redacted]"}},
        {"op": "agent_state.delete", "thread_id": f"{uid}", "agent_name": "app:x",
         "if_match": '"2"'},
    )
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [r["status"] for r in results] == [201, 201, 201, 200, 200, 200, 200, 204]
    assert [r["etag"] for r in results] == ['"1"', '"2"', '"1"', '"2"', '"3"', '"4"', '"5"',
                                            None]
    assert results[6]["body"]["content"] == "[redacted]"
    assert results[1]["body"]["data"][1]["item"] == {"b": 1, "a": 2}
    assert results[5]["body"]["data"][0]["role"] == "model"
    thread = (await client.get(f"/v1/threads/{uid}")).json()
    assert thread["state"] == {"step": 2} and thread["message_count"] == 1
    assert (await client.get(f"/v1/threads/{uid}/agents/app:x/state")).status_code == 404
    assert await events(app, uid) == [
        "thread.created", "message.appended", "agent_state.created", "agent_state.updated",
        "thread.updated", "message.removed", "message.redacted", "agent_state.deleted"]


async def test_a_refused_operation_writes_nothing(client: httpx.AsyncClient, app: FastAPI,
                                                  uid: str) -> None:
    await client.put(f"/v1/threads/{uid}-b", json={"state": {}})
    response = await batch(
        client,
        {"op": "thread.put", "thread_id": f"{uid}-a", "body": {"state": {"x": 1}}},
        {"op": "messages.append", "thread_id": f"{uid}-a",
         "body": {"messages": [{"role": "user", "content": "lost"}]}},
        {"op": "agent_state.put", "thread_id": f"{uid}-b", "agent_name": "n",
         "body": {"state": {}}},
        {"op": "thread.patch", "thread_id": f"{uid}-b", "if_match": '"7"',
         "body": {"state": {"y": 1}}},
    )
    assert response.status_code == 412, response.text
    problem = response.json()
    assert problem["operation"] == 3 and problem["code"] == "revision_mismatch"
    assert problem["current_revision"] == 1 and "Operation 3" in problem["detail"]
    assert (await client.get(f"/v1/threads/{uid}-a")).status_code == 404
    assert (await client.get(f"/v1/threads/{uid}-b/agents")).json()["data"] == []
    assert await events(app, f"{uid}-a") == [] and await events(app, f"{uid}-b") == [
        "thread.created"]
    # Each kind of refusal names its operation.
    for operations, status, index in (
            ([{"op": "thread.delete", "thread_id": f"{uid}-b"}], 428, 0),
            ([{"op": "messages.append", "thread_id": f"{uid}-b",
               "body": {"messages": [{"role": "user"}]}},
              {"op": "messages.remove", "thread_id": f"{uid}-b", "body": {"ids": ["nope"]}}],
             404, 1),
            ([{"op": "thread.put", "thread_id": f"{uid}-b", "if_match": "3",
               "body": {"state": {}}}], 400, 0)):
        refused = await batch(client, *operations)
        assert refused.status_code == status, refused.text
        assert refused.json()["operation"] == index
    assert (await client.get(f"/v1/threads/{uid}-b")).json()["message_count"] == 0


async def test_a_write_that_could_commit_alone_waits_for_the_batch(
        client: httpx.AsyncClient, app: FastAPI, uid: str) -> None:
    """A thread's PUT with If-Match runs alone in autocommit on Postgres when it is the
    request's only change; in a batch it commits with the others or not at all."""
    for name in ("a", "b"):
        await client.put(f"/v1/threads/{uid}-{name}", json={"state": {"v": 1}})
    response = await batch(
        client,
        {"op": "thread.put", "thread_id": f"{uid}-a", "if_match": '"1"',
         "body": {"state": {"v": 2}}},
        {"op": "messages.append", "thread_id": f"{uid}-b", "if_match": '"9"',
         "body": {"messages": [{"role": "user", "content": "refused"}]}},
    )
    assert response.status_code == 412, response.text
    thread = (await client.get(f"/v1/threads/{uid}-a")).json()
    assert (thread["revision"], thread["state"]) == (1, {"v": 1})
    assert await events(app, f"{uid}-a") == ["thread.created"]
    # Alone in its batch, the same PUT commits.
    alone = await batch(client, {"op": "thread.put", "thread_id": f"{uid}-a",
                                 "if_match": '"1"', "body": {"state": {"v": 2}}})
    assert alone.status_code == 200, alone.text
    assert (await client.get(f"/v1/threads/{uid}-a")).json()["revision"] == 2
    assert await events(app, f"{uid}-a") == ["thread.created", "thread.updated"]


async def test_patches_read_ahead_are_judged_as_their_single_requests(
        client: httpx.AsyncClient, app: FastAPI, uid: str) -> None:
    """Patches of two threads or more (their rows read and locked in one statement before the
    first runs): a missing thread, a deleted one and a stale If-Match are refused as the
    single PATCH is, naming the operation, with nothing written; a thread patched twice sees
    its first patch in its second."""
    live, gone, never = f"{uid}-live", f"{uid}-gone", f"{uid}-never"
    await client.put(f"/v1/threads/{live}", json={"state": {"n": 0}})
    await client.put(f"/v1/threads/{gone}", json={"state": {}})
    await client.delete(f"/v1/threads/{gone}", headers={"If-Match": '"1"'})

    def patch(thread_id: str, if_match: str, n: int = 1) -> dict[str, Any]:
        return {"op": "thread.patch", "thread_id": thread_id, "if_match": if_match,
                "body": {"state": {"n": n}}}

    for operations, index, status in (([patch(live, "*"), patch(never, "*")], 1, 412),
                                      ([patch(gone, '"2"'), patch(live, "*")], 0, 410),
                                      ([patch(live, '"9"'), patch(never, "*")], 0, 412)):
        failing = operations[index]
        single = await client.patch(f"/v1/threads/{failing['thread_id']}",
                                    json=failing["body"],
                                    headers={"If-Match": failing["if_match"]})
        assert single.status_code == status, single.text
        refused = await batch(client, *operations)
        assert (refused.status_code, refused.json()["operation"]) == (status, index)
        for member in ("code", "current_revision"):
            assert refused.json().get(member) == single.json().get(member)
    thread = (await client.get(f"/v1/threads/{live}")).json()
    assert (thread["revision"], thread["state"]) == (1, {"n": 0})
    assert await events(app, live) == ["thread.created"]

    other = f"{uid}-other"
    await client.put(f"/v1/threads/{other}", json={"state": {}})
    ok = await batch(client, patch(live, '"1"', 1), patch(other, "*"), patch(live, '"2"', 2))
    assert ok.status_code == 200, ok.text
    assert [r["etag"] for r in ok.json()["results"]] == ['"2"', '"2"', '"3"']
    assert (await client.get(f"/v1/threads/{live}")).json()["state"] == {"n": 2}


async def test_a_taken_message_id_refuses_the_batch(client: httpx.AsyncClient, app: FastAPI,
                                                    uid: str) -> None:
    """The shape of an ADK append: the thread's state and revision, its messages, its seqs
    and its events are as they were after a 409 for an id the thread has."""
    url = f"/v1/threads/{uid}"
    first = await client.post(f"{url}/messages", json={"messages": [
        {"id": "a", "role": "user", "content": "kept"}]})
    assert first.status_code == 201, first.text
    before = (await client.get(url)).json()
    revision = before["revision"]

    def append(*ids: str) -> dict[str, Any]:
        return {"op": "messages.append", "thread_id": uid, "if_match": f'"{revision}"',
                "body": {"messages": [{"id": i, "role": "user", "content": i} for i in ids]}}

    patch = {"op": "thread.patch", "thread_id": uid, "if_match": f'"{revision + 1}"',
             "body": {"state": {"s": 1}}}
    # One message (ADK's append) and several are checked differently: both refuse alike.
    for ids in (("a",), ("b", "a", "c")):
        refused = await batch(client, append(*ids), patch)
        assert refused.status_code == 409, refused.text
        problem = refused.json()
        assert problem["code"] == "message_exists" and problem["operation"] == 0
        assert problem["detail"] == ("Operation 0 (messages.append) was refused, nothing was "
                                     "written: Message 'a' already exists in this thread; "
                                     "nothing was written.")
        assert (await client.get(url)).json() == before
        stored = (await client.get(f"{url}/messages")).json()["data"]
        assert [(m["id"], m["seq"]) for m in stored] == [("a", 1)]
        assert await events(app, uid) == ["thread.created", "message.appended"]
    # A taken id is refused before a parent link is looked at, for one message as for several.
    for ids in (("a",), ("b", "a")):
        op = append(*ids)
        op["body"]["messages"][-1]["parent_id"] = "no-such-message"
        linked = await batch(client, op)
        assert linked.status_code == 409 and linked.json()["code"] == "message_exists", linked.text
    taken_later = await batch(client, append("b", "c", "a"))
    assert taken_later.json()["detail"].endswith("Message 'a' already exists in this thread; "
                                                 "nothing was written.")
    ok = await batch(client, append("b", "c"), patch)
    assert ok.status_code == 200, ok.text
    assert [(m["id"], m["seq"]) for m in ok.json()["results"][0]["body"]["data"]] == [
        ("b", 2), ("c", 3)]
    assert ok.json()["results"][1]["etag"] == f'"{revision + 2}"'


async def test_bad_batches_are_422(client: httpx.AsyncClient, uid: str) -> None:
    one = {"op": "thread.delete", "thread_id": uid, "if_match": "*"}
    for body in ({"operations": []}, {"operations": [one] * 101}, {},
                 {"operations": [{**one, "op": "thread.explode"}]},
                 {"operations": [{**one, "extra": 1}]},
                 {"operations": [{"op": "thread.put", "thread_id": ".x", "body": {"state": {}}}]}):
        response = await client.post("/v1/batch", json=body)
        assert response.status_code == 422, (body, response.text)


async def test_idempotency_key_replays_the_batch(client: httpx.AsyncClient, uid: str) -> None:
    ops = [{"op": "messages.append", "thread_id": uid,
            "body": {"messages": [{"role": "user", "content": "once"}]}}]
    first = await batch(client, *ops, **{"Idempotency-Key": f"k-{uid}"})
    again = await batch(client, *ops, **{"Idempotency-Key": f"k-{uid}"})
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json() and again.headers["idempotent-replayed"] == "true"
    assert (await client.get(f"/v1/threads/{uid}")).json()["message_count"] == 1
    other = await batch(client, ops[0], ops[0], **{"Idempotency-Key": f"k-{uid}"})
    assert other.status_code == 422 and other.json()["code"] == "idempotency_key_reused"


async def test_concurrent_batches_never_lose_an_update(app: FastAPI, uid: str) -> None:
    """Sixteen clients each make five read-modify-write batches on one thread (the counter
    in its state, a message and a per-agent state), retrying on 412: every update lands."""
    writers, rounds = 16, 5
    async with http_client(app) as setup:
        await setup.put(f"/v1/threads/{uid}", json={"state": {"n": 0}},
                        headers={"If-None-Match": "*"})

    async def writer(w: int) -> int:
        conflicts = 0
        async with http_client(app) as client:
            for r in range(rounds):
                while True:
                    thread = (await client.get(f"/v1/threads/{uid}")).json()
                    response = await batch(
                        client,
                        {"op": "thread.put", "thread_id": uid,
                         "if_match": f'"{thread["revision"]}"',
                         "body": {"state": {"n": thread["state"]["n"] + 1}}},
                        {"op": "messages.append", "thread_id": uid,
                         "body": {"messages": [{"role": "user", "content": f"{w}.{r}"}]}},
                        {"op": "agent_state.put", "thread_id": uid, "agent_name": f"w{w}",
                         "if_match": "*" if r else None, "if_none_match": None if r else "*",
                         "body": {"state": {"round": r}}},
                    )
                    if response.status_code == 412:
                        conflicts += 1
                        continue
                    assert response.status_code == 200, response.text
                    break
        return conflicts

    await asyncio.gather(*(writer(w) for w in range(writers)))
    async with http_client(app) as client:
        thread = (await client.get(f"/v1/threads/{uid}")).json()
        assert thread["state"]["n"] == writers * rounds
        assert thread["message_count"] == writers * rounds
        messages = (await client.get(f"/v1/threads/{uid}/messages",
                                     params={"limit": 1000})).json()["data"]
        assert sorted(m["content"] for m in messages) == sorted(
            f"{w}.{r}" for w in range(writers) for r in range(rounds))
        assert [m["seq"] for m in messages] == list(range(1, writers * rounds + 1))
        states = (await client.get(f"/v1/threads/{uid}/agents",
                                   params={"limit": 100})).json()["data"]
        assert [(s["revision"], s["state"]) for s in states] == [(rounds, {"round": rounds - 1})
                                                                 ] * writers


async def test_batches_patching_threads_in_opposite_orders_never_deadlock(app: FastAPI,
                                                                         uid: str) -> None:
    """Eight clients patch the same two threads in one batch, half naming them a-then-b and
    half b-then-a: a batch locks the threads it patches first in one statement, in thread id
    order, so none waits for another in a cycle (no 503) and every patch lands."""
    writers, rounds = 8, 10
    names = [f"{uid}-a", f"{uid}-b"]
    async with http_client(app) as setup:
        for name in names:
            await setup.put(f"/v1/threads/{name}", json={"state": {}},
                            headers={"If-None-Match": "*"})

    async def writer(w: int) -> list[int]:
        order = names if w % 2 else names[::-1]
        statuses = []
        async with http_client(app) as client:
            for r in range(rounds):
                response = await batch(client, *(
                    {"op": "thread.patch", "thread_id": name, "if_match": "*",
                     "body": {"state": {f"w{w}": r}}} for name in order))
                statuses.append(response.status_code)
        return statuses

    statuses = await asyncio.gather(*(writer(w) for w in range(writers)))
    assert statuses == [[200] * rounds] * writers
    async with http_client(app) as client:
        for name in names:
            thread = (await client.get(f"/v1/threads/{name}")).json()
            assert thread["revision"] == 1 + writers * rounds
            assert thread["state"] == {f"w{w}": rounds - 1 for w in range(writers)}


@pytest.mark.postgres_only(reason="a deadlock between two transactions is Postgres's to detect")
async def test_a_deadlock_is_a_503_to_retry_and_writes_nothing(client: httpx.AsyncClient,
                                                              database_url: str,
                                                              uid: str) -> None:
    """A batch that takes two threads in one order against a transaction that takes them in
    the other: Postgres breaks the deadlock by rolling back the batch, which waited first.

    Postgres rolls back whichever side's `deadlock_timeout` check finds the cycle. The batch
    checks once, 1 s after it starts waiting; on a loaded machine the test's own transaction
    may only close the cycle after that, and is then the one rolled back (it checks 5 s after
    it waits, see below), the batch goes on and succeeds. That round proves nothing about the
    batch, so the race is run again, up to five times, until the batch is the one chosen."""
    import asyncpg

    from tests.support import pg_connect, wait_until_blocked

    for attempt in range(5):
        ids = [f"{uid}-{attempt}-{name}" for name in ("a", "b")]
        for thread_id in ids:
            await client.put(f"/v1/threads/{thread_id}", json={"state": {}})
        ops = [{"op": "thread.patch", "thread_id": thread_id, "if_match": "*",
                "body": {"state": {"by": "batch"}}} for thread_id in ids]
        other = await pg_connect(database_url)
        try:
            await other.execute("SET deadlock_timeout = '5s'")
            async with other.transaction():
                await other.execute("SELECT 1 FROM threads WHERE thread_id = $1 FOR UPDATE",
                                    ids[1])
                batch_task = asyncio.ensure_future(batch(client, *ops))
                await wait_until_blocked(database_url, other.get_server_pid())
                # Now take a while the batch holds it and waits for b: a deadlock.
                try:
                    await other.execute(
                        "SELECT 1 FROM threads WHERE thread_id = $1 FOR UPDATE", ids[0])
                except asyncpg.DeadlockDetectedError:
                    chosen = "test"
                else:
                    chosen = "batch"
                finally:
                    response = await batch_task
        except asyncpg.DeadlockDetectedError:
            chosen = "test"
        finally:
            await other.close()
        if chosen == "test":  # the batch went on once the test's transaction was gone
            assert response.status_code == 200, response.text
            continue
        assert response.status_code == 503, response.text
        assert response.headers["retry-after"] == "0"
        for thread_id in ids:
            thread = (await client.get(f"/v1/threads/{thread_id}")).json()
            assert thread["state"] == {} and thread["revision"] == 1
        again = await batch(client, *ops)
        assert again.status_code == 200, again.text
        return
    pytest.fail("Postgres chose the test's transaction in each of five rounds")
