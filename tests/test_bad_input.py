"""No 500 for anything a client can send: every kind of malformed or hostile input, on both
backends, answers its declared 4xx (or 503 where the database is at fault) as
`application/problem+json` with an `X-Request-ID`, and writes nothing (read back through the
API and `/v1/events`). Through a real `agentstate serve`, the keep-alive connection a bad
request came on stays usable, 500s included.

Decisions these tests encode:
- A timestamp without a UTC offset (`updated_after=2026-01-01`, `...T00:00:00`) is a 422 naming
  the parameter, not read as UTC: every timestamp agentstate writes carries its offset (`Z`),
  RFC 3339 requires one, the request bodies already refuse naive times (`last_connected_at`
  is an AwareDatetime), and guessing UTC would silently shift a client that meant local time.
- A timestamp that has no UTC equivalent within years 1-9999 (`9999-12-31T23:59:59-14:00`) is a
  422 as well, in a query or in a body.
- An `If-Match` tag that cannot be a revision (beyond int64, 5,000 digits, a non-ASCII digit
  such as "²") is a well-formed entity tag that names no current revision: 412, like any other
  stale tag. A header with more tags than any client needs (40,000) is a 400 `invalid_header`:
  the request is malformed, and the database is not at fault (never a 503 that invites retries).
- Integers beyond int64 in a query parameter (`after=`) or a body member are 422; inside a
  cursor they make the cursor one we never handed out: 400 `invalid_cursor`.
- JSON in query parameters (`?metadata=`, `?state_contains=`) follows the body rules: NaN,
  numbers outside double range, U+0000, unpaired surrogates and nesting deeper than
  `max_json_depth` are 422.
- A path over 8 KiB is 414 `uri_too_long`; `a%2Fb` and trailing slashes are 404, never a
  307 redirect.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.client
import json
import sqlite3
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.engine import make_url

from app.core.settings import Settings
from tests.conftest import migrated_database, running
from tests.support import ServerProcess

pytestmark = pytest.mark.anyio

INT64_OVER = 2**63  # 9223372036854775808, one past the largest int64
PROBLEM_KEYS = {"type", "title", "status", "detail", "instance", "code"}


def cursor(kind: str, *values: Any) -> str:
    """A cursor as the server encodes one (base64url of a JSON array), with chosen values."""
    raw = json.dumps([kind, *values], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def assert_problem(response: httpx.Response, status: int, code: str | None = None) -> dict:
    where = (f"{response.status_code} {response.headers.get('content-type')} for "
             f"{response.request.method} {str(response.request.url)[:120]}: {response.text[:300]}")
    assert response.status_code == status, where
    assert response.headers.get("content-type") == "application/problem+json", where
    assert response.headers.get("x-request-id"), where
    body = response.json()
    assert PROBLEM_KEYS <= body.keys() and body["status"] == status, where
    assert "Traceback" not in response.text, where
    if code is not None:
        assert body["code"] == code, where
    return body


@pytest.fixture
async def lenient(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client that sees a 500 as a real client would (a response), not as an exception."""
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://agentstate.test") as c:
        yield c


