"""The audit log over HTTP (API.md section 8), on SQLite and Postgres."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text

from app.http.dependencies import Writer
from app.threads.schemas import ThreadCreate
from app.threads.service import ThreadService
from tests.support import ServerProcess, bearer, create_key, drain, eventually, pg_connect

pytestmark = pytest.mark.anyio

TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


async def test_one_event_per_committed_change_none_for_failures(
        client: httpx.AsyncClient, uid: str) -> None:
    _, start = await drain(client)
    t, t2, t3 = f"t-{uid}", f"t2-{uid}", f"t3-{uid}"
    m = f"/v1/mcp-servers/m-{uid}"
    st = f"/v1/threads/{t}/agents/a/state"
    calls = [
        ("PUT", f"/v1/threads/{t}", {"json": {"state": {}}}, 201),
        ("PUT", f"/v1/threads/{t}", {"json": {"state": {}}}, 428),
        ("PUT", f"/v1/threads/{t}", {"json": {"state": {"n": 1}}, "headers": {"If-Match": '"1"'}}, 200),
        ("PATCH", f"/v1/threads/{t}", {"json": {"state": {"n": 2}}, "headers": {"If-Match": '"2"'}}, 200),
        ("PATCH", f"/v1/threads/{t}", {"json": {"state": {}}, "headers": {"If-Match": '"2"'}}, 412),
        ("POST", "/v1/threads", {"json": {"thread_id": t}}, 409),
        ("PUT", st, {"json": {"state": {"k": 1}}}, 201),
        ("PUT", f"/v1/threads/{t2}/agents/a/state", {"json": {"state": {}}}, 201),
        ("PUT", f"/v1/threads/{t3}/agents/a/state",
         {"json": {"state": {}}, "headers": {"If-Match": '"1"'}}, 412),
        ("PATCH", st, {"json": {"state": {"k": 2}}, "headers": {"If-Match": '"1"'}}, 200),
        ("PUT", st, {"json": {"state": []}, "headers": {"If-Match": '"2"'}}, 422),
        ("PUT", st, {"content": b"{", "headers": {"If-Match": '"2"',
                                                  "content-type": "application/json"}}, 400),
        ("DELETE", st, {"headers": {"If-Match": '"2"'}}, 204),
        ("PUT", m, {"json": {"server_type": "broker"}}, 201),
        ("PATCH", m, {"json": {"state": {"up": True}}, "headers": {"If-Match": '"1"'}}, 200),
        # Fails after its row is locked and judged (keeps a secret it does not have): rolled
        # back, no event. (Was "no key for secrets", a 500; on SQLite a key is now always
        # there, and on Postgres it is a 503.)
        ("PATCH", m, {"json": {"secrets": {"t": "***"}}, "headers": {"If-Match": '"2"'}}, 422),
        ("DELETE", m, {"headers": {"If-Match": '"2"'}}, 204),
        ("PUT", f"/v1/threads/{t}/agents/b/state", {"json": {"state": {}}}, 201),
        ("DELETE", f"/v1/threads/{t}", {"headers": {"If-Match": '"3"'}}, 204),
        ("PUT", st, {"json": {"state": {}}}, 410),
        ("PUT", f"/v1/threads/{t}", {"json": {"state": {}}, "headers": {"If-None-Match": "*"}}, 201),
    ]
    for method, path, kwargs, status in calls:
        response = await client.request(method, path, **kwargs)
        assert response.status_code == status, (method, path, response.text)

    events, _ = await drain(client, start)
    ours = [e for e in events if uid in e["resource"]]
    assert ours == events, "nothing else wrote meanwhile"
    assert [(e["type"], e["resource"], e["revision"], e.get("thread_id")) for e in ours] == [
        ("thread.created", f"/v1/threads/{t}", 1, t),
        ("thread.updated", f"/v1/threads/{t}", 2, t),
        ("thread.updated", f"/v1/threads/{t}", 3, t),
        ("agent_state.created", st, 1, t),
        ("thread.created", f"/v1/threads/{t2}", 1, t2),
        ("agent_state.created", f"/v1/threads/{t2}/agents/a/state", 1, t2),
        ("agent_state.updated", st, 2, t),
        ("agent_state.deleted", st, 3, t),
        ("mcp_server.created", m, 1, None),
        ("mcp_server.updated", m, 2, None),
        ("mcp_server.deleted", m, 3, None),
        ("agent_state.created", f"/v1/threads/{t}/agents/b/state", 1, t),
        ("thread.deleted", f"/v1/threads/{t}", 4, t),
        ("thread.created", f"/v1/threads/{t}", 5, t),
    ]
    seqs = [e["seq"] for e in ours]
    assert seqs == sorted(set(seqs))
    assert all(e["actor"] == "anonymous" and TS.match(e["at"]) for e in ours)
    assert all("thread_id" not in e for e in ours if e["type"].startswith("mcp_server."))


async def test_filters_cursors_and_polling(client: httpx.AsyncClient, uid: str) -> None:
    _, start = await drain(client)
    empty = await client.get("/v1/events", params={"cursor": start})
    assert empty.json() == {"data": [], "next_cursor": start, "has_more": False}

    for i in range(3):
        await client.put(f"/v1/threads/f{i}-{uid}/agents/x/state", json={"state": {}})
    everything, now = await drain(client, start)
    assert len(everything) == 6

    by_thread, _ = await drain(client, start, thread_id=f"f1-{uid}")
    assert [e["type"] for e in by_thread] == ["thread.created", "agent_state.created"]
    created, _ = await drain(client, start, type=["agent_state.created"])
    assert [e["thread_id"] for e in created] == [f"f{i}-{uid}" for i in range(3)]
    both, _ = await drain(client, start, type=["agent_state.created", "thread.created"])
    assert both == everything

    first_seq = everything[0]["seq"]
    after = await client.get("/v1/events", params={"after": first_seq, "limit": 2})
    assert [e["seq"] for e in after.json()["data"]] == [e["seq"] for e in everything[1:3]]
    assert after.json()["has_more"] is True and 'rel="next"' in after.headers["link"]
    rest, _ = await drain(client, after.json()["next_cursor"])
    assert rest == everything[3:], "a page never repeats or skips an event"
    wins = await client.get("/v1/events", params={"cursor": now, "after": 0})
    assert wins.json()["data"] == [] and wins.json()["next_cursor"] == now, "cursor wins"

    filtered_empty = await client.get("/v1/events", params={"cursor": now,
                                                            "thread_id": f"none-{uid}"})
    assert filtered_empty.json()["next_cursor"] == now
    await client.put(f"/v1/threads/f9-{uid}", json={"state": {}})
    polled, _ = await drain(client, now)
    assert [e["resource"] for e in polled] == [f"/v1/threads/f9-{uid}"], \
        "polling with the last cursor gets exactly what was committed since"

    for params, status in [({"cursor": "nope"}, 400), ({"after": -1}, 422),
                           ({"type": "thread.exploded"}, 422), ({"limit": 0}, 422),
                           ({"thread_id": "a b"}, 422)]:
        r = await client.get("/v1/events", params=params)
        assert r.status_code == status, (params, r.text)
        assert r.headers["content-type"] == "application/problem+json"


WRITERS = 24
WRITES = 8


@pytest.mark.slow
async def test_poller_sees_every_event_once_under_concurrent_writers(
        database_url: str, uid: str) -> None:
    """Writers on two server processes; a poller following next_cursor meanwhile ends up
    with exactly the log, each event once, seqs strictly increasing (no gap is skipped
    because an event with a smaller seq committed late)."""
    with ServerProcess(database_url) as one, ServerProcess(database_url) as two:
        limits = httpx.Limits(max_connections=WRITERS)
        clients = [httpx.AsyncClient(base_url=s.base_url, limits=limits, timeout=60)
                   for s in (one, two)]
        try:
            poll_client = clients[0]
            _, start = await drain(poll_client)
            done = asyncio.Event()

            async def writer(i: int) -> None:
                client = clients[i % 2]
                for j in range(WRITES):
                    r = await client.put(f"/v1/threads/p{i}-{uid}/agents/a{j}/state",
                                         json={"state": {"j": j}})
                    assert r.status_code == 201, r.text

            async def poller() -> list[dict]:
                seen: list[dict] = []
                cursor = start
                while True:
                    finished = done.is_set()
                    page = await poll_client.get("/v1/events",
                                                 params={"cursor": cursor, "limit": 7})
                    body = page.json()
                    seen += body["data"]
                    cursor = body["next_cursor"]
                    if finished and not body["has_more"]:
                        return seen
                    if not body["data"]:
                        await asyncio.sleep(0.005)

            async def writers() -> None:
                await asyncio.gather(*(writer(i) for i in range(WRITERS)))
                done.set()

            seen, _ = await asyncio.gather(poller(), writers())
            truth, _ = await drain(poll_client, start)
        finally:
            await asyncio.gather(*(c.aclose() for c in clients))
        assert "Traceback" not in one.logs() + two.logs()

    assert len(truth) == WRITERS * (WRITES + 1), "one thread.created per thread, one per state"
    seqs = [e["seq"] for e in seen]
    assert all(a < b for a, b in itertools.pairwise(seqs)), "strictly increasing, never repeated"
    assert seen == truth, "the poller saw exactly the log"


async def test_an_event_committed_late_is_never_skipped(app, client: httpx.AsyncClient,
                                                        database_url: str, uid: str) -> None:
    """The case a poller could miss: transaction A has written its event but not committed,
    while B writes its event and commits. On Postgres B does not wait for A (writers take no
    lock) and a poller sees B's event at once; A's, committed later, is numbered after B's,
    so the poller's cursor (now past B) still gets it: events come in commit order and a late
    commit is never skipped. (SQLite serialises writers: B cannot begin before A commits.)"""
    from app.core.principal import ANONYMOUS, OPEN_TENANT, Principal
    from app.db.unit import UnitOfWork
    from app.events.repository import EventRepository

    principal = Principal(OPEN_TENANT, ANONYMOUS, frozenset())
    _, start = await drain(client)
    a_pid: list[int] = []  # A's Postgres backend
    written = asyncio.Event()

    async def write(name: str, hold: asyncio.Event | None = None) -> None:
        async with app.state.db.write() as connection:
            uow = UnitOfWork(connection, principal, app.state.settings)
            uow.record("thread.updated", f"/v1/threads/{name}", revision=1, thread_id=name)
            await EventRepository(connection, OPEN_TENANT).append(ANONYMOUS, uow.events)
            if hold is not None:
                if connection.dialect.name == "postgresql":
                    a_pid.append((await connection.exec_driver_sql(
                        "SELECT pg_backend_pid()")).scalar_one())
                written.set()
                await hold.wait()
            await connection.commit()

    release = asyncio.Event()
    first = asyncio.create_task(write(f"a-{uid}", release))
    await written.wait()  # A has written its event and holds its transaction open
    second = asyncio.create_task(write(f"b-{uid}"))
    if a_pid:
        await second  # B has committed, A still holds its transaction open
    # On SQLite B cannot even begin while A's transaction is open (one writer at a time:
    # this process's write queue, then BEGIN IMMEDIATE), so it takes its seq after A commits
    # and the order is guaranteed without anything to wait for.
    seen, cursor = await drain(client, start)
    if a_pid:
        assert [e["thread_id"] for e in seen] == [f"b-{uid}"], "B did not wait for A"
    release.set()
    await asyncio.gather(first, second)
    later, _ = await drain(client, cursor)
    committed = [f"b-{uid}", f"a-{uid}"] if a_pid else [f"a-{uid}", f"b-{uid}"]
    assert [e["thread_id"] for e in seen + later] == committed, "commit order, none skipped"


async def sse(client: httpx.AsyncClient, cursor: str | None, **params: object
              ) -> AsyncIterator[tuple[str, dict]]:
    """(id, event) pairs of `GET /v1/events/stream`, resuming after `cursor`."""
    headers = {"Accept": "text/event-stream", **({"Last-Event-ID": cursor} if cursor else {})}
    async with client.stream("GET", "/v1/events/stream", params=params, headers=headers,
                             timeout=httpx.Timeout(60, read=60)) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        event_id: str | None = None
        async for line in response.aiter_lines():
            if line.startswith("id: "):
                event_id = line[4:]
            elif line.startswith("data: "):
                assert event_id is not None
                yield event_id, json.loads(line[6:])


FAULT_WRITERS = 16
FAULT_WRITES = 12


@pytest.mark.slow
async def test_every_acknowledged_write_seen_once_by_a_poller_and_a_watcher_across_a_crash(
        database_url: str, uid: str) -> None:
    """The fault harness: writers on many threads of one tenant across two server processes,
    a long-polling poller and an SSE watcher running, one server killed (SIGKILL) in the
    middle and restarted. Every acknowledged write has exactly one event; the poller and the
    watcher (which resume on the other server when theirs dies) each see every event exactly
    once, in cursor order, and exactly the log."""
    one, two = ServerProcess(database_url), ServerProcess(database_url)
    with one, two:
        servers = (one, two)
        clients = [httpx.AsyncClient(base_url=s.base_url, timeout=30,
                                     limits=httpx.Limits(max_connections=64)) for s in servers]
        try:
            _, start = await drain(clients[1])
            done = asyncio.Event()
            acknowledged: list[str] = []

            async def writer(i: int) -> None:
                for j in range(FAULT_WRITES):
                    path = f"/v1/threads/h{i}-{uid}/agents/a{j}/state"
                    try:
                        r = await clients[(i + j) % 2].put(path, json={"state": {"j": j}})
                    except httpx.TransportError:
                        continue  # the server died: the outcome is unknown, not acknowledged
                    if r.status_code == 201:
                        acknowledged.append(path)
                    else:
                        assert r.status_code == 503, r.text

            async def crash() -> None:
                await eventually(lambda: len(acknowledged) >= FAULT_WRITERS * 3, "writes")
                assert one.process is not None
                one.process.kill()
                one.process.wait()
                await asyncio.to_thread(one.start)

            async def poller() -> list[dict]:
                seen: list[dict] = []
                cursor, k = start, 0
                while True:
                    finished = done.is_set()
                    k += 1
                    try:
                        page = await clients[k % 2].get(
                            "/v1/events", params={"cursor": cursor, "limit": 7, "wait": 2})
                    except httpx.TransportError:
                        continue
                    if page.status_code == 503:
                        continue
                    body = page.json()
                    seen += body["data"]
                    cursor = body["next_cursor"]
                    if finished and not body["data"]:
                        return seen

            watched: list[dict] = []

            async def watcher() -> None:
                cursor: str | None = start
                k = 0
                while True:
                    try:
                        async for event_id, event in sse(clients[k % 2], cursor):
                            watched.append(event)
                            cursor = event_id
                    except httpx.HTTPError:
                        pass
                    k += 1  # resume on the other server, after the last id received

            async def writers() -> None:
                await asyncio.gather(*(writer(i) for i in range(FAULT_WRITERS)), crash())
                done.set()

            watching = asyncio.create_task(watcher())
            polled, _ = await asyncio.gather(poller(), writers())
            truth, _ = await drain(clients[1], start)
            await eventually(lambda: bool(watched) and watched[-1]["seq"] >= truth[-1]["seq"],
                             "the watcher has caught up")
            watching.cancel()
        finally:
            await asyncio.gather(*(c.aclose() for c in clients))
        assert "Traceback" not in two.logs()

    created = [e["resource"] for e in truth if e["type"] == "agent_state.created"]
    assert len(created) == len(set(created)), "no write has two events"
    assert set(acknowledged) <= set(created), "every acknowledged write has its event"
    seqs = [e["seq"] for e in truth]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "the tenant's seqs have no gaps"
    assert polled == truth, "the poller saw every event once, in order"
    assert watched == truth, "the watcher saw every event once, in order"


async def test_long_poll_answers_with_the_event_or_the_same_cursor(
        client: httpx.AsyncClient, uid: str) -> None:
    _, now = await drain(client)
    waiting = asyncio.create_task(client.get(
        "/v1/events", params={"cursor": now, "wait": 30, "thread_id": f"lp-{uid}"}))
    await client.put(f"/v1/threads/other-{uid}", json={"state": {}})
    await client.put(f"/v1/threads/lp-{uid}", json={"state": {}})
    answer = await waiting
    assert answer.status_code == 200, answer.text
    assert [e["resource"] for e in answer.json()["data"]] == [f"/v1/threads/lp-{uid}"]

    quiet = await client.get("/v1/events", params={
        "cursor": answer.json()["next_cursor"], "wait": 0.2, "thread_id": f"lp-{uid}"})
    assert quiet.json() == {"data": [], "next_cursor": answer.json()["next_cursor"],
                            "has_more": False}
    prefixed, _ = await drain(client, now, resource_prefix=f"/v1/threads/lp-{uid}")
    assert [e["resource"] for e in prefixed] == [f"/v1/threads/lp-{uid}"]
    for params in ({"wait": -1}, {"resource_prefix": ""}):
        assert (await client.get("/v1/events", params=params)).status_code == 422
    bad = await client.get("/v1/events/stream", params={"cursor": "nope"},
                           headers={"Accept": "text/event-stream"})
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_cursor"


@pytest.mark.parametrize("accept", [
    "application/json", "text/event-stream;q=0", "*/*, text/event-stream;q=0",
    "text/*;q=0, */*", "*/*;q=0", "text/html, application/problem+json"])
async def test_the_stream_is_refused_only_to_a_client_that_excludes_it(
        client: httpx.AsyncClient, accept: str) -> None:
    """406 when Accept lists only other types or gives text/event-stream (or the range that
    covers it most closely) q=0 (RFC 9110 section 12.5.1). What it accepts is a stream that
    never ends, so it is read from a real server (the next test)."""
    refused = await client.get("/v1/events/stream", headers={"Accept": accept})
    assert refused.status_code == 406, refused.text
    assert refused.json()["code"] == "not_acceptable"
    assert "Accept: text/event-stream" in refused.json()["detail"]


@pytest.mark.slow
def test_httpx_curl_and_eventsource_get_the_stream(database_url: str) -> None:
    """`*/*` (curl, httpx), `text/*`, no Accept at all and EventSource's
    `text/event-stream` all get the stream, its first line `retry:` (curl: the README's
    `curl -N` line, tests/test_docs.py)."""
    with ServerProcess(database_url) as server, httpx.Client(base_url=server.base_url,
                                                             timeout=30) as http:
        for accept in ("*/*", "text/*", None, "", "text/event-stream",
                       "application/json;q=0.9, */*;q=0.1", "TEXT/Event-Stream"):
            request = http.build_request("GET", "/v1/events/stream")
            del request.headers["accept"]
            if accept is not None:
                request.headers["accept"] = accept
            response = http.send(request, stream=True)
            try:
                assert response.status_code == 200, (accept, response.read())
                assert response.headers["content-type"].startswith("text/event-stream")
                assert next(response.iter_lines()) == "retry: 1000", accept
            finally:
                response.close()


async def test_cursors_from_before_the_per_tenant_feed_still_work(
        app, client: httpx.AsyncClient, uid: str) -> None:
    """A cursor handed out before the migration held the table-wide id of the last event
    read; it resumes at the tenant's seq of that event."""
    from app.core.pagination import encode_cursor

    _, start = await drain(client)
    for i in range(3):
        await client.put(f"/v1/threads/old{i}-{uid}", json={"state": {}})
    events, _ = await drain(client, start)
    async with app.state.db.read() as connection:
        ids = (await connection.exec_driver_sql(
            "SELECT id FROM events WHERE resource LIKE '%%old0-" + uid + "'")).scalars().all()
    legacy = encode_cursor("events", [ids[0]])
    rest, _ = await drain(client, legacy)
    assert rest == events[1:]


