"""The client's thread methods and its read-modify-write loop, against real servers."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import httpx
import pytest
from agentstate_client import (
    AgentStateClient,
    AsyncAgentStateClient,
    NotFound,
    PreconditionRequired,
    RevisionMismatch,
    Thread,
    ThreadDeleted,
)
from agentstate_client.errors import (
    AlreadyExists,
    ThreadExists,
    Unauthorized,
    UnprocessableEntity,
)

from tests.support import ServerProcess, agentstate, create_key

pytestmark = pytest.mark.slow  # every test here talks to a server process


def test_create_get_put_patch_delete(client: AgentStateClient, uid: str) -> None:
    thread = client.create_thread(f"t-{uid}", state={"step": 0}, metadata={"team": uid})
    assert isinstance(thread, Thread)
    assert (thread.thread_id, thread.revision, thread.state, thread.metadata) == (
        f"t-{uid}", 1, {"step": 0}, {"team": uid})
    assert thread.etag == '"1"' and thread.message_count == 0
    assert isinstance(thread.created_at, datetime) and thread.created_at.utcoffset() == timedelta(0)
    assert client.get_thread(thread.thread_id) == thread

    with pytest.raises(ThreadExists) as exists:
        client.create_thread(f"t-{uid}")
    assert exists.value.status_code == 409 and exists.value.request_id

    with pytest.raises(PreconditionRequired) as required:
        client.put_thread(thread.thread_id, {"step": 1})
    assert "If-Match" in required.value.detail

    replaced = client.put_thread(thread.thread_id, {"step": 1}, if_match=thread.revision)
    assert replaced.revision == 2 and replaced.metadata == {"team": uid}, "metadata kept"
    with pytest.raises(RevisionMismatch) as stale:
        client.put_thread(thread.thread_id, {"step": 9}, if_match=thread.etag)
    assert stale.value.current_revision == 2 and stale.value.code == "revision_mismatch"

    patched = client.patch_thread(thread.thread_id, state={"note": "x"},
                                  metadata={"team": None, "k": 1}, if_match="*",
                                  append_messages=[{"role": "user", "content": "with it"}])
    assert patched.state == {"step": 1, "note": "x"} and patched.metadata == {"k": 1}
    assert patched.revision == 3 and patched.message_count == 1
    assert (patched.history_limit, patched.ttl_seconds) == (None, None)
    assert [m.content for m in client.list_messages(thread.thread_id).data] == ["with it"]

    with pytest.raises(AlreadyExists) as already:
        client.put_thread(thread.thread_id, {}, create_only=True)
    assert already.value.current_revision == 3

    client.delete_thread(thread.thread_id, if_match=patched.revision)
    with pytest.raises(NotFound):
        client.get_thread(thread.thread_id)
    with pytest.raises(ThreadDeleted):
        client.put_thread(thread.thread_id, {}, if_match="*")
    fresh = client.put_thread(thread.thread_id, {"again": True}, create_only=True)
    assert fresh.revision == 5, "revisions continue after the deletion's"
    kept = client.patch_thread(thread.thread_id, history_limit=2, ttl_seconds=3600,
                               if_match=fresh.revision)
    assert (kept.history_limit, kept.ttl_seconds, kept.state) == (2, 3600, fresh.state)
    replaced = client.put_thread(thread.thread_id, {"n": 1}, if_match=kept.revision)
    assert (replaced.history_limit, replaced.ttl_seconds) == (2, 3600), "omitted: kept"
    # A day: a shorter time to live would let the suite's sweeper delete it (and write a
    # `thread.deleted` event) in the middle of another test that reads the tenant's feed.
    made = client.create_thread(state={}, history_limit=0, ttl_seconds=86_400)
    assert (made.history_limit, made.ttl_seconds) == (0, 86_400)
    client.delete_thread(made.thread_id, if_match=made.revision)


def test_server_generated_id_and_validation_errors(client: AgentStateClient) -> None:
    thread = client.create_thread()
    assert thread.thread_id.startswith("thr_") and thread.state == {}
    with pytest.raises(UnprocessableEntity) as invalid:
        client.create_thread(".hidden")
    assert invalid.value.status_code == 422
    assert invalid.value.errors[0]["pointer"] == "/thread_id"


def test_list_and_iterate_with_filters(client: AgentStateClient, uid: str) -> None:
    ids = [client.create_thread(f"l{i}-{uid}", metadata={"batch": uid, "i": i}).thread_id
           for i in range(5)]
    page = client.list_threads(metadata={"batch": uid}, limit=2)
    assert [t.thread_id for t in page.data] == ids[::-1][:2]
    assert page.has_more and page.next_cursor
    assert [t.thread_id for t in client.iter_threads(metadata={"batch": uid}, limit=2)] == ids[::-1]
    assert [t.thread_id for t in client.iter_threads(metadata={"batch": uid, "i": 3})] == [ids[3]]
    later = client.list_threads(metadata={"batch": uid},
                                updated_after=datetime.now().astimezone() + timedelta(hours=1))
    assert later.data == [] and not later.has_more
    named = client.list_threads(thread_ids=[ids[1], f"nope-{uid}", ids[3]])
    assert [t.thread_id for t in named.data] == [ids[3], ids[1]]
    assert client.list_threads(thread_ids=[]).data == [], "none asked, none read"


def test_update_thread_applies_fn_and_creates_on_request(client: AgentStateClient,
                                                         uid: str) -> None:
    with pytest.raises(NotFound):
        client.update_thread(f"u-{uid}", lambda s: {"n": 1})
    created = client.update_thread(f"u-{uid}", lambda s: {"n": s.get("n", 0) + 1}, create=True)
    assert created.revision == 1 and created.state == {"n": 1}

    def in_place(state: dict) -> None:
        state["n"] += 10

    assert client.update_thread(f"u-{uid}", in_place).state == {"n": 11}


def test_update_thread_retries_on_412_until_it_wins(server: ServerProcess, uid: str) -> None:
    thread_id = f"race-{uid}"
    with AgentStateClient(server.base_url) as a, AgentStateClient(server.base_url) as b:
        a.create_thread(thread_id, state={"n": 0})
        calls = []

        def interfering(state: dict) -> dict:
            # The first time, another writer gets in between this read and the write.
            calls.append(dict(state))
            if len(calls) == 1:
                b.put_thread(thread_id, {"n": 100}, if_match="*")
            return {"n": state["n"] + 1}

        result = a.update_thread(thread_id, interfering)
    assert calls == [{"n": 0}, {"n": 100}], "re-read and re-applied after the 412"
    assert result.state == {"n": 101} and result.revision == 3


def test_update_thread_gives_up_after_max_attempts(client: AgentStateClient, uid: str) -> None:
    thread_id = f"give-{uid}"
    client.create_thread(thread_id, state={"n": 0})

    def always_interfered(state: dict) -> dict:
        client.put_thread(thread_id, {"n": state["n"] + 100}, if_match="*")
        return state

    with pytest.raises(RevisionMismatch):
        client.update_thread(thread_id, always_interfered, max_attempts=3)
    assert client.get_thread(thread_id).state == {"n": 300}


@pytest.mark.anyio
async def test_async_client_and_concurrent_updates(server: ServerProcess, uid: str) -> None:
    thread_id = f"async-{uid}"
    clients = [AsyncAgentStateClient(server.base_url, backoff=0.02) for _ in range(8)]
    try:
        created = await clients[0].create_thread(thread_id, state={"n": 0})
        assert created.revision == 1
        await asyncio.gather(*(
            c.update_thread(thread_id, lambda s: {"n": s["n"] + 1}, max_attempts=50)
            for c in clients for _ in range(3)))
        final = await clients[0].get_thread(thread_id)
        assert final.state == {"n": 24} and final.revision == 25, "no lost update"
        listed = [t.thread_id async for t in clients[1].iter_threads(limit=100)]
        assert thread_id in listed
        with pytest.raises(RevisionMismatch):
            await clients[2].patch_thread(thread_id, state={"x": 1}, if_match=1)
        await clients[3].delete_thread(thread_id, if_match="*")
        with pytest.raises(NotFound):
            await clients[4].get_thread(thread_id)
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))


def test_configuration_from_the_environment(server: ServerProcess, uid: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTSTATE_URL", server.base_url + "/")
    monkeypatch.setenv("AGENTSTATE_API_KEY", "ask_not_for_logs")
    seen: list[httpx.Request] = []
    http = httpx.Client(event_hooks={"request": [seen.append]})
    with AgentStateClient(http_client=http, headers={"X-Request-ID": f"req-{uid}"},
                          timeout=5) as client:
        assert client.base_url == server.base_url
        assert "ask_not_for_logs" not in repr(client) + repr(client._core)
        # The server runs open, so it refuses a key it does not know: proof the key was sent.
        with pytest.raises(Unauthorized) as refused:
            client.get_thread(f"missing-{uid}")
    assert refused.value.request_id == f"req-{uid}", "the server echoes our X-Request-ID"
    assert seen[0].headers["authorization"] == "Bearer ask_not_for_logs"
    assert seen[0].headers["user-agent"].startswith("agentstate-client/")
    assert seen[0].extensions["timeout"]["read"] == 5
    assert seen[0].url == f"{server.base_url}/v1/threads/missing-{uid}"
    assert not http.is_closed, "a client passed in is the caller's to close"
    with pytest.raises(ValueError, match="not both"):
        AgentStateClient(http_client=http, transport=httpx.HTTPTransport())
    http.close()


def test_api_key_against_a_secured_server(tmp_path, uid: str) -> None:
    # A database of its own: creating a key ends open mode for every server on that database.
    url = f"sqlite+aiosqlite:///{tmp_path / 'keys.db'}"
    assert agentstate(url, "migrate").returncode == 0
    token = create_key(url, tenant=f"t-{uid}", scopes="read,write")
    with ServerProcess(url) as server:
        with AgentStateClient(server.base_url, api_key=token) as client:
            assert client.create_thread(f"k-{uid}").revision == 1
            assert client.get_thread(f"k-{uid}").thread_id == f"k-{uid}"
        with AgentStateClient(server.base_url) as anonymous, pytest.raises(Unauthorized):
            anonymous.get_thread(f"k-{uid}")
