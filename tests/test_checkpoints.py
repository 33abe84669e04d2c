"""Checkpoints of graph runtimes, on SQLite and Postgres,
through HTTP."""

from __future__ import annotations

import base64
import hashlib

import httpx
import pytest
from fastapi import FastAPI

from app.core.settings import Settings
from tests.conftest import http_client, running
from tests.support import direct_url, drain, pg_connect, statements

pytestmark = pytest.mark.anyio


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def digest(type_: str, data: bytes) -> str:
    return hashlib.sha256(type_.encode() + b"\x00" + data).digest()[:16].hex()


def body(cid: str, versions: dict, values: list | None = None, *, ns: str = "",
         parent: str | None = None, **metadata: object) -> dict:
    return {"checkpoint_ns": ns, "checkpoint_id": cid, "parent_checkpoint_id": parent,
            "checkpoint": {"v": 1, "id": cid, "channel_versions": versions},
            "metadata": {"step": 0, **metadata}, "values": values or []}


def value(channel: str, version: object, data: bytes) -> dict:
    return {"channel": channel, "version": version, "type": "bytes", "data": b64(data)}


async def test_create_replay_conflict_and_values_per_version(
        client: httpx.AsyncClient, uid: str) -> None:
    base = f"/v1/threads/{uid}/checkpoints"
    first = body("c1", {"a": 1, "b": 1}, [value("a", 1, b"A1"), value("b", 1, b"B1")])
    made = await client.post(base, json=first)
    assert made.status_code == 201, made.text
    assert made.headers["location"] == f"{base}/c1"
    assert (await client.post(base, json=first)).status_code == 200, "a replay"
    other = await client.post(base, json={**first, "metadata": {"step": 9}})
    assert other.status_code == 409 and other.json()["code"] == "checkpoint_exists"

    # The second checkpoint sends only the channel it changed.
    second = body("c2", {"a": 2, "b": 1}, [value("a", 2, b"A2")], parent="c1")
    assert (await client.post(base, json=second)).status_code == 201
    got = (await client.get(f"{base}/c2")).json()
    assert got["parent_checkpoint_id"] == "c1"
    assert {ch: base64.b64decode(v["data"]) for ch, v in got["values"].items()} == {
        "a": b"A2", "b": b"B1"}
    old = (await client.get(f"{base}/c1")).json()
    assert base64.b64decode(old["values"]["a"]["data"]) == b"A1"
    latest = (await client.get(f"{base}/latest")).json()
    assert latest["checkpoint_id"] == "c2"
    assert (await client.get(f"{base}/nope")).status_code == 404
    assert (await client.get(f"{base}/latest", params={"checkpoint_ns": "x"})).status_code == 404


async def test_items_are_stored_once_and_sent_by_digest(client: httpx.AsyncClient,
                                                        uid: str) -> None:
    base = f"/v1/threads/{uid}/checkpoints"
    m1, m2 = b"first message", b"second message"
    items = [{"type": "msgpack", "data": b64(m1)}]
    made = await client.post(base, json=body("c1", {"messages": 1}, [
        {"channel": "messages", "version": 1, "type": "list", "items": items}]))
    assert made.status_code == 201, made.text
    by_digest = [{"digest": digest("msgpack", m1)}, {"type": "msgpack", "data": b64(m2)}]
    assert (await client.post(base, json=body("c2", {"messages": 2}, [
        {"channel": "messages", "version": 2, "type": "list", "items": by_digest}],
        parent="c1"))).status_code == 201
    got = (await client.get(f"{base}/c2")).json()["values"]["messages"]
    assert got["type"] == "list"
    assert [base64.b64decode(i["data"]) for i in got["items"]] == [m1, m2]
    unknown = await client.post(base, json=body("c3", {"messages": 3}, [
        {"channel": "messages", "version": 3, "type": "list",
         "items": [{"digest": "0" * 32}]}]))
    assert unknown.status_code == 409 and unknown.json()["code"] == "checkpoint_items_missing"
    assert unknown.json()["missing"] == ["0" * 32]
    bad = await client.post(base, json=body("c3", {}, [
        {"channel": "m", "version": 3, "type": "list", "data": b64(b"x"), "items": []}]))
    assert bad.status_code == 422


