"""Retention (docs/operations.md): threads' `ttl_seconds`, and events, tombstones and
idempotency records removed after their retention by the sweeper and `agentstate gc`."""

from __future__ import annotations

import json
from datetime import timedelta

import httpx
import pytest
from fastapi import FastAPI

from app.core.settings import Settings
from app.db.base import utcnow
from app.retention.service import Retention
from tests.conftest import http_client, running
from tests.support import agentstate, drain

pytestmark = pytest.mark.anyio


async def test_a_thread_past_its_ttl_is_deleted_like_a_delete(app: FastAPI,
                                                               client: httpx.AsyncClient,
                                                               uid: str) -> None:
    _, start = await drain(client)
    short, kept, plain = f"ttl-{uid}", f"kept-{uid}", f"plain-{uid}"
    created = await client.put(f"/v1/threads/{short}", json={"state": {}, "ttl_seconds": 60})
    assert created.status_code == 201 and created.json()["ttl_seconds"] == 60
    await client.put(f"/v1/threads/{kept}", json={"state": {}, "ttl_seconds": 3600})
    await client.put(f"/v1/threads/{plain}", json={"state": {}})
    assert "ttl_seconds" not in (await client.get(f"/v1/threads/{plain}")).json()
    retention = Retention(app.state.db, app.state.settings, app.state.feed)

    # Nothing is due yet.
    await retention.sweep()
    assert (await client.get(f"/v1/threads/{short}")).status_code == 200

    # Counted from the last write: a write to `kept` an hour from now would keep it; here
    # the sweep runs as if two minutes had passed.
    report = await retention.sweep(utcnow() + timedelta(seconds=120))
    assert report.expired_threads >= 1
    assert (await client.get(f"/v1/threads/{short}")).status_code == 404
    late = await client.put(f"/v1/threads/{short}/agents/a/state", json={"state": {}})
    assert late.status_code == 410, "a tombstone, as after DELETE"
    assert (await client.get(f"/v1/threads/{kept}")).status_code == 200
    assert (await client.get(f"/v1/threads/{plain}")).status_code == 200
    events, _ = await drain(client, start, thread_id=short)
    assert [(e["type"], e["revision"], e["actor"]) for e in events] == [
        ("thread.created", 1, "anonymous"), ("thread.deleted", 2, "retention")]

    # PATCH can take the time to live away again; null removes it.
    patched = await client.patch(f"/v1/threads/{kept}", json={"ttl_seconds": None},
                                 headers={"If-Match": '"1"'})
    assert patched.status_code == 200 and "ttl_seconds" not in patched.json()
    await retention.sweep(utcnow() + timedelta(days=2))
    assert (await client.get(f"/v1/threads/{kept}")).status_code == 200
    bad = await client.put(f"/v1/threads/x-{uid}", json={"state": {}, "ttl_seconds": 0})
    assert bad.status_code == 422



async def test_a_thread_others_link_into_outlives_its_ttl(app: FastAPI, client: httpx.AsyncClient,
                                                         uid: str) -> None:
    """The sweeper deletes as DELETE does, so it keeps what another thread's messages
    continue (API.md section 4, "Parent links") until nothing links into it."""
    held, linker = f"held-{uid}", f"linker-{uid}"
    await client.put(f"/v1/threads/{held}", json={"state": {}, "ttl_seconds": 60,
                                                  "append_messages": [
                                                      {"id": f"{uid}-p", "role": "user"}]})
    linked = await client.post(f"/v1/threads/{linker}/messages",
                               json={"role": "user", "parent_id": f"{uid}-p"})
    assert linked.status_code == 201, linked.text
    retention = Retention(app.state.db, app.state.settings, app.state.feed)
    await retention.sweep(utcnow() + timedelta(seconds=120))
    assert (await client.get(f"/v1/threads/{held}")).status_code == 200
    removed = await client.post(f"/v1/threads/{linker}/messages:remove", json={"last": 1})
    assert removed.status_code == 200, removed.text
    await retention.sweep(utcnow() + timedelta(seconds=120))
    assert (await client.get(f"/v1/threads/{held}")).status_code == 404

async def test_events_tombstones_and_idempotency_records_expire(database_url: str,
                                                                uid: str) -> None:
    settings = Settings(database_url=database_url, auto_migrate=False, _env_file=None,  # type: ignore[call-arg]
                        event_retention_hours=1, tombstone_retention_hours=1, sweep_batch=2)
    async with running(settings) as app, http_client(app) as client:
        t = f"r-{uid}"
        await client.put(f"/v1/threads/{t}", json={"state": {}})
        appended = await client.post(f"/v1/threads/{t}/messages",
                                     json={"messages": [{"role": "user", "content": "x"}]},
                                     headers={"Idempotency-Key": f"k-{uid}"})
        assert appended.status_code == 201, appended.text
        await client.delete(f"/v1/threads/{t}", headers={"If-Match": '"2"'})
        before, _ = await drain(client)
        newest = before[-1]["seq"]
        retention = Retention(app.state.db, settings, app.state.feed)

        dry = await retention.count(utcnow() + timedelta(hours=25))
        assert dry.events >= 2 and dry.tombstones >= 1
        later_on = utcnow() + timedelta(hours=25)
        report = await retention.sweep(later_on)
        assert report.events >= 2 and report.tombstones >= 1
        # A sweep is bounded (batches of 2 here); the next ones continue until none is left.
        while any((await retention.sweep(later_on)).as_dict().values()):
            pass
        after, cursor = await drain(client)
        assert [e["seq"] for e in after] == [newest], "a tenant's newest event is kept"
        # The tombstone is gone: the id is free again (a new thread, not a 410).
        assert (await client.get(f"/v1/threads/{t}")).status_code == 404
        assert (await client.put(f"/v1/threads/{t}", json={"state": {}})).status_code == 201
        later, _ = await drain(client, cursor)
        assert [e["seq"] for e in later] == [newest + 1], "seqs are never handed out twice"


@pytest.mark.slow
def test_gc_command_counts_and_removes(database_url: str, uid: str) -> None:
    env = {"AGENTSTATE_EVENT_RETENTION_HOURS": "0.0001"}
    dry = agentstate(database_url, "gc", "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    counted = json.loads(dry.stdout)
    assert counted["dry_run"] is True and set(counted) == {
        "dry_run", "expired_threads", "events", "tombstones", "idempotency_keys",
        "expired_store_items", "store_tombstones"}
    done = agentstate(database_url, "gc", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["dry_run"] is False
    again = agentstate(database_url, "gc", "--dry-run", env=env)
    assert json.loads(again.stdout)["events"] == 0
