"""Route plans (app/http/plan.py) answer exactly what FastAPI's own handler answers.

Every request below is sent twice to the same application: once as it runs, where the
planned routes read their parameters and call their dependencies from the plan, and once
with a dependency override installed (one that overrides nothing any route uses), which
FastAPI honours on every request and the plans leave to FastAPI's handler. The two answers
must be the same: status, the headers a client reads, and the body, after the names,
times and ids that differ between two writes are put in place. The requests cover what a
plan reads itself (path and query parameters, defaults, repeated parameters, bodies, the
dependencies' own path parameters) on the hot routes, and the wrong turns it hands over.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests.conftest import http_client

pytestmark = pytest.mark.anyio

HEADERS = ("content-type", "etag", "location", "link", "allow", "idempotent-replayed",
           "accept-patch", "preference-applied", "retry-after")
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?")
ID = re.compile(r"[0-9a-f]{32}|[0-9A-HJKMNP-TV-Z]{26}")  # request ids, the server's ULIDs


async def _nothing() -> None:
    """Overrides itself: no route depends on it. Its presence is the switch."""


async def answer(client: httpx.AsyncClient, method: str, url: str,
                 **kwargs: Any) -> tuple[int, dict[str, str], str]:
    response = await client.request(method, url, **kwargs)
    headers = {name: response.headers[name] for name in HEADERS if name in response.headers}
    return response.status_code, headers, response.text


def same(planned: Any, fastapi: Any, *names: tuple[str, str]) -> None:
    """`planned` and `fastapi` equal, once each pair of names (planned, fastapi's) and the
    times and generated ids are written alike."""
    def normal(value: Any, which: int) -> str:
        text = repr(value)
        for pair in names:
            text = text.replace(pair[which], "<name>")
        return ID.sub("<id>", TIMESTAMP.sub("<time>", text))
    assert normal(planned, 0) == normal(fastapi, 1)


@pytest.fixture
async def two(app: FastAPI) -> AsyncIterator[tuple[httpx.AsyncClient, FastAPI]]:
    async with http_client(app) as client:
        yield client, app
    app.dependency_overrides.clear()


async def both(two: tuple[httpx.AsyncClient, FastAPI], method: str, url: str,
               **kwargs: Any) -> tuple[Any, Any]:
    client, app = two
    app.dependency_overrides.clear()
    planned = await answer(client, method, url, **kwargs)
    app.dependency_overrides[_nothing] = _nothing
    try:
        return planned, await answer(client, method, url, **kwargs)
    finally:
        app.dependency_overrides.clear()


async def seed(client: httpx.AsyncClient, thread: str) -> None:
    assert (await client.post("/v1/threads", json={
        "thread_id": thread, "state": {"step": 1}, "metadata": {"team": "a"}})).status_code == 201
    for n in range(5):
        assert (await client.post(f"/v1/threads/{thread}/messages", json={
            "role": "user" if n % 2 else "assistant", "content": f"m{n}",
            "agent_name": "planner"})).status_code == 201
    assert (await client.put(f"/v1/store/items/{thread}/notes/k1",
                             json={"value": {"text": "hello", "n": 1}})).status_code == 201


READS = [
    "/v1/threads/{t}", "/v1/threads/{t}?include=messages",
    "/v1/threads/{t}?include=messages&messages_limit=2", "/v1/threads/{t}?messages_limit=0",
    "/v1/threads/{t}?include=bogus", "/v1/threads/{t}?include=", "/v1/threads/bad%20id",
    "/v1/threads/{t}-missing", "/v1/threads?thread_id={t}&thread_id={t}-missing&limit=5",
    "/v1/threads?thread_id=", "/v1/threads?limit=0", "/v1/threads?limit=x&order_by=nope",
    "/v1/threads/{t}/messages", "/v1/threads/{t}/messages?order=desc&limit=2",
    "/v1/threads/{t}/messages?after_seq=1&before_seq=4&role=user",
    "/v1/threads/{t}/messages?role=&limit=1001", "/v1/threads/{t}/messages?after_seq=-1",
    "/v1/threads/{t}/messages?agent_name=planner&view=full",
    "/v1/threads/{t}/messages?created_after=2020-01-01T00:00:00Z",
    "/v1/threads/{t}/messages?created_after=2020-01-01",
    "/v1/threads/{t}/messages?limit=2&limit=3", "/v1/threads/{t}/checkpoints/latest",
    "/v1/threads/{t}/checkpoints/latest?items=digests&delta_channel=messages&delta_channel=o",
    "/v1/threads/{t}/checkpoints/latest?known_seed=nothex",
    "/v1/threads/{t}/checkpoints?limit=3&metadata=%7B%7D",
    "/v1/store/items/{t}/notes/k1", "/v1/store/items/{t}/notes/k1?refresh_ttl=true",
    "/v1/store/items/{t}/notes/k1?refresh_ttl=maybe", "/v1/store/items/{t}%2Fnotes/k1",
    "/v1/store/items/{t}/notes/.bad", "/v1/store/items/{t}/notes/missing",
    "/v1/threads/{t}/agents", "/v1/events?limit=2&thread_id={t}", "/healthz",
]


@pytest.mark.parametrize("url", READS)
async def test_a_read_answers_what_fastapi_answers(two: Any, uid: str, url: str) -> None:
    thread = f"plan-{uid}"
    await seed(two[0], thread)
    planned, fastapi = await both(two, "GET", url.format(t=thread))
    same(planned, fastapi)


async def test_a_conditional_read_answers_what_fastapi_answers(two: Any, uid: str) -> None:
    thread = f"plan-{uid}"
    await seed(two[0], thread)
    for header in ({"If-None-Match": '"6"'}, {"If-None-Match": '"1"'}, {"If-Match": '"1"'},
                   {"If-None-Match": "garbage"}):
        planned, fastapi = await both(two, "GET", f"/v1/threads/{thread}", headers=header)
        same(planned, fastapi)


WRITES: list[tuple[str, str, dict[str, Any]]] = [
    ("PUT", "/v1/threads/{t}", {"json": {"state": {"step": 2}}}),
    ("PUT", "/v1/threads/{t}", {"json": {"state": {"step": 3}}, "headers": {"If-Match": '"2"'}}),
    ("PUT", "/v1/threads/{t}", {"json": {"state": []}}),
    ("PUT", "/v1/threads/{t}", {"content": b'{"state": {}}',
                                "headers": {"content-type": "text/plain"}}),
    ("PUT", "/v1/threads/{t}", {"content": b'{"state": {}}',
                                "headers": {"content-type": "text/x+json"}}),
    ("PUT", "/v1/threads/{t}", {}),
    ("PATCH", "/v1/threads/{t}", {"json": {"metadata": {"b": 1}},
                                  "headers": {"content-type": "application/merge-patch+json"}}),
    ("POST", "/v1/threads/{t}/messages", {"json": {"role": "user", "content": "hi"}}),
    ("POST", "/v1/threads/{t}/messages", {"json": {"messages": [{"role": "user"}, {}]}}),
    ("POST", "/v1/threads/{t}/messages", {"json": {"role": "user", "content": "again"},
                                          "headers": {"Idempotency-Key": "k-1"}}),
    ("POST", "/v1/threads/{t}/messages", {"json": {"role": "user", "content": "again"},
                                          "headers": {"Idempotency-Key": "k-1"}}),
    ("POST", "/v1/threads/{t}/checkpoints/batch", {"json": {"checkpoints": [{
        "checkpoint_id": "c1", "checkpoint": {"v": 4, "id": "c1", "channel_versions": {}},
        "metadata": {"step": 1}}], "writes": []}}),
    ("POST", "/v1/threads/{t}/checkpoints/batch", {"json": {"checkpoints": "none"}}),
    ("GET", "/v1/threads/{t}/checkpoints/latest", {}),
    ("PUT", "/v1/store/items/{t}/notes/k2", {"json": {"value": {"a": 1}},
                                             "headers": {"If-None-Match": '"0"'}}),
    ("PUT", "/v1/store/items/{t}/notes/k2", {"json": {"value": "not an object"}}),
    ("POST", "/v1/store/items/search", {"json": {"namespace_prefix": ["{t}"], "limit": 5,
                                                 "filter": {"n": {"$gte": 1}}}}),
    ("POST", "/v1/store/items/search", {"json": {"namespace_prefix": "{t}"}}),
    ("PUT", "/v1/threads/{t}/agents/planner/state", {"json": {"state": {"plan": [1]}}}),
    ("DELETE", "/v1/threads/{t}/messages/nope", {}),
    ("POST", "/v1/batch", {"json": [{"op": "messages.append", "thread_id": "{t}",
                                     "body": {"role": "user", "content": "b"}}]}),
]


def _named(value: Any, thread: str) -> Any:
    if isinstance(value, str):
        return value.replace("{t}", thread)
    if isinstance(value, bytes):
        return value.replace(b"{t}", thread.encode())
    if isinstance(value, dict):
        return {key: _named(item, thread) for key, item in value.items()}
    if isinstance(value, list):
        return [_named(item, thread) for item in value]
    return value


async def test_writes_answer_what_fastapi_answers(two: Any, uid: str) -> None:
    """The same writes on two threads, one served by the plans and one by FastAPI."""
    client, app = two
    ours, theirs = f"plan-a-{uid}", f"plan-b-{uid}"
    await seed(client, ours)
    await seed(client, theirs)
    for method, url, kwargs in WRITES:
        app.dependency_overrides.clear()
        planned = await answer(client, method, _named(url, ours), **_named(kwargs, ours))
        app.dependency_overrides[_nothing] = _nothing
        fastapi = await answer(client, method, _named(url, theirs), **_named(kwargs, theirs))
        app.dependency_overrides.clear()
        same((method, url, planned), (method, url, fastapi), (ours, theirs))


# --- the route a DomainRouter chooses (app/http/routing.py) ---------------------------------

SAMPLES = ("t1", "a:b", "latest", "batch", "search", "x y", "1")
METHODS = ("GET", "HEAD", "PUT", "PATCH", "POST", "DELETE", "OPTIONS")


def _paths(template: str) -> set[str]:
    """The template with each parameter set to every sample (a `path` one to two segments
    too), including values that other routes' literal segments take."""
    paths = {template}
    for name in re.findall(r"{([^}]+)}", template):
        values = (*SAMPLES, "a/b") if name.endswith(":path") else SAMPLES
        paths = {path.replace(f"{{{name}}}", value, 1) for path in paths for value in values}
    return paths


async def test_a_domain_router_chooses_the_route_fastapi_chooses(app: FastAPI) -> None:
    """For every route's path (its parameters set to samples that collide with literal
    segments: `latest`, `batch`, `a:b`) and every method, each included router answers as
    FastAPI's own matching does, and where it chose a route itself, the route, its context
    and the child scope are FastAPI's."""
    from fastapi.routing import APIRoute, _IncludedRouter
    from starlette.routing import Match

    from app.http.routing import _SELECTED

    included = [route for route in app.router.routes if isinstance(route, _IncludedRouter)]
    templates = {route.path_format for router in included
                 for route in router.original_router.routes if isinstance(route, APIRoute)}
    chosen = full = 0
    for path in sorted({path for template in templates for path in _paths(template)}):
        for method in METHODS:
            scope = {"type": "http", "method": method, "path": path, "root_path": "",
                     "headers": [], "query_string": b"", "app": app}
            for router in included:
                match, child_scope, route, context = router._match({**scope})
                full += match == Match.FULL
                probe = {**scope}
                assert router.matches(probe)[0] == match, (method, path)
                selected = probe.get(_SELECTED)
                if selected is None:
                    continue
                chosen += 1
                assert (match, selected[1], selected[2]) == (Match.FULL, route, context)
                assert selected[3] == child_scope, (method, path)
    # Every request FastAPI matches fully, the router chose itself (a silent fallback to
    # FastAPI's matching would pass the above).
    assert chosen == full > 500, (chosen, full)