async def test_writes_are_idempotent_and_sorted(client: httpx.AsyncClient, uid: str) -> None:
    base = f"/v1/threads/{uid}/checkpoints"
    await client.post(base, json=body("c1", {}))
    writes = {"task_id": "t2", "task_path": "~b", "writes": [
        {"idx": 0, "channel": "x", "type": "bytes", "data": b64(b"one")}]}
    for _ in range(2):
        sent = await client.post(f"{base}/c1/writes", json=writes)
        assert sent.status_code == 200, sent.text
    again = {**writes, "writes": [{**writes["writes"][0], "data": b64(b"changed")}]}
    assert (await client.post(f"{base}/c1/writes", json=again)).status_code == 200
    await client.post(f"{base}/c1/writes", json={"task_id": "t1", "task_path": "~a", "writes": [
        {"idx": 1, "channel": "y", "type": "bytes", "data": b64(b"two")},
        {"idx": -1, "channel": "__error__", "type": "bytes", "data": b64(b"err")}]})
    pending = (await client.get(f"{base}/c1")).json()["pending_writes"]
    assert [(w["task_id"], w["idx"], base64.b64decode(w["data"])) for w in pending] == [
        ("t1", -1, b"err"), ("t1", 1, b"two"), ("t2", 0, b"one")]
    # Writes may come before their checkpoint (runtimes save checkpoints in the background).
    early = await client.post(f"{base}/c2/writes", json=writes)
    assert early.status_code == 200
    await client.post(base, json=body("c2", {}, parent="c1"))
    assert [w["task_id"] for w in (await client.get(f"{base}/c2")).json()["pending_writes"]] \
        == ["t2"]


async def test_list_filters_prune_copy_delete_runs_and_events(client: httpx.AsyncClient,
                                                              uid: str) -> None:
    base = f"/v1/threads/{uid}/checkpoints"
    _, cursor = await drain(client, None)
    for n in range(1, 5):
        await client.post(base, json=body(f"c{n}", {"a": n}, [value("a", n, f"v{n}".encode())],
                                          step=n, run_id=f"r{n % 2}"))
    await client.post(base, json=body("c3", {}, ns="sub:1", step=3))
    listed = await client.get(base, params={"limit": 2})
    assert [(c["checkpoint_ns"], c["checkpoint_id"]) for c in listed.json()["data"]] == [
        ("", "c4"), ("sub:1", "c3")]
    rest = await client.get(base, params={"limit": 10, "cursor": listed.json()["next_cursor"]})
    assert [c["checkpoint_id"] for c in rest.json()["data"]] == ["c3", "c2", "c1"]
    root = await client.get(base, params={"checkpoint_ns": "", "before": "c4", "limit": 1})
    assert [c["checkpoint_id"] for c in root.json()["data"]] == ["c3"]
    filtered = await client.get(base, params={"metadata": '{"run_id": "r1"}'})
    assert [c["checkpoint_id"] for c in filtered.json()["data"]] == ["c3", "c1"]

    copied = await client.post(f"{base}/copy", json={"thread_id": f"copy-{uid}"})
    assert copied.status_code == 200 and copied.json() == {"count": 5}
    assert [c["checkpoint_id"] for c in (await client.get(
        f"/v1/threads/copy-{uid}/checkpoints")).json()["data"]] == ["c4", "c3", "c3", "c2", "c1"]

    pruned = await client.post(f"{base}/prune", json={"keep": 1})
    assert pruned.json() == {"count": 3}
    kept = (await client.get(base)).json()["data"]
    assert [(c["checkpoint_ns"], c["checkpoint_id"]) for c in kept] == [("", "c4"), ("sub:1", "c3")]
    assert base64.b64decode(kept[0]["values"]["a"]["data"]) == b"v4"

    gone = await client.post("/v1/checkpoints/delete-runs", json={"run_ids": ["r1"]})
    assert gone.json() == {"count": 2}, "c3 and c1 of the copy (the source's were pruned)"
    assert [c["checkpoint_id"] for c in (await client.get(
        f"/v1/threads/copy-{uid}/checkpoints")).json()["data"]] == ["c4", "c3", "c2"], \
        "the c3 left is that of namespace sub:1, which names no run"
    assert (await client.delete(base)).status_code == 204
    assert (await client.get(base)).json()["data"] == []

    events, _ = await drain(client, cursor)
    types = [e["type"] for e in events if e["type"].startswith("checkpoint.")]
    assert types.count("checkpoint.created") == 5
    assert {"checkpoint.copied", "checkpoint.pruned", "checkpoint.runs_deleted",
            "checkpoint.deleted"} <= set(types)


async def test_if_match_on_the_thread_and_delete_with_the_thread(
        client: httpx.AsyncClient, uid: str) -> None:
    base = f"/v1/threads/{uid}/checkpoints"
    await client.put(f"/v1/threads/{uid}", json={"state": {}}, headers={"If-None-Match": "*"})
    stale = await client.post(base, json=body("c1", {}), headers={"If-Match": '"7"'})
    assert stale.status_code == 412 and stale.json()["current_revision"] == 1
    assert (await client.post(base, json=body("c1", {}),
                              headers={"If-Match": '"1"'})).status_code == 201
    assert (await client.delete(f"/v1/threads/{uid}", headers={"If-Match": '"1"'})).status_code \
        == 204
    assert (await client.get(base)).status_code == 404
    late = await client.post(base, json=body("c2", {}))
    assert late.status_code == 410


