"""The OpenAPI document as generated clients need it (API.md section 10).

FastAPI builds the document from the routes; `complete()` then states, operation by operation,
what the middleware and the error handlers do for every route alike, so no router has to
repeat it: every 4xx/5xx is `application/problem+json` with the Problem schema; 413 and 415
on every operation that takes a body; 503 wherever the database is touched; 401/403 where
keys apply; the response headers we send; one spelling and a pattern for the precondition
headers; security that lets an open server's anonymous calls validate; described tags; an
example for each request body. `/docs` is Swagger UI from assets installed with the
`fastapi-offline` package, so it works without internet access.
"""

from __future__ import annotations

import re
from importlib.resources import files
from typing import Any

from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.routing import APIRoute, iter_route_contexts
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, Response
from starlette.routing import BaseRoute

from app.core.errors import NotFound
from app.http.params import DeclaredHeader
from app.http.problems import DESCRIPTIONS, PROBLEM_JSON

PROBLEM = {"$ref": "#/components/schemas/Problem"}

TAGS = [
    {"name": "operations", "description": "Liveness, readiness and Prometheus metrics; "
                                          "never authenticated."},
    {"name": "threads", "description": "A thread is one run: its state (a JSON object with "
                                       "a revision), metadata, history and forks."},
    {"name": "messages", "description": "The conversation of a thread, appended in order."},
    {"name": "compactions", "description": "Summaries that stand in for a run of messages, "
                                           "and their reverts."},
    {"name": "agent states", "description": "The state of each agent within a thread."},
    {"name": "mcp servers", "description": "State and encrypted secrets of MCP servers."},
    {"name": "events", "description": "The audit log of committed changes, in commit order."},
    {"name": "batch", "description": "Operations on threads, messages and agent states in one "
                                     "transaction, all or nothing."},
    {"name": "checkpoints", "description": "Immutable checkpoints of graph runtimes "
                                           "(LangGraph's saver interface), with their channel "
                                           "values and pending writes."},
    {"name": "store", "description": "Memory that outlives a thread: JSON items by namespace "
                                     "and key, with a time to live, searched by filter, text "
                                     "and caller-computed vectors."},
]

# An entity-tag list (RFC 9110 section 8.8.3) or `*`; opaque tags of visible ASCII.
ETAG_LIST = r'^(\*|(W/)?"[!#-~]*"( *, *(W/)?"[!#-~]*")*)$'
HEADER_PATTERNS = {"If-Match": ETAG_LIST, "If-None-Match": ETAG_LIST,
                   "Idempotency-Key": r"^[ -~]{1,255}$"}

