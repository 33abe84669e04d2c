"""HTTP semantics (RFC 9110, RFC 5789) every path keeps, on both backends.

- HEAD, OPTIONS and the `Allow` of a 405 are checked on every path of the application: the
  paths come from the app's routes (through its OpenAPI document, plus the routes the document
  leaves out), so an endpoint added later is covered without touching this file.
- `If-Match` sent as several header lines is one list (RFC 9110 section 5.3); comparison is
  strong and exact (`"01"` is not revision 1); on PUT, `If-Match` and `If-None-Match` are
  evaluated in the order of section 13.2.2; on GET, `If-Match` is honoured (412).
- A body without `Content-Type`, or a JSON Patch on PATCH, is 415, and PATCH advertises
  `Accept-Patch` (RFC 5789 section 3.1).
- On a server with keys, 401 comes before anything is said about the body; several
  `Authorization` headers are a 400, never first-wins.
- `Link` is a relative reference, or built on the configured `public_base_url`; never on the
  client's `Host` header.

Decision on write-only keys: `write` implies `read`. A conditional write needs the revision it
replaces and every write answers with the representation, so a key that may write can read
what it writes anyway (today through `PATCH {}`); the scope ladder says so instead of leaking.
A write-only key's GET is therefore 200.

"""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from starlette.routing import Route

from app.core.settings import Settings
from app.main import create_app
from tests.conftest import http_client, running
from tests.support import bearer, create_key

pytestmark = pytest.mark.anyio

METHODS = ("GET", "PUT", "PATCH", "POST", "DELETE")
MERGE_PATCH = "application/merge-patch+json"


def assert_problem(response: httpx.Response, status: int) -> dict[str, Any]:
    where = (response.request.method, str(response.request.url)[:120], response.status_code,
             dict(response.headers), response.text[:300])
    assert response.status_code == status, where
    assert response.headers.get("content-type") == "application/problem+json", where
    assert response.headers.get("x-request-id"), where
    return response.json()


def allow_of(response: httpx.Response) -> set[str]:
    return {m.strip() for m in response.headers.get("allow", "").split(",") if m.strip()}


# --- the paths of the application -----------------------------------------------------------

def route_methods() -> dict[str, frozenset[str]]:
    """Every path template of the app and the methods its routes declare."""
    app = create_app(Settings(database_url="sqlite+aiosqlite:///:memory:",  # type: ignore[call-arg]
                              auto_migrate=False, _env_file=None))
    methods: dict[str, set[str]] = defaultdict(set)
    for path, item in app.openapi()["paths"].items():
        methods[path] |= {method.upper() for method in item if method.upper() in METHODS}
    for route in app.routes:  # those the document leaves out: /openapi.json, /docs, ...
        if isinstance(route, Route) and not route.include_in_schema:
            methods[route.path] |= set(route.methods or ()) - {"HEAD"}
    return {path: frozenset(found) for path, found in sorted(methods.items())}


ROUTES = route_methods()
GET_PATHS = [path for path, methods in ROUTES.items() if "GET" in methods]


def expected_allow(path: str) -> set[str]:
    methods = set(ROUTES[path])
    if "GET" in methods:
        methods.add("HEAD")
    return methods | {"OPTIONS"}


@dataclass
class Seeded:
    thread: str
    compactions: list[str]
    values: dict[str, str]

    def url(self, template: str) -> str:
        for name, value in self.values.items():
            template = template.replace("{" + name + "}", value)
        return template