async def test_body_limits(client: httpx.AsyncClient, uid: str) -> None:
    """A checkpoint above the general 1 MiB limit is stored; above its own limit it is 413."""
    base = f"/v1/threads/{uid}/checkpoints"
    big = b"x" * (3 * 1024 * 1024)
    stored = await client.post(base, json=body("c1", {"a": 1}, [value("a", 1, big)]))
    assert stored.status_code == 201, stored.text[:200]
    assert base64.b64decode((await client.get(f"{base}/c1")).json()["values"]["a"]["data"]) == big
    elsewhere = await client.put(f"/v1/threads/other-{uid}", json={"state": {"x": "y" * 2**21}})
    assert elsewhere.status_code == 413
    huge = b"x" * (64 * 1024 * 1024)
    refused = await client.post(base, content=b'{"pad": "' + huge + b'"}',
                                headers={"content-type": "application/json"})
    assert refused.status_code == 413 and refused.json()["code"] == "payload_too_large"


@pytest.mark.slow
async def test_tenants_never_see_each_others_checkpoints(
        secured_client: httpx.AsyncClient, secured_database_url: str, uid: str) -> None:
    from tests.test_auth import bearer, create_key

    a = bearer(create_key(secured_database_url, f"a-{uid}"))
    b = bearer(create_key(secured_database_url, f"b-{uid}"))
    base = f"/v1/threads/{uid}/checkpoints"
    made = await secured_client.post(base, json=body("c1", {"a": 1}, [value("a", 1, b"A")],
                                                     run_id="r"), headers=a)
    assert made.status_code == 201
    for path in (base, f"{base}/c1", f"{base}/latest"):
        assert (await secured_client.get(path, headers=b)).status_code == 404, path
    assert (await secured_client.post(f"{base}/prune", json={"keep": 0},
                                      headers=b)).status_code == 404
    assert (await secured_client.post(f"{base}/copy", json={"thread_id": f"x-{uid}"},
                                      headers=b)).status_code == 404
    assert (await secured_client.post("/v1/checkpoints/delete-runs", json={"run_ids": ["r"]},
                                      headers=b)).json() == {"count": 0}
    # B's own thread of the same id holds B's checkpoints only.
    assert (await secured_client.post(base, json=body("c1", {}), headers=b)).status_code == 201
    mine = await secured_client.get(f"{base}/c1", headers=a)
    assert mine.status_code == 200 and mine.json()["values"]["a"]["data"] == b64(b"A")


async def test_long_lists_across_chunks_survive_prune_and_copy(client: httpx.AsyncClient,
                                                               uid: str) -> None:
    """A list longer than a chunk (64 items) grows by digest references, and reads back in
    order after a prune dropped the versions before it and after a copy."""
    base = f"/v1/threads/{uid}/checkpoints"
    log = [f"message {n}".encode() for n in range(130)]
    sent: list[bytes] = []
    for version, upto in enumerate((100, 129, 130), start=1):
        items = [{"digest": digest("msgpack", m)} if m in sent
                 else {"type": "msgpack", "data": b64(m)} for m in log[:upto]]
        made = await client.post(base, json=body(f"c{version}", {"messages": version}, [
            {"channel": "messages", "version": version, "type": "list", "items": items}]))
        assert made.status_code == 201, made.text
        sent = log[:upto]
    assert (await client.post(f"{base}/prune", json={"keep": 1})).json() == {"count": 2}
    await client.post(f"{base}/copy", json={"thread_id": f"copy-{uid}"})
    for thread in (uid, f"copy-{uid}"):
        got = (await client.get(f"/v1/threads/{thread}/checkpoints/c3")).json()
        assert [base64.b64decode(i["data"]) for i in got["values"]["messages"]["items"]] == log


async def test_a_list_sent_as_what_it_gained(client: httpx.AsyncClient, uid: str) -> None:
    """`base_version`: the stored list of that version, then the items sent."""
    base = f"/v1/threads/{uid}/checkpoints"
    log = [f"entry {n}".encode() for n in range(140)]
    versions = [(1, 0, 63), (2, 63, 64), (3, 64, 130), (4, 130, 140)]
    for version, start, end in versions:
        value_ = {"channel": "log", "version": version, "type": "list",
                  "items": [{"type": "msgpack", "data": b64(m)} for m in log[start:end]]}
        if start:
            value_["base_version"] = version - 1
        made = await client.post(base, json=body(f"c{version}", {"log": version}, [value_]))
        assert made.status_code == 201, made.text
    for version, _, end in versions:
        got = (await client.get(f"{base}/c{version}")).json()["values"]["log"]["items"]
        assert [base64.b64decode(i["data"]) for i in got] == log[:end], version
    missing = await client.post(base, json=body("c9", {"log": 9}, [
        {"channel": "log", "version": 9, "base_version": 8, "type": "list", "items": []}]))
    assert missing.status_code == 409 and missing.json()["code"] == "checkpoint_items_missing"
    assert (await client.get(f"{base}/c9")).status_code == 404, "nothing written"