_MESSAGE = {"role": "user", "content": "Find flights to Lisbon for next Friday."}
EXAMPLES: dict[str, Any] = {
    "createThread": {"thread_id": "support-42", "state": {"step": "triage"},
                     "metadata": {"team": "support"}},
    "putThread": {"state": {"step": "answer", "attempts": 1}, "metadata": {"team": "support"}},
    "patchThread": {"state": {"step": "done"}},
    "forkThread": {"thread_id": "support-42-retry", "revision": 1},
    "appendMessages": _MESSAGE,
    "createCompaction": {"source_message_ids": ["m1", "m2"],
                         "summary": {"role": "system", "content": "The user wants a flight."},
                         "reason": "context window"},
    "putAgentState": {"state": {"plan": ["search", "book"], "cursor": 0}},
    "patchAgentState": {"state": {"cursor": 1}},
    "putMcpServer": {"server_type": "broker", "state": {"session": "s-1"}},
    "patchMcpServer": {"state": {"session": "s-2"}},
    "removeMessages": {"last": 1},
    "redactMessage": {"content": "[redacted]"},
    "runBatch": {"operations": [
        {"op": "messages.append", "thread_id": "support-42", "if_match": "\"3\"",
         "body": {"messages": [{"role": "model", "item": {"author": "agent", "id": "e-7"}}]}},
        {"op": "thread.patch", "thread_id": "support-42", "if_match": "\"4\"",
         "body": {"state": {"step": "answer"}}},
    ]},
    "createCheckpoint": {
        "checkpoint_ns": "", "checkpoint_id": "1f0c2a7e-5b1d-6c3e-8001-9a2b3c4d5e6f",
        "parent_checkpoint_id": None,
        "checkpoint": {"v": 4, "ts": "2026-11-30T12:00:00+00:00",
                       "channel_versions": {"messages": "0000000000000001.a1b2c3d4e5f6"},
                       "versions_seen": {}, "updated_channels": ["messages"]},
        "metadata": {"source": "input", "step": -1, "run_id": "run-1"},
        "values": [{"channel": "messages", "version": "0000000000000001.a1b2c3d4e5f6",
                    "type": "agentstate.list", "items": [{"type": "msgpack", "data": "kQ=="}]}]},
    "putCheckpointWrites": {"checkpoint_ns": "", "task_id": "task-1",
                            "task_path": "~__pregel_pull, agent",
                            "writes": [{"idx": 0, "channel": "messages", "type": "msgpack",
                                        "data": "kQ=="}]},
    "batchCheckpoints": {
        "checkpoints": [{
            "checkpoint_ns": "", "checkpoint_id": "1f0c2a7e-5b1d-6c3e-8002-9a2b3c4d5e6f",
            "parent_checkpoint_id": "1f0c2a7e-5b1d-6c3e-8001-9a2b3c4d5e6f",
            "checkpoint": {"v": 4, "ts": "2026-11-30T12:00:01+00:00",
                           "channel_versions": {"messages": "0000000000000002.0c1d2e3f4a5b"},
                           "versions_seen": {}, "updated_channels": ["messages"]},
            "metadata": {"source": "loop", "step": 0, "run_id": "run-1"},
            "values": [{"channel": "messages", "version": "0000000000000002.0c1d2e3f4a5b",
                        "type": "agentstate.list",
                        "base_version": "0000000000000001.a1b2c3d4e5f6",
                        "items": [{"type": "msgpack", "data": "kg=="}]}]}],
        "writes": [{"checkpoint_id": "1f0c2a7e-5b1d-6c3e-8002-9a2b3c4d5e6f",
                    "checkpoint_ns": "", "task_id": "task-2",
                    "task_path": "~__pregel_pull, agent",
                    "writes": [{"idx": 0, "channel": "messages", "type": "msgpack",
                                "data": "kw=="}]}]},
    "pruneCheckpoints": {"keep": 1},
    "copyCheckpoints": {"thread_id": "support-42-copy"},
    "getCheckpointItems": {"digests": ["0123456789abcdef0123456789abcdef"]},
    "deleteCheckpointRuns": {"run_ids": ["run-1"]},
    "putStoreItem": {"value": {"text": "Prefers window seats", "kind": "preference"},
                     "index": ["text"], "ttl_seconds": 2592000,
                     "vectors": {"minilm-384": {"text": [0.12, -0.03, 0.33]}}},
    "patchStoreItem": {"value": {"kind": "travel-preference"}},
    "searchStoreItems": {"namespace_prefix": ["users", "42"], "query": "seat preference",
                         "filter": {"kind": "preference"}, "limit": 5},
    "listStoreNamespaces": {"prefix": ["users"], "max_depth": 2},
}

_REVISIONED = re.compile(r"/v1/threads/\{thread_id\}$|/state$|/v1/mcp-servers/\{server_name\}$"
                         r"|/v1/store/items/\{namespace\}/\{key\}$")
_HEADERS = {
    "ETag": ("The resource's revision as a strong entity tag, e.g. `\"3\"`.", True),
    "Location": ("The URL of the resource created.", True),
    "Link": ('`<...>; rel="next"`: the next page, when there is one.', False),
    "Retry-After": ("Seconds to wait before retrying.", False),
    "Idempotent-Replayed": (("`true` when this is the stored answer to an earlier request "
                             "with the same Idempotency-Key."), False),
    "WWW-Authenticate": ('`Bearer realm="agentstate"`.', False),
}


def operation_id(route: APIRoute) -> str:
    """`get_thread` -> `getThread`: the method names of generated clients."""
    head, *rest = route.name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _header(name: str) -> dict[str, Any]:
    description, required = _HEADERS[name]
    return {"description": description, "required": required, "schema": {"type": "string"}}


def _without_null(parameter: dict[str, Any]) -> None:
    """An optional query or header parameter (`str | None`) is `anyOf: [..., null]` as
    FastAPI writes it, but a query string or a header cannot carry a null: leaving the
    parameter out is the None. So the schema is what a present value must be. With the
    null branch in, the schema said `?thread_id=false` (a boolean, as a fuzzer reads the
    anyOf) is not allowed, while the server rightly reads it as the thread id "false"."""
    schema = parameter.get("schema", {})
    branches = schema.get("anyOf")
    if parameter["in"] not in ("query", "header") or not branches:
        return
    kept = [branch for branch in branches if branch != {"type": "null"}]
    if len(kept) == len(branches):
        return
    rest = {key: value for key, value in schema.items() if key != "anyOf"}
    parameter["schema"] = {**kept[0], **rest} if len(kept) == 1 else {"anyOf": kept, **rest}