async def seed(client: httpx.AsyncClient, uid: str, *, thread: bool = True, messages: int = 5,
               compactions: int = 2, agents: int = 2, servers: int = 2,
               history: bool = False) -> Seeded:
    """Resources at known names: by default two of everything that lists."""
    thread_id = f"sem-{uid}"
    if thread:
        created = await client.put(
            f"/v1/threads/{thread_id}", headers={"If-None-Match": "*"}, json={
                "state": {"n": 0}, "append_messages": [
                    {"id": f"m{i}", "role": "user", "content": f"message {i}"}
                    for i in range(1, messages + 1)]})
        assert created.status_code == 201, created.text
        if history:  # a second kept revision of the state
            patched = await client.patch(f"/v1/threads/{thread_id}", json={"state": {"n": 1}},
                                         headers={"If-Match": '"1"'})
            assert patched.status_code == 200, patched.text
        sibling = await client.put(f"/v1/threads/{thread_id}-2", headers={"If-None-Match": "*"},
                                   json={"state": {}})  # the thread list's second
        assert sibling.status_code == 201, sibling.text
    made = []
    for source in ("m1", "m2")[:compactions]:
        done = await client.post(f"/v1/threads/{thread_id}/compactions", json={
            "source_message_ids": [source], "summary": {"role": "system", "content": "s"}})
        assert done.status_code == 201, done.text
        made.append(done.json()["id"])
    for agent in ("a1", "a2")[:agents]:
        state = await client.put(f"/v1/threads/{thread_id}/agents/{agent}/state",
                                 headers={"If-None-Match": "*"}, json={"state": {"k": agent}})
        assert state.status_code == 201, state.text
    for server in (f"s1-{uid}", f"s2-{uid}")[:servers]:
        put = await client.put(f"/v1/mcp-servers/{server}", headers={"If-None-Match": "*"},
                               json={"server_type": "broker", "state": {}})
        assert put.status_code == 201, put.text
    return Seeded(thread_id, made, {
        "thread_id": thread_id, "revision": "1", "message_id": "m4",
        "compaction_id": made[-1] if made else "none",
        "agent_name": "a1", "server_name": f"s1-{uid}"})


@pytest.fixture(scope="module")
async def seeded(database_url: str) -> Seeded:
    """One seed per backend for the tests that only read, or are refused before anything."""
    settings = Settings(database_url=database_url, auto_migrate=False,  # type: ignore[call-arg]
                        _env_file=None)
    async with running(settings) as application, http_client(application) as client:
        return await seed(client, uuid.uuid4().hex[:12], history=True)


def comparable(response: httpx.Response, path: str) -> dict[str, str]:
    ignored = {"date", "x-request-id"} | ({"content-length"} if path == "/metrics" else set())
    return {k: v for k, v in response.headers.items() if k not in ignored}


@pytest.mark.parametrize("path", GET_PATHS)
async def test_head_answers_like_get(client: httpx.AsyncClient, seeded: Seeded, path: str,
                                     request: pytest.FixtureRequest) -> None:
    url = seeded.url(path)
    # The stream answers `*/*` and never ends in process: ask for what it refuses, so GET
    # and HEAD both end (in a 406) and are still compared.
    headers = {"Accept": "application/json"} if path == "/v1/events/stream" else None
    get = await client.get(url, headers=headers)
    head = await client.head(url, headers=headers)
    assert head.status_code == get.status_code, (url, head.status_code, head.text)
    assert head.content == b""
    assert comparable(head, path) == comparable(get, path)


@pytest.mark.parametrize("path", list(ROUTES))
async def test_options_lists_allow(client: httpx.AsyncClient, seeded: Seeded, path: str,
                                   request: pytest.FixtureRequest) -> None:
    response = await client.options(seeded.url(path))
    assert response.status_code == 204, response.text
    assert response.content == b""
    assert allow_of(response) == expected_allow(path)
    if "PATCH" in ROUTES[path]:
        assert MERGE_PATCH in response.headers.get("accept-patch", "")


@pytest.mark.parametrize("path", list(ROUTES))
async def test_405_carries_the_full_allow(client: httpx.AsyncClient, seeded: Seeded, path: str,
                                          request: pytest.FixtureRequest) -> None:
    method = next(m for m in ("POST", "PUT", "PATCH", "DELETE") if m not in ROUTES[path])
    response = await client.request(method, seeded.url(path))
    assert_problem(response, 405)
    assert allow_of(response) == expected_allow(path)


@pytest.mark.parametrize("path", list(ROUTES))
async def test_trailing_slash_is_404_not_a_redirect(client: httpx.AsyncClient, seeded: Seeded,
                                                    path: str,
                                                    request: pytest.FixtureRequest) -> None:
    response = await client.get(seeded.url(path) + "/")
    assert_problem(response, 404)
    assert "location" not in response.headers