async def test_a_batch_extends_and_names_what_it_stores_itself(
        app: FastAPI, client: httpx.AsyncClient, uid: str, backend: str) -> None:
    """A batch's values, items and writes are stored together at its end (one statement on
    Postgres, with its audit events, in their order): a later checkpoint of the batch may
    extend a list an earlier one of it sends (`base_version`) and name its items by digest,
    as it could once that was stored."""
    base = f"/v1/threads/{uid}/checkpoints"
    log = [f"entry {n}".encode() for n in range(70)]
    first = body("c1", {"log": 1}, [{"channel": "log", "version": 1, "type": "list", "items": [
        {"type": "msgpack", "data": b64(m)} for m in log[:66]]}])
    second = body("c2", {"log": 2}, [{"channel": "log", "version": 2, "base_version": 1,
                                      "type": "list", "items": [
        {"digest": digest("msgpack", log[0])}, *(
            {"type": "msgpack", "data": b64(m)} for m in log[66:])]}], parent="c1")
    writes = [{"checkpoint_id": "c2", "task_id": "t", "writes": [
        {"idx": 0, "channel": "log", "type": "bytes", "data": b64(b"w")}]}]
    # A thread that exists: the batch's events are its own (a new thread's event comes
    # first, and is written by the unit, so the batch's are written after it).
    assert (await client.put(f"/v1/threads/{uid}", json={"state": {}})).status_code == 201
    with statements(app) as heard:
        stored = await client.post(f"{base}/batch", json={"checkpoints": [first, second],
                                                          "writes": writes})
    assert stored.status_code == 200, stored.text
    got = (await client.get(f"{base}/c2")).json()
    assert [base64.b64decode(i["data"]) for i in got["values"]["log"]["items"]] == [
        *log[:66], log[0], *log[66:]]
    assert [w["task_id"] for w in got["pending_writes"]] == ["t"]
    inserts = [s.sql for s in heard if "INSERT INTO checkpoint_" in s.sql
               or "INSERT INTO events" in s.sql]
    tables = ("checkpoint_items", "checkpoint_blobs", "checkpoint_writes", "events")
    if backend == "postgres":  # with the audit events, in one statement
        assert len(inserts) == 1 and all(table in inserts[0] for table in tables), inserts
    else:  # an executemany each
        assert [next(t for t in tables if t in sql) for sql in inserts] == list(tables)
    types = [(e["type"], e["resource"].rsplit("/", 2)[-2:])
             for e in (await client.get("/v1/events", params={"thread_id": uid})).json()["data"]]
    assert types == [("thread.created", ["threads", uid]),
                     ("checkpoint.created", ["checkpoints", "c1"]),
                     ("checkpoint.created", ["checkpoints", "c2"]),
                     ("checkpoint.writes_added", ["c2", "writes"])], types


async def test_one_checkpoint_written_by_many_at_once(
        app: FastAPI, client: httpx.AsyncClient, uid: str, backend: str) -> None:
    """Twenty writers send one checkpoint at once, each with a task's writes, into a thread
    that exists (on Postgres each write is then one statement that commits by itself):
    with the same content, one stores it and the others are replays, and every task's
    writes are kept; with other content, one wins and the rest are 409s that store nothing,
    not even their writes. One `checkpoint.created` event each time."""
    import asyncio

    base = f"/v1/threads/{uid}/checkpoints"
    assert (await client.put(f"/v1/threads/{uid}", json={"state": {}})).status_code == 201
    _, cursor = await drain(client, None, thread_id=uid)

    def batch(cid: str, n: int, step: int) -> dict:
        return {"checkpoints": [body(cid, {"a": step}, [value("a", step, b"A")], step=step)],
                "writes": [{"checkpoint_id": cid, "task_id": f"task-{n}", "writes": [
                    {"idx": 0, "channel": "a", "type": "bytes", "data": b64(f"{n}".encode())}]}]}

    with statements(app) as heard:
        same = await asyncio.gather(*(client.post(f"{base}/batch", json=batch("c1", n, 1))
                                      for n in range(20)))
    assert [r.status_code for r in same] == [200] * 20, [r.text for r in same]
    assert sorted(r.json()["checkpoints"][0]["replayed"] for r in same) == [False] + [True] * 19
    got = (await client.get(f"{base}/c1")).json()
    assert sorted(w["task_id"] for w in got["pending_writes"]) == sorted(
        f"task-{n}" for n in range(20))
    if backend == "postgres" and not app.state.settings.pooled:  # each tried it alone
        alone = [s.sql for s in heard if "live_thread" in s.sql]
        assert len(alone) == 20 and all("INSERT INTO checkpoints" in sql for sql in alone)

    other = await asyncio.gather(*(client.post(f"{base}/batch", json=batch("c2", n, 2 + n))
                                   for n in range(20)))
    codes = sorted(r.status_code for r in other)
    assert codes == [200] + [409] * 19, codes
    winner = next(n for n, r in enumerate(other) if r.status_code == 200)
    got = (await client.get(f"{base}/c2")).json()
    assert got["metadata"]["step"] == 2 + winner
    assert [w["task_id"] for w in got["pending_writes"]] == [f"task-{winner}"]

    events, _ = await drain(client, cursor, thread_id=uid)
    created = [e["resource"].rsplit("/", 1)[-1] for e in events
               if e["type"] == "checkpoint.created"]
    assert created == ["c1", "c2"], created
    assert sum(e["type"] == "checkpoint.writes_added" for e in events) == 20 + 1


