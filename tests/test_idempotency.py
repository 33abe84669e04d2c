"""Idempotency-Key on POST .../messages and POST .../compactions (API.md section 4)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.support import ServerProcess, pg_connect, wait_until_blocked
from tests.test_messages import events_of

pytestmark = pytest.mark.anyio

BODY = {"messages": [{"role": "user", "content": "hi", "metadata": {"a": 1, "b": 2}},
                     {"role": "assistant", "content": "hello"}]}
# The same JSON value as BODY, spelled differently.
SAME_BODY = (b'{ "messages" : [ {"metadata": {"b": 2, "a": 1}, "content": "hi", "role": "user"},'
             b' {"role": "assistant", "content": "hello"} ] }')


async def state(client: httpx.AsyncClient, uid: str) -> tuple[int, int]:
    thread = (await client.get(f"/v1/threads/{uid}")).json()
    return thread["revision"], thread["message_count"]


async def test_a_retry_replays_and_writes_nothing(app, client: httpx.AsyncClient,
                                                  uid: str) -> None:
    url = f"/v1/threads/{uid}/messages"
    first = await client.post(url, json=BODY, headers={"Idempotency-Key": "k-1"})
    assert first.status_code == 201 and "idempotent-replayed" not in first.headers
    written = (await state(client, uid), await events_of(app, uid))

    retries = [
        await client.post(url, json=BODY, headers={"Idempotency-Key": "k-1"}),
        await client.post(url, content=SAME_BODY, headers={
            "Idempotency-Key": '"k-1"', "content-type": "application/json"}),
        # Replays are answered before preconditions are evaluated.
        await client.post(url, json=BODY, headers={"Idempotency-Key": "k-1", "If-Match": '"99"'}),
    ]
    for retry in retries:
        assert retry.status_code == 201, retry.text
        assert retry.content == first.content, "same ids, seqs and revision"
        assert retry.headers["etag"] == first.headers["etag"] == '"2"'
        assert retry.headers["idempotent-replayed"] == "true"
    assert (await state(client, uid), await events_of(app, uid)) == written

    reused = await client.post(url, json={"role": "user", "content": "other"},
                               headers={"Idempotency-Key": "k-1"})
    assert reused.status_code == 422 and reused.json()["code"] == "idempotency_key_reused"
    assert await state(client, uid) == written[0]

    # Scoped to the thread and the endpoint: the same key elsewhere is a new request.
    elsewhere = await client.post(f"/v1/threads/{uid}-b/messages", json=BODY,
                                  headers={"Idempotency-Key": "k-1"})
    assert elsewhere.status_code == 201 and "idempotent-replayed" not in elsewhere.headers
    fresh = await client.post(url, json=BODY, headers={"Idempotency-Key": "k-2"})
    assert [m["seq"] for m in fresh.json()["data"]] == [3, 4]
    ids = [m["id"] for m in first.json()["data"]]
    cmp = await client.post(f"/v1/threads/{uid}/compactions", headers={"Idempotency-Key": "k-1"},
                            json={"source_message_ids": ids, "summary": {"role": "system"}})
    assert cmp.status_code == 201 and "idempotent-replayed" not in cmp.headers


async def test_a_refused_request_stores_no_key(client: httpx.AsyncClient, uid: str) -> None:
    url = f"/v1/threads/{uid}/messages"
    await client.post(url, json={"role": "user"})
    refused = await client.post(url, json=BODY, headers={"Idempotency-Key": "k",
                                                         "If-Match": '"9"'})
    assert refused.status_code == 412
    accepted = await client.post(url, json=BODY, headers={"Idempotency-Key": "k"})
    assert accepted.status_code == 201 and "idempotent-replayed" not in accepted.headers
    assert await state(client, uid) == (3, 3)


async def test_compaction_retry_replays(client: httpx.AsyncClient, uid: str) -> None:
    url = f"/v1/threads/{uid}/messages"
    await client.post(url, json={"messages": [{"id": f"m{i}", "role": "user"} for i in range(3)]})
    body = {"source_message_ids": ["m0", "m1"], "summary": {"role": "system", "content": "s"}}
    headers = {"Idempotency-Key": "compact-1"}
    first = await client.post(f"/v1/threads/{uid}/compactions", json=body, headers=headers)
    again = await client.post(f"/v1/threads/{uid}/compactions", json=body, headers=headers)
    assert first.status_code == again.status_code == 201
    assert again.content == first.content and again.headers["location"] == first.headers["location"]
    assert len((await client.get(f"/v1/threads/{uid}/compactions")).json()["data"]) == 1
    assert await state(client, uid) == (3, 2)
    other = await client.post(f"/v1/threads/{uid}/compactions", headers=headers,
                              json={**body, "reason": "different"})
    assert other.status_code == 422 and other.json()["code"] == "idempotency_key_reused"


@pytest.mark.parametrize("key", ["", " ", "x" * 256, "tab\there", '""'])
async def test_bad_keys_are_400(client: httpx.AsyncClient, uid: str, key: str) -> None:
    response = await client.post(f"/v1/threads/{uid}/messages", json=BODY,
                                 headers={"Idempotency-Key": key})
    assert response.status_code == 400 and response.json()["code"] == "invalid_header"


async def test_two_keys_are_400(client: httpx.AsyncClient, uid: str) -> None:
    """Which of two Idempotency-Key lines counts is not ours to guess."""
    response = await client.post(f"/v1/threads/{uid}/messages", json=BODY,
                                 headers=[("Idempotency-Key", "a"), ("Idempotency-Key", "b")])
    assert response.status_code == 400 and response.json()["code"] == "invalid_header"
    assert "one Idempotency-Key" in response.json()["detail"]
    assert (await client.get(f"/v1/threads/{uid}")).status_code == 404


async def test_concurrent_retries_write_once(app, uid: str) -> None:
    clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
               for _ in range(10)]
    try:
        responses = await asyncio.gather(*(
            c.post(f"/v1/threads/{uid}/messages", json=BODY, headers={"Idempotency-Key": "same"})
            for c in clients))
        created = [r for r in responses if r.status_code == 201]
        in_flight = [r for r in responses if r.status_code == 409]
        assert len(created) + len(in_flight) == 10, [r.text for r in responses]
        assert all(r.json()["code"] == "idempotency_in_flight" for r in in_flight)
        assert len({r.content for r in created}) == 1, "every 201 is the one original response"
        assert await state(clients[0], uid) == (2, 2), "written exactly once"
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))


@pytest.mark.slow
@pytest.mark.postgres_only(reason="on SQLite writers queue, so a retry waits for the first "
                           "request and replays it (test_concurrent_retries_write_once)")
async def test_in_flight_across_server_processes(database_url: str, uid: str) -> None:
    """While one server is still processing a key, another server answers 409 at once; after
    the first commits, a retry anywhere replays it."""
    url = f"/v1/threads/{uid}/messages"
    with ServerProcess(database_url) as one, ServerProcess(database_url) as two:
        async with httpx.AsyncClient(base_url=one.base_url, timeout=60) as a, \
                httpx.AsyncClient(base_url=two.base_url, timeout=60) as b:
            assert (await a.post(url, json={"role": "user"})).status_code == 201
            blocker = await pg_connect(database_url)
            try:
                # Hold the thread row so the first request stops inside its transaction,
                # after it has claimed the key.
                hold = blocker.transaction()
                await hold.start()
                await blocker.execute("SELECT 1 FROM threads WHERE thread_id = $1 FOR UPDATE", uid)
                first = asyncio.create_task(
                    a.post(url, json=BODY, headers={"Idempotency-Key": "slow"}))
                (waiting,) = await wait_until_blocked(database_url, blocker.get_server_pid())
                claimed = await blocker.fetchval(
                    "SELECT count(*) FROM pg_locks WHERE pid = $1 AND locktype = 'advisory'"
                    " AND granted", waiting)
                assert claimed == 1, "the first request waits on the thread without its key"
                for body in (BODY, {"role": "user", "content": "different"}):
                    busy = await b.post(url, json=body, headers={"Idempotency-Key": "slow"})
                    assert busy.status_code == 409, busy.text
                    assert busy.json()["code"] == "idempotency_in_flight"
                assert not first.done()
                await hold.rollback()
                original = await first
            finally:
                await blocker.close()
            assert original.status_code == 201, original.text
            replay = await b.post(url, json=BODY, headers={"Idempotency-Key": "slow"})
            assert replay.status_code == 201 and replay.content == original.content
            assert await state(b, uid) == (3, 3)
        assert "Traceback" not in one.logs() + two.logs()


async def test_keys_expire_after_the_ttl(client: httpx.AsyncClient, uid: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import timedelta

    from app.idempotency import service as idempotency

    url = f"/v1/threads/{uid}/messages"
    first = await client.post(url, json=BODY, headers={"Idempotency-Key": "old"})
    assert first.status_code == 201
    real_now = idempotency.utcnow
    monkeypatch.setattr(idempotency, "utcnow", lambda: real_now() + timedelta(hours=25))
    # A day later the key is free again: a different body is a new request, not a reuse.
    later = await client.post(url, json={"role": "user", "content": "new"},
                              headers={"Idempotency-Key": "old"})
    assert later.status_code == 201 and "idempotent-replayed" not in later.headers
    again = await client.post(url, json={"role": "user", "content": "new"},
                              headers={"Idempotency-Key": "old"})
    assert again.content == later.content and again.headers["idempotent-replayed"] == "true"
    assert await state(client, uid) == (3, 3)