# --- conditional requests -------------------------------------------------------------------

@dataclass(frozen=True)
class Write:
    """A write that takes If-Match. `of` names whose revision it is: the thread's, the agent
    state's or the MCP server's."""

    id: str
    method: str
    path: str
    of: str
    body: bytes | None = None
    content_type: str = "application/json"


WRITES = [
    Write("put-thread", "PUT", "/v1/threads/{thread_id}", "thread", b'{"state": {"n": 1}}'),
    Write("patch-thread", "PATCH", "/v1/threads/{thread_id}", "thread", b'{"state": {"n": 1}}',
          MERGE_PATCH),
    Write("delete-thread", "DELETE", "/v1/threads/{thread_id}", "thread"),
    Write("append-messages", "POST", "/v1/threads/{thread_id}/messages", "thread",
          b'{"role": "user", "content": "more"}'),
    Write("create-compaction", "POST", "/v1/threads/{thread_id}/compactions", "thread",
          b'{"source_message_ids": ["m3"], "summary": {"role": "system", "content": "s"}}'),
    Write("revert-compaction", "DELETE", "/v1/threads/{thread_id}/compactions/{compaction_id}",
          "thread"),
    Write("put-agent-state", "PUT", "/v1/threads/{thread_id}/agents/{agent_name}/state",
          "agent", b'{"state": {"k": 1}}'),
    Write("patch-agent-state", "PATCH", "/v1/threads/{thread_id}/agents/{agent_name}/state",
          "agent", b'{"state": {"k": 1}}', MERGE_PATCH),
    Write("delete-agent-state", "DELETE", "/v1/threads/{thread_id}/agents/{agent_name}/state",
          "agent"),
    Write("put-mcp-server", "PUT", "/v1/mcp-servers/{server_name}", "mcp",
          b'{"server_type": "broker"}'),
    Write("patch-mcp-server", "PATCH", "/v1/mcp-servers/{server_name}", "mcp",
          b'{"state": {"k": 1}}', MERGE_PATCH),
    Write("delete-mcp-server", "DELETE", "/v1/mcp-servers/{server_name}", "mcp"),
]
RESOURCE = {"thread": "/v1/threads/{thread_id}",
            "agent": "/v1/threads/{thread_id}/agents/{agent_name}/state",
            "mcp": "/v1/mcp-servers/{server_name}"}


async def seed_for(client: httpx.AsyncClient, uid: str, of: str) -> Seeded:
    """A seed of its own for a test that writes, with only the resource it writes to."""
    if of == "thread":
        return await seed(client, uid, messages=3, compactions=1, agents=0, servers=0)
    if of == "agent":
        return await seed(client, uid, messages=0, compactions=0, agents=1, servers=0)
    return await seed(client, uid, thread=False, compactions=0, agents=0, servers=1)


async def current(client: httpx.AsyncClient, seeded: Seeded, of: str) -> dict[str, Any]:
    response = await client.get(seeded.url(RESOURCE[of]))
    assert response.status_code == 200, response.text
    return response.json()


async def send(client: httpx.AsyncClient, seeded: Seeded, write: Write,
               headers: list[tuple[str, str]]) -> httpx.Response:
    if write.body is not None:
        headers = [("Content-Type", write.content_type), *headers]
    return await client.request(write.method, seeded.url(write.path), content=write.body,
                                headers=headers)


@pytest.mark.parametrize("write", WRITES, ids=lambda w: w.id)
async def test_strong_comparison_is_exact(client: httpx.AsyncClient, uid: str,
                                          write: Write, request: pytest.FixtureRequest) -> None:
    fresh = await seed_for(client, uid, write.of)
    before = await current(client, fresh, write.of)
    response = await send(client, fresh, write, [("If-Match", f'"0{before["revision"]}"')])
    assert_problem(response, 412)
    assert await current(client, fresh, write.of) == before