async def test_the_latest_reads_as_the_same_checkpoint_read_by_id(
        client: httpx.AsyncClient, uid: str) -> None:
    """`latest` reads the checkpoint with its values and writes in one statement on
    Postgres; `GET .../{id}` reads them apart. Both answer the same, values (a list across
    chunks, a number version, a float one, a string one, a channel with no value stored)
    and writes (several tasks, out of order) alike, in each namespace."""
    base = f"/v1/threads/{uid}/checkpoints"
    log = [{"type": "bytes", "data": b64(f"entry {n}".encode())} for n in range(70)]
    for ns in ("", "sub:1"):
        sent = await client.post(f"{base}/batch", json={
            "checkpoints": [
                body("c1", {"log": 1}, [{"channel": "log", "version": 1, "type": "list",
                                         "items": log[:10]}], ns=ns),
                body("c2", {"log": 2, "f": 2.5, "s": "v.7", "none": 3}, [
                    {"channel": "log", "version": 2, "base_version": 1, "type": "list",
                     "items": log[10:]}, value("f", 2.5, b"F"), value("s", "v.7", b"S")],
                     ns=ns, parent="c1")],
            "writes": [{"checkpoint_id": "c2", "checkpoint_ns": ns, "task_id": task,
                        "task_path": path, "writes": [
                            {"idx": idx, "channel": "log", "type": "bytes",
                             "data": b64(f"{task}{idx}".encode())} for idx in (1, 0)]}
                       for task, path in (("t2", "b"), ("t1", "b"), ("t3", "a"))]})
        assert sent.status_code == 200, sent.text
    for ns in ("", "sub:1"):
        for items in ("data", "digests"):
            params = {"checkpoint_ns": ns, "items": items}
            latest = (await client.get(f"{base}/latest", params=params)).json()
            by_id = (await client.get(f"{base}/c2", params=params)).json()
            assert latest.pop("delta_history") is None and latest == by_id
            assert set(latest["values"]) == {"log", "f", "s"}
            assert [(w["task_path"], w["task_id"], w["idx"]) for w in latest["pending_writes"]
                    ] == [("a", "t3", 0), ("a", "t3", 1), ("b", "t1", 0), ("b", "t1", 1),
                          ("b", "t2", 0), ("b", "t2", 1)]
        assert len(latest["values"]["log"]["digests"]) == 70


@pytest.mark.postgres_only(reason="a write runs alone, in autocommit, on Postgres only")
@pytest.mark.direct_postgres(reason="not through a transaction pooler either")
async def test_a_connection_that_wrote_alone_is_back_in_transactions(
        database_url: str, uid: str) -> None:
    """On Postgres a checkpoint write to a live thread runs its one statement in autocommit;
    the pooled connection it used is a transaction again for the next request on it (a pool
    of one): a batch whose second operation is refused writes nothing of its first."""
    settings = Settings(database_url=database_url, pool_size=1, max_overflow=0,  # type: ignore[call-arg]
                        auto_migrate=False, _env_file=None)
    async with running(settings) as app, http_client(app) as client:
        assert (await client.put(f"/v1/threads/{uid}", json={"state": {}})).status_code == 201
        stored = await client.post(f"/v1/threads/{uid}/checkpoints/batch", json={
            "checkpoints": [body("c1", {"a": 1}, [value("a", 1, b"A")])]})
        assert stored.status_code == 200, stored.text
        refused = await client.post("/v1/batch", json={"operations": [
            {"op": "messages.append", "thread_id": uid,
             "body": {"messages": [{"role": "user", "content": "kept?"}]}},
            {"op": "messages.remove", "thread_id": uid, "body": {"ids": ["nope"]}}]})
        assert refused.status_code == 404, refused.text
        assert (await client.get(f"/v1/threads/{uid}")).json()["message_count"] == 0