# --- the table ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """One bad request. `{t}` in the path is a seeded thread (revision 1, messages m1 and m2),
    `{new}` a name nothing uses."""

    id: str
    method: str
    path: str
    status: int
    code: str | None = None
    params: Any = None
    headers: Any = None
    json: Any = None
    content: bytes | None = None
    body_fn: Callable[[], bytes] | None = field(default=None, compare=False)


def _query_json_cases() -> list[Case]:
    # 1,000 levels that fit in a request URI (8 KiB, beyond it is 414): arrays inside the
    # object, `[` being 3 bytes percent-encoded where `{"a":` is 13.
    deep = '{"a":' + "[" * 999 + "]" * 999 + "}"
    values = {
        "nul": '{"a":"\\u0000"}',
        "nan": '{"a":NaN}',
        "1e400": '{"a":1e400}',
        "lone-surrogate": '{"a":"\\ud800"}',
        "1000-deep": deep,
    }
    cases = []
    for path, name in (("/v1/threads", "metadata"), ("/v1/agent-states", "state_contains")):
        for label, raw in values.items():
            cases.append(Case(f"{name}-{label}", "GET", path, 422, params={name: raw}))
    return cases


def _many_tags() -> str:
    return ", ".join(f'"{i}"' for i in range(40_000))


def _nested_metadata() -> bytes:
    inner = ",".join(f'"k{i}":1' for i in range(60_000))
    return f'{{"thread_id":"{{new}}","metadata":{{"a":{{{inner}}}}}}}'.encode()


COMPACTION = {"source_message_ids": ["m1", "m2"], "summary": {"role": "system", "content": "s"}}
HUGE_TAG = '"99999999999999999999"'

CASES: list[Case] = [
    # Timestamps without an offset, or with no UTC equivalent.
    Case("updated_after-date-only", "GET", "/v1/threads", 422,
         params={"updated_after": "2026-01-01"}),
    Case("updated_after-naive", "GET", "/v1/threads", 422,
         params={"updated_after": "2026-01-01T00:00:00"}),
    Case("updated_after-overflow", "GET", "/v1/threads", 422,
         params={"updated_after": "9999-12-31T23:59:59-14:00"}),
    Case("updated_after-underflow", "GET", "/v1/threads", 422,
         params={"updated_after": "0001-01-01T00:00:00+14:00"}),
    Case("mcp-last_connected_at-underflow", "PUT", "/v1/mcp-servers/{new}", 422,
         headers={"If-None-Match": "*"},
         json={"server_type": "broker", "last_connected_at": "0001-01-01T00:00:00+14:00"}),
    Case("mcp-last_connected_at-overflow", "PUT", "/v1/mcp-servers/{new}", 422,
         headers={"If-None-Match": "*"},
         json={"server_type": "broker", "last_connected_at": "9999-12-31T23:59:59-14:00"}),
    # Integers beyond int64.
    Case("thread-put-if-match-int64", "PUT", "/v1/threads/{t}", 412, "revision_mismatch",
         headers={"If-Match": HUGE_TAG}, json={"state": {"x": 1}}),
    Case("messages-post-if-match-int64", "POST", "/v1/threads/{t}/messages", 412,
         "revision_mismatch", headers={"If-Match": HUGE_TAG},
         json={"role": "user", "content": "hi"}),
    Case("compactions-post-if-match-int64", "POST", "/v1/threads/{t}/compactions", 412,
         "revision_mismatch", headers={"If-Match": HUGE_TAG}, json=COMPACTION),
    Case("thread-patch-if-match-int64", "PATCH", "/v1/threads/{t}", 412, "revision_mismatch",
         headers={"If-Match": HUGE_TAG, "Content-Type": "application/merge-patch+json"},
         content=b'{"state": {"x": 1}}'),
    Case("thread-delete-if-match-int64", "DELETE", "/v1/threads/{t}", 412, "revision_mismatch",
         headers={"If-Match": HUGE_TAG}),
    Case("agent-state-put-if-match-int64", "PUT", "/v1/threads/{t}/agents/{new}/state", 412,
         "revision_mismatch", headers={"If-Match": HUGE_TAG}, json={"state": {}}),
    Case("mcp-put-if-match-int64", "PUT", "/v1/mcp-servers/{new}", 412, "revision_mismatch",
         headers={"If-Match": HUGE_TAG}, json={"server_type": "broker"}),
    Case("events-after-int64", "GET", "/v1/events", 422, params={"after": str(INT64_OVER)}),
    Case("events-cursor-int64", "GET", "/v1/events", 400, "invalid_cursor",
         params={"cursor": cursor("events", INT64_OVER)}),
    Case("compactions-cursor-int64", "GET", "/v1/threads/{t}/compactions", 400,
         "invalid_cursor", params={"cursor": cursor("compactions", INT64_OVER)}),
    Case("messages-cursor-int64", "GET", "/v1/threads/{t}/messages", 400, "invalid_cursor",
         params={"cursor": cursor("messages", INT64_OVER, 1)}),
    Case("revisions-cursor-int64", "GET", "/v1/threads/{t}/revisions", 400, "invalid_cursor",
         params={"cursor": cursor("revisions", INT64_OVER)}),
    Case("revision-path-int64", "GET", f"/v1/threads/{{t}}/revisions/{INT64_OVER}", 422),
    Case("fork-revision-int64", "POST", "/v1/threads/{t}/fork", 422,
         content=f'{{"thread_id": "{{new}}", "revision": {INT64_OVER}}}'.encode()),
    Case("compaction-input_token_count-int64", "POST", "/v1/threads/{t}/compactions", 422,
         json={**COMPACTION, "input_token_count": INT64_OVER}),
    Case("compaction-output_token_count-int64", "POST", "/v1/threads/{t}/compactions", 422,
         json={**COMPACTION, "output_token_count": INT64_OVER}),
    # Entity tags that are not revisions, and far too many of them.
    Case("if-match-superscript-two", "PUT", "/v1/threads/{t}", 412, "revision_mismatch",
         headers={"If-Match": b'"\xb2"'}, json={"state": {"x": 1}}),
    Case("if-match-5000-digits", "PUT", "/v1/threads/{t}", 412, "revision_mismatch",
         headers={"If-Match": '"' + "9" * 5000 + '"'}, json={"state": {"x": 1}}),
    Case("if-match-40000-tags", "PUT", "/v1/threads/{t}", 400, "invalid_header",
         headers={"If-Match": _many_tags()}, json={"state": {"x": 1}}),
    # Numbers outside double range in bodies.
    Case("body-1e400-thread", "POST", "/v1/threads", 422,
         content=b'{"thread_id": "{new}", "state": {"a": 1e400}}'),
    Case("body-minus-1e400-message-metadata", "POST", "/v1/threads/{t}/messages", 422,
         content=b'{"role": "user", "content": "x", "metadata": {"a": -1e400}}'),
    Case("body-1e400-agent-state", "PUT", "/v1/threads/{t}/agents/{new}/state", 422,
         headers={"If-None-Match": "*"}, content=b'{"state": {"a": [1e400]}}'),
    # JSON in query parameters gets the body rules.
    *_query_json_cases(),
    # NUL in string parameters.
    Case("messages-agent_name-nul", "GET", "/v1/threads/{t}/messages", 422,
         params={"agent_name": "a\x00b"}),
    Case("agent-states-agent_name-nul", "GET", "/v1/agent-states", 422,
         params={"agent_name": "a\x00b"}),
    Case("events-thread_id-nul", "GET", "/v1/events", 422, params={"thread_id": "a\x00b"}),
    # Tampered cursors.
    Case("threads-cursor-naive-timestamp", "GET", "/v1/threads", 400, "invalid_cursor",
         params={"cursor": cursor("threads", "2026-01-01T00:00:00", "x")}),
    Case("threads-cursor-overflowing-timestamp", "GET", "/v1/threads", 400, "invalid_cursor",
         params={"cursor": cursor("threads", "9999-12-31T23:59:59-14:00", "x")}),
    # Cheap abuse: the metadata key limit counts nested keys too.
    Case("metadata-60000-nested-keys", "POST", "/v1/threads", 422, "validation_failed",
         body_fn=_nested_metadata),
    # Routes that do not match.
    Case("path-encoded-slash", "GET", "/v1/threads/a%2Fb", 404),
    Case("path-trailing-slash-collection", "GET", "/v1/threads/", 404),
    Case("path-trailing-slash-item", "GET", "/v1/threads/{t}/", 404),
    # (60,000: httpx refuses longer URLs; 100,000 goes through a real server below.)
    Case("path-60000-characters", "GET", "/v1/threads/" + "x" * 60_000, 414, "uri_too_long"),
]


def _ids(case: Case) -> str:
    return case.id


@dataclass
class Seeded:
    thread: str
    new: str
    last_seq: int

    def fill(self, text: str) -> str:
        return text.replace("{t}", self.thread).replace("{new}", self.new)


async def seed(client: httpx.AsyncClient, uid: str) -> Seeded:
    thread = f"bad-{uid}"
    created = await client.put(
        f"/v1/threads/{thread}", headers={"If-None-Match": "*"},
        json={"state": {"x": 0}, "append_messages": [
            {"id": "m1", "role": "user", "content": "one"},
            {"id": "m2", "role": "assistant", "content": "two"}]},
    )
    assert created.status_code == 201, created.text
    events = (await client.get("/v1/events", params={"thread_id": thread})).json()["data"]
    return Seeded(thread, f"new-{uid}", events[-1]["seq"])


async def snapshot(client: httpx.AsyncClient, seeded: Seeded) -> list[Any]:
    """What the API says about everything a case could have written."""
    t, new = seeded.thread, seeded.new
    paths = [f"/v1/threads/{t}", f"/v1/threads/{t}/messages?view=full&limit=1000",
             f"/v1/threads/{t}/compactions", f"/v1/threads/{t}/agents",
             f"/v1/threads/{new}", f"/v1/mcp-servers/{new}",
             f"/v1/threads/{t}/agents/{new}/state"]
    answers = []
    for path in paths:
        response = await client.get(path)
        answers.append((path, response.status_code, response.text))
    return answers


def request_of(case: Case, seeded: Seeded) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"method": case.method, "url": seeded.fill(case.path)}
    if case.params is not None:
        kwargs["params"] = case.params
    if case.headers is not None:
        kwargs["headers"] = case.headers
    if case.json is not None:
        kwargs["json"] = case.json
    raw = case.body_fn() if case.body_fn is not None else case.content
    if raw is not None:
        kwargs["content"] = seeded.fill(raw.decode()).encode()
        kwargs["headers"] = {"Content-Type": "application/json", **(case.headers or {})}
    return kwargs


@pytest.mark.parametrize("case", CASES, ids=_ids)
async def test_bad_input(lenient: httpx.AsyncClient, backend: str, uid: str, case: Case,
                         request: pytest.FixtureRequest) -> None:
    seeded = await seed(lenient, uid)
    before = await snapshot(lenient, seeded)

    response = await lenient.request(**request_of(case, seeded))
    assert_problem(response, case.status, case.code)

    assert await snapshot(lenient, seeded) == before, "the bad request changed something"
    events = await lenient.get("/v1/events", params={"after": seeded.last_seq})
    assert events.status_code == 200, events.text
    # The tenant's feed is shared with the other tests on this database, whose expired items
    # any running server's sweeper may remove meanwhile (actor "retention"); anything else
    # after the seed was written by this request.
    written = [e for e in events.json()["data"] if e["actor"] != "retention"]
    assert written == [], events.text


# --- the database at fault: a statement cancelled by the database's timeout -----------------

@contextlib.asynccontextmanager
async def row_locked(database_url: str, thread_id: str) -> AsyncIterator[None]:
    """A stalled peer: holds the thread's row lock (Postgres) or the write lock (SQLite)."""
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        connection = sqlite3.connect(url.database, isolation_level=None)
        connection.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            connection.rollback()
            connection.close()
        return
    import asyncpg

    connection = await asyncpg.connect(host=url.host, port=url.port or 5432, user=url.username,
                                       password=url.password, database=url.database)
    try:
        async with connection.transaction():
            locked = await connection.fetch(
                "SELECT id FROM threads WHERE tenant_id = 'default' AND thread_id = $1 FOR UPDATE",
                thread_id)
            assert len(locked) == 1
            yield
    finally:
        await connection.close()