@pytest.mark.parametrize("order", ["current-first", "current-last"])
@pytest.mark.parametrize("write", WRITES, ids=lambda w: w.id)
async def test_if_match_lines_are_one_list(client: httpx.AsyncClient, uid: str,
                                           write: Write, order: str,
                                           request: pytest.FixtureRequest) -> None:
    fresh = await seed_for(client, uid, write.of)
    revision = (await current(client, fresh, write.of))["revision"]
    lines = [("If-Match", f'"{revision}"'), ("If-Match", '"999999"')]
    if order == "current-last":
        lines.reverse()
    response = await send(client, fresh, write, lines)
    assert response.status_code in (200, 201, 204), response.text


PUTS = [write for write in WRITES if write.method == "PUT"]
# (id, If-Match, If-None-Match, target exists, expected): RFC 9110 section 13.2.2 evaluates
# If-Match first (false -> 412), then If-None-Match (false on a PUT -> 412).
ORDERING = [
    ("match-and-none-match-current", "current", "current", True, 412),
    ("match-and-none-match-star", "current", "*", True, 412),
    ("stale-match-and-none-match-star-on-missing", '"9"', "*", False, 412),
    ("match-and-none-match-other", "current", '"999999"', True, 200),
]


@pytest.mark.parametrize("case", ORDERING, ids=lambda c: c[0])
@pytest.mark.parametrize("write", PUTS, ids=lambda w: w.id)
async def test_put_evaluates_preconditions_in_rfc_order(
        client: httpx.AsyncClient, uid: str, write: Write,
        case: tuple[str, str, str, bool, int], request: pytest.FixtureRequest) -> None:
    fresh = await seed_for(client, uid, write.of)
    _name, if_match, if_none_match, exists, expected = case
    if not exists:
        fresh = Seeded(fresh.thread, fresh.compactions, {
            **fresh.values, "thread_id": f"missing-{uid}", "agent_name": "missing",
            "server_name": f"missing-{uid}"})
        before = None
    else:
        before = await current(client, fresh, write.of)
    tag = {"current": f'"{before["revision"]}"' if before else None}
    response = await send(client, fresh, write, [
        ("If-Match", tag.get(if_match) or if_match),
        ("If-None-Match", tag.get(if_none_match) or if_none_match)])
    if expected == 412:
        assert_problem(response, 412)
        if before is None:
            assert (await client.get(fresh.url(RESOURCE[write.of]))).status_code == 404
        else:
            assert await current(client, fresh, write.of) == before
    else:
        assert response.status_code == expected, response.text


@pytest.mark.parametrize("of", list(RESOURCE))
async def test_if_match_on_get_is_honoured(client: httpx.AsyncClient, seeded: Seeded, of: str,
                                           request: pytest.FixtureRequest) -> None:
    url = seeded.url(RESOURCE[of])
    revision = (await current(client, seeded, of))["revision"]
    for tag in (f'"{revision}"', f'"7", "{revision}"', "*"):
        assert (await client.get(url, headers={"If-Match": tag})).status_code == 200, tag
    assert_problem(await client.get(url, headers={"If-Match": '"999999"'}), 412)


# --- media types ----------------------------------------------------------------------------

BODY_WRITES = [write for write in WRITES if write.body is not None]


@pytest.mark.parametrize("write", BODY_WRITES, ids=lambda w: w.id)
async def test_a_body_without_content_type_is_415(client: httpx.AsyncClient, uid: str,
                                                  write: Write,
                                                  request: pytest.FixtureRequest) -> None:
    fresh = await seed_for(client, uid, write.of)
    before = await current(client, fresh, write.of)
    response = await client.request(write.method, fresh.url(write.path), content=write.body,
                                    headers={"If-Match": f'"{before["revision"]}"'})
    assert_problem(response, 415)
    assert await current(client, fresh, write.of) == before


async def test_a_body_without_content_type_is_415_on_create(
        client: httpx.AsyncClient, uid: str, request: pytest.FixtureRequest) -> None:
    response = await client.post("/v1/threads", content=f'{{"thread_id": "ct-{uid}"}}'.encode())
    assert_problem(response, 415)
    assert (await client.get(f"/v1/threads/ct-{uid}")).status_code == 404