@pytest.mark.postgres_only(reason="prepared statements' plans are Postgres's")
@pytest.mark.direct_postgres(reason="a write runs alone only when not pooled")
async def test_postgres_keeps_one_plan_for_the_statements_of_a_step(
        app: FastAPI, client: httpx.AsyncClient, database_url: str, uid: str) -> None:
    """Postgres plans a prepared statement's first five executions for their parameters,
    then keeps one generic plan only if its estimate is not above theirs with their
    planning. A checkpoint write that extends a list and names items by digest, and the
    reads of values, writes and items by key, must get that plan: estimated on ten rows
    per array parameter, they were planned again at every execution (a write: 0.7-0.8 ms
    of planning, more than it then ran)."""
    base = f"/v1/threads/{uid}/checkpoints"
    log = [b64(f"entry {n}".encode()) for n in range(3)]
    assert (await client.post(base, json=body("c1", {"log": 1}, [
        {"channel": "log", "version": 1, "type": "list",
         "items": [{"type": "bytes", "data": m} for m in log]}]))).status_code == 201
    named = [{"digest": digest("bytes", base64.b64decode(m))} for m in log]
    with statements(app) as heard:
        extends = await client.post(f"{base}/batch", json={"checkpoints": [body(
            "c2", {"log": 2}, [{"channel": "log", "version": 2, "base_version": 1,
                                "type": "list", "items": [{"type": "bytes", "data": "eA=="}]}],
            parent="c1")], "writes": [{"checkpoint_id": "c2", "task_id": "t", "writes": [
                {"idx": 0, "channel": "log", "type": "bytes", "data": "eA=="}]}]})
        names = await client.post(base, json=body("c3", {"log": 3}, [
            {"channel": "log", "version": 3, "type": "list", "items": named}], parent="c2"))
        read = await client.get(f"{base}/c2", params={"items": "digests"})
        items = await client.post(f"{base}/items", json={"digests": [
            n["digest"] for n in named]})
    assert [r.status_code for r in (extends, names, read, items)] == [200, 201, 200, 200]
    keyed: dict[str, list] = {}
    for statement in heard:
        if "unnest" in statement.sql:
            keyed.setdefault(statement.sql, []).append(statement.params)
    writes = [params for sql, runs in keyed.items() if "INSERT INTO checkpoints" in sql
              for params in runs]
    assert len(writes) == 2 and len(keyed) >= 4, list(keyed)  # and values, writes, items
    admin = await pg_connect(database_url)
    try:
        for sql, runs in keyed.items():
            prepared = await admin.prepare(sql)
            transaction = admin.transaction()  # the writes again store nothing anyway
            await transaction.start()
            try:
                for n in range(8):
                    await prepared.fetch(*runs[n % len(runs)])
                plans = await admin.fetchrow(
                    "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                    "WHERE statement = $1", sql)
            finally:
                await transaction.rollback()
            assert plans["generic_plans"] == 3, (dict(plans), sql)
    finally:
        await admin.close()


async def test_bad_input_is_a_4xx(client: httpx.AsyncClient, uid: str) -> None:
    base = f"/v1/threads/{uid}/checkpoints"
    cases = [
        body("c1", {"a": [1]}),  # a version that is no scalar
        body("c1", {"a": "v" * 300}),  # a version longer than its stored key may be
        body("c1", {}, [value("a", "v" * 300, b"x")]),
        body("c1", {}, [{**value("a", 1, b"x"), "data": "not base64!"}]),
        body("c1", {}, [{"channel": "a", "version": 1, "type": "list", "data": "eA==",
                         "items": []}]),
        body("c1", {}, [{"channel": "a", "version": 1, "type": "t", "items": [
            {"type": "t"}]}]),
        {**body("c1", {}), "extra": 1},
    ]
    for case in cases:
        response = await client.post(base, json=case)
        assert response.status_code == 422, (case, response.text)
    nul = await client.get(base, params={"checkpoint_ns": "a\x00b"})
    assert nul.status_code == 422
    huge = await client.post(f"{base}/c1/writes", json={"task_id": "t", "writes": [
        {"idx": 2**40, "channel": "a", "type": "t", "data": "eA=="}]})
    assert huge.status_code == 422
    assert (await client.get(base)).status_code == 404, "nothing created the thread"


async def test_prunes_racing_saves_never_lose_a_value(client: httpx.AsyncClient,
                                                      uid: str) -> None:
    """Saves that continue a list (`base_version`) and prunes to the latest, all at once on
    one thread: every checkpoint left reads back whole, and a save whose base was pruned is
    refused (409), never stored with a value missing."""
    import asyncio

    base = f"/v1/threads/{uid}/checkpoints"
    await client.post(base, json=body("c000", {"log": 0, "x": 0}, [
        {"channel": "log", "version": 0, "type": "list", "items": []}, value("x", 0, b"x")]))

    async def save(n: int) -> int:
        response = await client.post(base, json=body(f"c{n:03}", {"log": n, "x": 0}, [
            {"channel": "log", "version": n, "base_version": 0, "type": "list",
             "items": [{"type": "msgpack", "data": b64(f"m{n}".encode())}]}]))
        return response.status_code

    async def prune() -> int:
        return (await client.post(f"{base}/prune", json={"keep": 1})).status_code

    statuses = await asyncio.gather(*[save(n) if n % 3 else prune() for n in range(1, 31)])
    assert set(statuses) <= {200, 201, 409}, statuses
    assert 201 in statuses
    for checkpoint in (await client.get(base, params={"limit": 100})).json()["data"]:
        got = (await client.get(f"{base}/{checkpoint['checkpoint_id']}")).json()["values"]
        n = int(checkpoint["checkpoint_id"][1:])
        if n:
            assert [base64.b64decode(i["data"]) for i in got["log"]["items"]] == [
                f"m{n}".encode()]
        assert base64.b64decode(got["x"]["data"]) == b"x"


@pytest.mark.postgres_only(reason="the values lock is a Postgres advisory lock")
@pytest.mark.parametrize("refers", ["extends", "names"])
async def test_values_collected_while_a_save_that_refers_to_them_waits_are_refused(
        client: httpx.AsyncClient, database_url: str, uid: str, refers: str) -> None:
    """A save that extends a stored list (which it reads first) or names stored items by
    digest waits for the values lock while a collection holds it; the collection deletes
    the thread's values and items and commits. The save must then store nothing and answer
    409, not a checkpoint whose value names deleted items (the list's first chunk, which
    the save would only refer to; the items it names)."""
    import asyncio

    base = f"/v1/threads/{uid}/checkpoints"
    log = [b64(f"entry {n}".encode()) for n in range(70)]  # a full chunk and 6 more
    assert (await client.post(base, json=body("c1", {"log": 1}, [
        {"channel": "log", "version": 1, "type": "list",
         "items": [{"type": "bytes", "data": m} for m in log]}]))).status_code == 201
    collector = await pg_connect(database_url)
    try:
        pk = await collector.fetchval("SELECT id FROM threads WHERE thread_id = $1", uid)
        transaction = collector.transaction()
        await transaction.start()
        await collector.execute("SELECT pg_advisory_xact_lock($1, $2)", 0x61676370, pk % 2**31)
        more = [{"type": "bytes", "data": b64(b"one more")}]
        value = ({"channel": "log", "version": 2, "base_version": 1, "type": "list",
                  "items": more} if refers == "extends" else
                 {"channel": "log", "version": 2, "type": "list", "items": [
                     {"digest": digest("bytes", base64.b64decode(m))} for m in log] + more})
        save = asyncio.create_task(client.post(base, json=body("c2", {"log": 2}, [value],
                                                               parent="c1")))
        for _ in range(200):  # until the save waits for this thread's lock (not another's)
            if await collector.fetchval(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                    "AND classid = $1 AND objid = $2 AND objsubid = 2 "
                    "AND database = (SELECT oid FROM pg_database "
                    "WHERE datname = current_database())", 0x61676370, pk % 2**31):
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the save never waited for the values lock")
        for table in ("checkpoint_writes", "checkpoint_items", "checkpoint_blobs",
                      "checkpoints"):
            await collector.execute(f"DELETE FROM {table} WHERE thread_pk = $1", pk)
        await transaction.commit()
        answer = await save
    finally:
        await collector.close()
    assert answer.status_code == 409, answer.text
    assert answer.json()["code"] == "checkpoint_items_missing"
    assert (await client.get(f"{base}/c2")).status_code == 404
    assert (await client.get(base)).json()["data"] == []


async def test_reads_by_digest_and_items_fetched_apart(client: httpx.AsyncClient,
                                                       uid: str) -> None:
    base = f"/v1/threads/{uid}/checkpoints"
    log = [f"entry {n}".encode() for n in range(70)]
    await client.post(base, json=body("c1", {"log": 1}, [
        {"channel": "log", "version": 1, "type": "list",
         "items": [{"type": "msgpack", "data": b64(m)} for m in log]}]))
    expected = [digest("msgpack", m) for m in log]
    for response in (await client.get(f"{base}/c1", params={"items": "digests"}),
                     await client.get(f"{base}/latest", params={"items": "digests"})):
        value_ = response.json()["values"]["log"]
        assert value_["digests"] == expected and value_["items"] is None
    listed = (await client.get(base, params={"items": "digests"})).json()["data"][0]
    assert listed["values"]["log"]["digests"] == expected
    fetched = await client.post(f"{base}/items", json={"digests": expected[:3] + ["f" * 32]})
    assert fetched.status_code == 200, fetched.text
    assert [(i["digest"], base64.b64decode(i["data"])) for i in sorted(
        fetched.json()["data"], key=lambda i: expected.index(i["digest"]))] == list(
        zip(expected[:3], log[:3]))
    whole = (await client.get(f"{base}/c1")).json()["values"]["log"]
    assert "digest" not in whole["items"][0] and whole["digests"] is None
    assert (await client.post(f"/v1/threads/nope-{uid}/checkpoints/items",
                              json={"digests": []})).status_code == 404


def _rows_visited(plan: dict) -> int:
    """Table rows an EXPLAIN ANALYZE plan read (its scans' rows, those their filters threw
    away included) and join pairs it threw away, over all loops: the work of a statement,
    which the machine's load does not change."""
    loops = plan.get("Actual Loops", 1)
    own = plan.get("Rows Removed by Join Filter", 0) * loops
    if "Relation Name" in plan:
        own += (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)
                + plan.get("Rows Removed by Index Recheck", 0)) * loops
    return own + sum(_rows_visited(child) for child in plan.get("Plans", []))