@pytest.mark.slow
async def test_tenants_have_their_own_feeds_cursors_and_streams(
        secured_client: httpx.AsyncClient, secured_database_url: str, uid: str) -> None:
    """Tenant A's seqs are 1, 2, 3, ... whatever B writes; B's writes never move A's cursor
    or reach A's poll or stream; a stream filters like the list and resumes after
    Last-Event-ID."""
    a = bearer(create_key(secured_database_url, f"a-{uid}"))
    b = bearer(create_key(secured_database_url, f"b-{uid}"))
    for i in range(3):
        await secured_client.put(f"/v1/threads/x{i}", json={"state": {}}, headers=b)
        await secured_client.put(f"/v1/threads/x{i}", json={"state": {}}, headers=a)
        await secured_client.put(f"/v1/threads/x{i}/agents/p/state", json={"state": {}},
                                 headers=b)
    mine = (await secured_client.get("/v1/events", headers=a)).json()
    assert [e["seq"] for e in mine["data"]] == [1, 2, 3]
    theirs = (await secured_client.get("/v1/events", headers=b, params={"limit": 100})).json()
    assert [e["seq"] for e in theirs["data"]] == list(range(1, 7))
    for i in range(5):
        await secured_client.put(f"/v1/threads/y{i}", json={"state": {}}, headers=b)
    again = (await secured_client.get("/v1/events", headers=a,
                                      params={"cursor": mine["next_cursor"]})).json()
    assert again == {"data": [], "next_cursor": mine["next_cursor"], "has_more": False}
    quiet = (await secured_client.get("/v1/events", headers=a, params={
        "cursor": mine["next_cursor"], "wait": 0.5})).json()
    assert quiet["data"] == []

    with ServerProcess(secured_database_url) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            http.headers.update(a)
            await secured_client.put("/v1/threads/x0/agents/q/state", json={"state": {}},
                                     headers=a)
            got: list[tuple[str, dict]] = []
            async for item in sse(http, None, type="agent_state.created",
                                  resource_prefix="/v1/threads/x0/"):
                got.append(item)
                break
            assert [e["resource"] for _, e in got] == ["/v1/threads/x0/agents/q/state"]
            await secured_client.put("/v1/threads/x1/agents/r/state", json={"state": {}},
                                     headers=b)
            await secured_client.put("/v1/threads/x1/agents/r/state", json={"state": {}},
                                     headers=a)
            async for event_id, event in sse(http, got[0][0]):  # resume after Last-Event-ID
                assert event["resource"] == "/v1/threads/x1/agents/r/state"
                assert event["seq"] == 5, "A's fifth event; B's writes took none of A's seqs"
                break