PATCHES = [write for write in WRITES if write.method == "PATCH"]


@pytest.mark.parametrize("write", PATCHES, ids=lambda w: w.id)
async def test_json_patch_is_415_with_accept_patch(client: httpx.AsyncClient, uid: str,
                                                   write: Write,
                                                   request: pytest.FixtureRequest) -> None:
    fresh = await seed_for(client, uid, write.of)
    before = await current(client, fresh, write.of)
    response = await client.patch(
        fresh.url(write.path), content=b'[{"op": "replace", "path": "/state", "value": {}}]',
        headers={"Content-Type": "application/json-patch+json",
                 "If-Match": f'"{before["revision"]}"'})
    assert_problem(response, 415)
    assert MERGE_PATCH in response.headers.get("accept-patch", "")
    assert await current(client, fresh, write.of) == before


@pytest.mark.parametrize("write", PATCHES, ids=lambda w: w.id)
async def test_patch_responses_advertise_accept_patch(client: httpx.AsyncClient, uid: str,
                                                      write: Write,
                                                      request: pytest.FixtureRequest) -> None:
    fresh = await seed_for(client, uid, write.of)
    revision = (await current(client, fresh, write.of))["revision"]
    response = await send(client, fresh, write, [("If-Match", f'"{revision}"')])
    assert response.status_code == 200, response.text
    assert MERGE_PATCH in response.headers.get("accept-patch", "")


# --- Link ------------------------------------------------------------------------------------

LISTS = ["/v1/threads", "/v1/events", "/v1/agent-states", "/v1/mcp-servers",
         "/v1/threads/{thread_id}/messages", "/v1/threads/{thread_id}/compactions",
         "/v1/threads/{thread_id}/agents", "/v1/threads/{thread_id}/revisions"]


@pytest.mark.parametrize("path", LISTS)
async def test_link_is_relative_never_from_host(client: httpx.AsyncClient, seeded: Seeded,
                                                path: str,
                                                request: pytest.FixtureRequest) -> None:
    response = await client.get(seeded.url(path), params={"limit": 1},
                                headers={"Host": "evil.example"})
    assert response.status_code == 200, response.text
    link = response.headers["link"]
    assert "evil.example" not in link
    assert link.startswith(f"<{seeded.url(path)}?") and link.endswith('>; rel="next"'), link


async def test_link_uses_the_configured_base_url(settings: Settings, uid: str,
                                                 request: pytest.FixtureRequest) -> None:
    configured = Settings(database_url=settings.database_url, auto_migrate=False,  # type: ignore[call-arg]
                          _env_file=None, public_base_url="https://state.example.com")
    async with running(configured) as application, http_client(application) as client:
        await seed(client, uid)
        response = await client.get("/v1/threads", params={"limit": 1},
                                    headers={"Host": "evil.example"})
    assert response.headers["link"].startswith("<https://state.example.com/v1/threads?")


@pytest.mark.parametrize("path", ["/v1/threads/a b/messages", "/v1/threads/%2F/messages",
                                  "/v1/threads/é?#\\/messages", "/v1/threads"])
@pytest.mark.parametrize("query", [b"", b"limit=1", b"cursor=old&limit=2&cursor=older",
                                   b"a=&b=1&a=2", b"q=%C3%A9+x&plus=a%2Bb", b"flag",
                                   b"order=desc&limit=20", b"long=" + b"%C3%A9" * 200])
def test_the_next_link_is_what_starlette_would_build(path: str, query: bytes) -> None:
    """`next_target` skips building the request's URL; it must give what Starlette's
    `request.url.include_query_params(cursor=...)` gives, path and query."""
    from starlette.datastructures import URL

    from app.http.pagination import next_target

    scope = {"type": "http", "scheme": "http", "path": path, "query_string": query,
             "headers": [(b"host", b"evil.example")], "server": ("127.0.0.1", 8000)}
    url = URL(scope=scope).include_query_params(cursor="eyJuZXh0Ijo1fQ")
    for _ in range(2):  # worked out, then remembered (a short query)
        assert next_target(scope, "eyJuZXh0Ijo1fQ") == f"{url.path}?{url.query}"