def _complete_operation(path: str, method: str, op: dict[str, Any]) -> None:
    responses: dict[str, Any] = op["responses"]
    keyed = path.startswith("/v1/")
    wanted: set[int] = set()
    if "requestBody" in op:
        wanted |= {413, 415}
    if keyed or path == "/readyz":
        wanted.add(503)
    if keyed:
        wanted |= {401, 403}
    else:
        for denied in ("401", "403"):
            responses.pop(denied, None)
    for code in wanted:
        responses.setdefault(str(code), {"description": DESCRIPTIONS[code]})
    for status, response in responses.items():
        if int(status) >= 400:
            response["content"] = {PROBLEM_JSON: {"schema": PROBLEM}}

    def need(status: str, name: str) -> None:
        if status in responses:
            responses[status].setdefault("headers", {})[name] = _header(name)

    need("503", "Retry-After")
    need("401", "WWW-Authenticate")
    if _REVISIONED.search(path) and method in ("get", "put", "patch"):
        need("200", "ETag")
        need("304", "ETag")
    params = {p["name"] for p in op.get("parameters", [])}
    if method == "put" or (method == "post" and "Idempotency-Key" not in params
                           and path in ("/v1/threads", "/v1/threads/{thread_id}/fork")):
        need("201", "ETag")
        need("201", "Location")
    if "Idempotency-Key" in params:
        need("201", "Idempotent-Replayed")
        need("201", "ETag" if path.endswith("/messages") else "Location")
    if "cursor" in params:
        need("200", "Link")

    for parameter in op.get("parameters", []):
        _without_null(parameter)
        if parameter["in"] == "header" and parameter["name"] in HEADER_PATTERNS:
            description = parameter["schema"].get("description")
            parameter["schema"] = {"type": "string", "pattern": HEADER_PATTERNS[parameter["name"]]}
            if description:
                parameter["schema"]["description"] = description

    if keyed:
        op["security"] = [{}, {"ApiKey": []}]
    else:
        op.pop("security", None)
    example = EXAMPLES.get(op.get("operationId", ""))
    if example is not None and "requestBody" in op:
        for media in op["requestBody"].get("content", {}).values():
            media["example"] = example


def _declared_headers(dependant: Dependant) -> list[DeclaredHeader]:
    """The headers the dependencies of a route read themselves, in the order FastAPI solves
    them (app/http/params.py, `DeclaredHeader`)."""
    found: list[DeclaredHeader] = []
    for dependency in dependant.dependencies:
        found += _declared_headers(dependency)
        found += getattr(dependency.call, "declared_headers", ())
    return found


def declare_headers(routes: list[BaseRoute], document: dict[str, Any]) -> None:
    """Adds to each operation the headers its dependencies read themselves, as FastAPI
    would declare a `Header()` parameter, after the parameters FastAPI declared."""
    for route in iter_route_contexts(routes):  # included routers' routes too, as FastAPI's
        if not isinstance(route.original_route, APIRoute) or not route.include_in_schema:
            continue
        declared = _declared_headers(route.dependant)
        item = document["paths"].get(route.path_format, {})
        for method in route.methods or ():
            op = item.get(method.lower())
            if op is None or not declared:
                continue
            parameters = op.setdefault("parameters", [])
            named = {parameter["name"] for parameter in parameters}
            for header in declared:
                if header.name not in named:
                    named.add(header.name)
                    parameters.append({
                        "name": header.name, "in": "header", "required": False,
                        "schema": {"type": "string", "description": header.description},
                        "description": header.description})


def complete(document: dict[str, Any]) -> dict[str, Any]:
    for path, item in document["paths"].items():
        for method, op in item.items():
            if method in ("get", "put", "patch", "post", "delete"):
                _complete_operation(path, method, op)
    document["tags"] = TAGS
    return document


def install_openapi(app: FastAPI) -> None:
    """The completed document at /openapi.json, and Swagger UI at /docs from local assets."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = generate()
            declare_headers(app.routes, document)
            app.openapi_schema = complete(document)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    static = files("fastapi_offline") / "static"
    assets = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css",
              "favicon.png": "image/png"}

    async def docs(request: Request) -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json", title="agentstate API",
            swagger_js_url="/docs/assets/swagger-ui-bundle.js",
            swagger_css_url="/docs/assets/swagger-ui.css",
            swagger_favicon_url="/docs/assets/favicon.png")

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in assets:
            raise NotFound(f"No documentation asset {name!r}.")
        return FileResponse(str(static / name), media_type=assets[name])

    app.add_route("/docs", docs, include_in_schema=False)
    app.add_route("/docs/assets/{name}", asset, include_in_schema=False)