@pytest.mark.postgres_only(reason="a constraint checked only at COMMIT (a deferred trigger)")
async def test_a_commit_that_fails_is_the_answer_and_keeps_nothing(
        app: FastAPI, client: httpx.AsyncClient, database_url: str, uid: str) -> None:
    """A write unit commits when the handler has returned, before the response is sent
    (`DomainRoute`): a commit that fails is the answer, never the handler's 2xx, and nothing
    of the request is kept, its audit event included. A route added to the application
    itself holds its unit the same way."""
    probe = f"commit_probe_{uid}"
    admin = await pg_connect(database_url)
    try:
        await admin.execute(f"""
            CREATE TABLE {probe} (id int);
            CREATE FUNCTION {probe}_refuse() RETURNS trigger LANGUAGE plpgsql AS
              $$ BEGIN RAISE EXCEPTION 'refused at commit'; END $$;
            CREATE CONSTRAINT TRIGGER {probe}_at_commit AFTER INSERT ON {probe}
              DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {probe}_refuse();""")

        async def doomed(uow: Writer) -> dict[str, bool]:
            await ThreadService(uow).create(ThreadCreate(thread_id=f"t-{uid}"))
            await uow.connection.execute(text(f"INSERT INTO {probe} VALUES (1)"))
            return {"handled": True}  # the statements succeeded; the commit will not

        app.add_api_route(f"/v1/doomed-{uid}", doomed, methods=["POST"])
        _, start = await drain(client)
        answering = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
            base_url="http://agentstate.test")
        async with answering:
            answer = await answering.post(f"/v1/doomed-{uid}")
        assert answer.status_code >= 500, answer.text
        assert answer.headers["content-type"] == "application/problem+json"
        assert "handled" not in answer.text and "refused" not in answer.text
        assert (await client.get(f"/v1/threads/t-{uid}")).status_code == 404
        events, _ = await drain(client, start)
        assert [e for e in events if e["thread_id"] == f"t-{uid}"] == []
        assert await admin.fetchval(f"SELECT count(*) FROM {probe}") == 0
    finally:
        await admin.execute(f"DROP TABLE IF EXISTS {probe}; "
                            f"DROP FUNCTION IF EXISTS {probe}_refuse()")
        await admin.close()