# --- keys: 401 first, one Authorization header, write implies read ---------------------------

@dataclass(frozen=True)
class Keys:
    full: str
    read_only: str
    write_only: str


@pytest.fixture(scope="module")
def keys(secured_database_url: str) -> Keys:
    tenant = f"sem-{uuid.uuid4().hex[:8]}"
    return Keys(create_key(secured_database_url, tenant),
                create_key(secured_database_url, tenant, "read"),
                create_key(secured_database_url, tenant, "write"))


BAD_BODIES = [
    ("schema", b"{}", "application/json"),
    ("not-json", b"{", "application/json"),
    ("not-json-media-type", b"hello", "text/plain"),
    ("too-deep", b"[" * 100 + b"]" * 100, "application/json"),
]


@pytest.mark.slow  # keys are made with the real CLI
@pytest.mark.parametrize("credentials", ["none", "unknown-key"])
@pytest.mark.parametrize("bad", BAD_BODIES, ids=lambda b: b[0])
async def test_401_comes_before_anything_about_the_body(
        secured_client: httpx.AsyncClient, keys: Keys, uid: str, credentials: str,
        bad: tuple[str, bytes, str], request: pytest.FixtureRequest) -> None:
    headers = {"Content-Type": bad[2]}
    if credentials == "unknown-key":
        headers |= bearer(keys.full[:-2] + "zz")
    response = await secured_client.post(f"/v1/threads/auth-{uid}/messages", content=bad[1],
                                         headers=headers)
    assert_problem(response, 401)


@pytest.mark.slow  # keys are made with the real CLI
@pytest.mark.parametrize("bad", BAD_BODIES, ids=lambda b: b[0])
async def test_403_comes_before_anything_about_the_body(
        secured_client: httpx.AsyncClient, keys: Keys, uid: str, bad: tuple[str, bytes, str],
        request: pytest.FixtureRequest) -> None:
    response = await secured_client.post(f"/v1/threads/auth-{uid}/messages", content=bad[1],
                                         headers={"Content-Type": bad[2], **bearer(keys.read_only)})
    assert_problem(response, 403)


@pytest.mark.slow  # keys are made with the real CLI
@pytest.mark.parametrize("second", ["invalid", "same", "another-valid"])
async def test_several_authorization_headers_are_400(secured_client: httpx.AsyncClient,
                                                     keys: Keys, second: str,
                                                     request: pytest.FixtureRequest) -> None:
    other = {"invalid": "Bearer agst_0000000000000000_nope", "same": f"Bearer {keys.full}",
             "another-valid": f"Bearer {keys.read_only}"}[second]
    for lines in ([("Authorization", f"Bearer {keys.full}"), ("Authorization", other)],
                  [("Authorization", other), ("Authorization", f"Bearer {keys.full}")]):
        response = await secured_client.get("/v1/threads", headers=lines)
        assert_problem(response, 400)


@pytest.mark.slow  # keys are made with the real CLI
async def test_write_implies_read(secured_client: httpx.AsyncClient, keys: Keys, uid: str,
                                  request: pytest.FixtureRequest) -> None:
    writer = bearer(keys.write_only)
    created = await secured_client.put(f"/v1/threads/w-{uid}", json={"state": {"a": 1}},
                                       headers={"If-None-Match": "*", **writer})
    assert created.status_code == 201, created.text
    patched = await secured_client.patch(f"/v1/threads/w-{uid}", content=b"{}", headers={
        "If-Match": '"1"', "Content-Type": MERGE_PATCH, **writer})
    assert patched.status_code == 200 and patched.json()["state"] == {"a": 1}
    for path in (f"/v1/threads/w-{uid}", "/v1/threads", f"/v1/threads/w-{uid}/messages"):
        response = await secured_client.get(path, headers=writer)
        assert response.status_code == 200, (path, response.text)