@pytest.mark.postgres_only(reason="planner statistics are Postgres's")
async def test_reads_of_a_long_thread_visit_rows_by_key_before_tables_are_analyzed(
        fresh_url: str) -> None:
    """A new database's tables have no statistics until autovacuum's first analyze (here it
    is off). Planned on guesses, the latest read and the delta history walk once scanned the
    thread's rows for every key they looked up: the walk of a chain of N checkpoints visited
    about N * N rows, the latest read all of the thread's values to return three. Each row
    is now fetched by its whole key (a LATERAL lookup on Postgres): every read visits a few
    rows for each it returns, whatever the statistics say."""
    steps = 200
    admin = await pg_connect(direct_url(fresh_url))
    try:
        for table in ("checkpoints", "checkpoint_blobs", "checkpoint_items",
                      "checkpoint_writes", "threads"):
            await admin.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        settings = Settings(database_url=fresh_url, auto_migrate=False,  # type: ignore[call-arg]
                            _env_file=None)
        async with running(settings) as app, http_client(app) as client:
            base = "/v1/threads/long/checkpoints"
            first = body("c000", {"m": 1, "l": 1}, [value("m", 1, b"seed"), {
                "channel": "l", "version": 1, "type": "list",
                "items": [{"type": "bytes", "data": b64(b"%d" % n)} for n in range(300)]}])
            assert (await client.post(base, json=first)).status_code == 201
            for start in range(1, steps + 1, 50):
                # A new version of m at each step, its value not stored (a delta channel's),
                # and of x, stored.
                batch = [body(f"c{n:03d}", {"m": n + 1, "l": 1, "x": n},
                              [value("x", n, b"%d" % n)], parent=f"c{n - 1:03d}")
                         for n in range(start, min(start + 50, steps + 1))]
                writes = [{"checkpoint_id": cp["checkpoint_id"], "task_id": "t", "writes": [
                    {"idx": 0, "channel": "m", "type": "bytes", "data": b64(b"w")}]}
                    for cp in batch]
                sent = await client.post(f"{base}/batch",
                                         json={"checkpoints": batch, "writes": writes})
                assert sent.status_code == 200, sent.text
            with statements(app) as heard:
                latest = await client.get(f"{base}/latest")
                history = await client.get(f"{base}/latest/delta-history",
                                           params={"channel": "m"})
        assert latest.status_code == 200 and len(latest.json()["values"]["l"]["items"]) == 300
        assert len(history.json()["channels"]["m"]["writes"]) == steps - 1  # not the target's
        assert history.json()["channels"]["m"]["seed"] is not None
        reads = [s for s in heard if s.sql.lstrip().upper().startswith(("SELECT", "WITH"))]
        assert len(reads) >= 4
        for statement in reads:
            prepared = await admin.prepare(statement.sql)
            plan = await prepared.explain(*statement.params, analyze=True)
            returned = plan[0]["Plan"]["Actual Rows"]
            assert _rows_visited(plan[0]["Plan"]) <= 4 * returned + 4, statement.sql
    finally:
        await admin.close()