async def test_statement_cancelled_by_timeout_is_503(database_url: str, backend: str, uid: str,
                                                     request: pytest.FixtureRequest) -> None:
    """A write waiting on a lock held by a stalled peer, past the database's timeout
    (`statement_timeout` on Postgres, SQLSTATE 57014; the busy timeout on SQLite): 503 with
    Retry-After, and nothing written."""
    settings = Settings(database_url=database_url, auto_migrate=False, _env_file=None,  # type: ignore[call-arg]
                        statement_timeout_ms=1000, sqlite_busy_timeout_ms=1000)
    thread = f"locked-{uid}"
    async with running(settings) as application:
        transport = httpx.ASGITransport(app=application, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://agentstate.test") as c:
            seeded = await c.put(f"/v1/threads/{thread}", json={"state": {"v": 1}},
                                 headers={"If-None-Match": "*"})
            assert seeded.status_code == 201, seeded.text
            (last,) = (await c.get("/v1/events", params={"thread_id": thread})).json()["data"]
            async with row_locked(database_url, thread):
                blocked = await c.put(f"/v1/threads/{thread}", json={"state": {"v": 2}},
                                      headers={"If-Match": '"1"'})
                appended = await c.post(f"/v1/threads/{thread}/messages",
                                        json={"role": "user", "content": "late"})
            for response in (blocked, appended):
                assert_problem(response, 503)
                assert response.headers.get("retry-after", "").isdigit(), response.headers
            after = await c.get(f"/v1/threads/{thread}")
            assert after.json()["revision"] == 1 and after.json()["state"] == {"v": 1}
            assert after.json()["message_count"] == 0
            events = await c.get("/v1/events", params={"after": last["seq"]})
            assert events.json()["data"] == []


# --- cheap abuse: a page is capped in bytes as well as rows ----------------------------------

async def test_pages_are_capped_in_bytes(database_url: str, backend: str, uid: str,
                                         request: pytest.FixtureRequest) -> None:
    """40 x 1 MB messages must not make a 40 MB page: `max_page_bytes` ends a page early with
    a cursor (at least one item per page, so a single large item is still readable)."""
    settings = Settings(database_url=database_url, auto_migrate=False, _env_file=None,  # type: ignore[call-arg]
                        max_page_bytes=600_000)
    thread = f"bytes-{uid}"
    async with running(settings) as application:
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://agentstate.test") as c:
            for batch in range(3):
                messages = [{"id": f"m{batch}-{i}", "role": "user", "content": "x" * 300_000}
                            for i in range(3)]
                appended = await c.post(f"/v1/threads/{thread}/messages",
                                        json={"messages": messages})
                assert appended.status_code == 201, appended.text
            seen: list[str] = []
            page_cursor = None
            for _ in range(20):
                params = {"limit": 1000, **({"cursor": page_cursor} if page_cursor else {})}
                page = await c.get(f"/v1/threads/{thread}/messages", params=params)
                assert page.status_code == 200
                assert len(page.content) <= 600_000 + 300_100, "over the cap by more than one item"
                body = page.json()
                assert body["data"], "every page carries at least one item"
                seen += [m["id"] for m in body["data"]]
                if not body["has_more"]:
                    break
                page_cursor = body["next_cursor"]
            assert len(seen) == 9 and len(set(seen)) == 9
            assert len(page.content) < 9 * 300_000


async def test_threads_listed_with_messages_share_one_byte_budget(
        database_url: str, uid: str) -> None:
    """Two threads of 3 x 300 kB messages listed with `include=messages`: their messages
    together within `max_page_bytes` (the first takes two, the second, with the budget spent,
    its one message), every thread readable to its end from the cursor it came with."""
    settings = Settings(database_url=database_url, auto_migrate=False, _env_file=None,  # type: ignore[call-arg]
                        max_page_bytes=700_000)
    threads = [f"shared-{uid}-{n}" for n in range(2)]
    async with running(settings) as application:
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://agentstate.test") as c:
            for thread in threads:
                messages = [{"id": f"m{i}", "role": "user", "content": "x" * 300_000}
                            for i in range(3)]
                put = await c.put(f"/v1/threads/{thread}",
                                  json={"state": {}, "append_messages": messages})
                assert put.status_code == 201, put.text
            listed = await c.get("/v1/threads", params={
                "thread_id": threads, "include": "messages", "messages_limit": 1000})
            assert listed.status_code == 200, listed.text
            assert len(listed.content) < 700_000 + 301_000
            assert [len(item["messages"]) for item in listed.json()["data"]] == [2, 1]
            for item in listed.json()["data"]:
                seen = [m["id"] for m in item["messages"]]
                cursor = item["messages_next_cursor"]
                while cursor is not None:
                    page = (await c.get(f"/v1/threads/{item['thread_id']}/messages",
                                        params={"cursor": cursor, "limit": 1000})).json()
                    seen += [m["id"] for m in page["data"]]
                    cursor = page["next_cursor"]
                assert seen == ["m0", "m1", "m2"]


# --- the error path through a real server: X-Request-ID, problem+json, keep-alive ------------

def corrupt_state(database_url: str, thread_id: str) -> None:
    """Store the thread's agent states' `state` as a value that is not an object, as no
    request can: reading one then fails inside the application, in its model (a stand-in
    for any bug), an unhandled error. (A thread's own state is sent as stored, unparsed.)"""
    url = make_url(database_url)
    sql = ("UPDATE agent_states SET state = '\"corrupt\"' WHERE tenant_id = 'default' "
           "AND thread_id = ")
    if url.get_backend_name() == "sqlite":
        connection = sqlite3.connect(url.database, isolation_level=None)
        try:
            assert connection.execute(sql + "?", (thread_id,)).rowcount == 1
        finally:
            connection.close()
        return

    async def run() -> None:
        import asyncpg

        connection = await asyncpg.connect(host=url.host, port=url.port or 5432,
                                           user=url.username, password=url.password,
                                           database=url.database)
        try:
            assert await connection.execute(sql + "$1", thread_id) == "UPDATE 1"
        finally:
            await connection.close()

    asyncio.run(run())


def exchange(connection: http.client.HTTPConnection, method: str, path: str,
             body: bytes | None = None, headers: dict[str, str] | None = None
             ) -> tuple[int, dict[str, str], bytes]:
    headers = {"Content-Type": "application/json", **(headers or {})} if body else headers or {}
    connection.request(method, path, body=body, headers=headers)
    response = connection.getresponse()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()


@pytest.mark.slow
def test_unhandled_error_keeps_the_connection_usable(
        backend: str, tmp_path_factory: pytest.TempPathFactory,
        request: pytest.FixtureRequest) -> None:
    """Through a real `agentstate serve` (a database of its own, since one row is corrupted):
    an unhandled error answers 500 problem+json with an X-Request-ID, and the keep-alive
    connection it came on serves the next request, or the 500 said `Connection: close`
    (http.client then opens a new one; a connection dropped without a word fails here).
    Bad input that answered 500 before leaves the connection usable too."""
    with migrated_database(backend, tmp_path_factory) as url, ServerProcess(url) as server:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        state = "/v1/threads/explode/agents/a/state"
        status, _, body = exchange(connection, "PUT", state, b'{"state": {}}',
                                   {"If-None-Match": "*"})
        assert status == 201, body
        corrupt_state(url, "explode")
        errors = []
        for _ in range(5):
            errors.append(exchange(connection, "GET", state))
            status, _, body = exchange(connection, "GET", "/healthz")
            assert status == 200, body
        for status, headers, body in errors:
            assert status == 500, body
            assert headers.get("content-type") == "application/problem+json", headers
            assert headers.get("x-request-id"), headers
            assert json.loads(body)["code"] == "internal_error"
        for raw in ('"99999999999999999999"', '"' + "9" * 5000 + '"'):
            status, headers, body = exchange(connection, "PUT", "/v1/threads/keepalive",
                                             b'{"state": {}}', {"If-Match": raw})
            assert status == 412 and headers.get("x-request-id"), body
            status, _, _ = exchange(connection, "GET", "/healthz")
            assert status == 200
        connection.close()


@pytest.mark.slow
def test_unmatched_routes_through_a_real_server(database_url: str, backend: str,
                                               request: pytest.FixtureRequest) -> None:
    """What uvicorn hands the application is answered as problem+json: a long path is 414,
    a trailing slash 404 (no redirect built from the Host header). A request line past
    uvicorn's own parser limit (100,000 characters) never reaches the application: uvicorn
    answers 400 in plain text and closes; that is accepted here, a 5xx or a hang is not."""
    # Any Host: an open server answers only loopback names otherwise (DNS rebinding).
    with ServerProcess(database_url, env={"AGENTSTATE_ALLOWED_HOSTS": "*"}) as server:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        status, headers, _ = exchange(connection, "GET", "/v1/threads/" + "x" * 100_000)
        assert status in (400, 414) and headers.get("connection") == "close", (status, headers)
        for path, expected in (("/v1/threads/" + "x" * 10_000, 414), ("/v1/threads/", 404),
                               ("/v1/threads/a%2Fb", 404)):
            status, headers, _ = exchange(connection, "GET", path, headers={"Host": "evil"})
            assert status == expected, (path[:40], status, headers)
            assert headers.get("content-type") == "application/problem+json", headers
            assert headers.get("x-request-id") and "location" not in headers, headers
        connection.close()
