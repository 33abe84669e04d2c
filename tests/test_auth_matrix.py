"""Every operation of the OpenAPI document, called with the wrong credentials (API.md section 9).

The operations are read from `/openapi.json`, not listed here, so an endpoint added later is
covered without touching this file, and one added without protection fails it. Path parameters
are filled with fresh names, bodies are built from the request schema (required members only).

Tenant A creates one of everything it can; then tenant B calls every operation on A's names
and on names nobody uses, in the same order: B must not be able to tell them apart (same
status, same problem body), must never see A's names in a list, and A's view of every GET must
be the same afterwards.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.support import bearer, create_key, revoke_key

pytestmark = pytest.mark.anyio

METHODS = ("get", "put", "patch", "post", "delete")
WRITES = {"put", "patch", "post", "delete"}
PARAM = re.compile(r"{([^}]+)}")

# Bodies a schema cannot describe: they refer to resources created before them.
EXAMPLES: dict[tuple[str, str], Callable[[dict[str, str]], Any]] = {
    ("post", "/v1/threads/{thread_id}/compactions"): lambda learned: {
        "source_message_ids": [learned["/v1/threads/{thread_id}/messages"]],
        "summary": {"role": "assistant", "content": "summary"},
    },
    # A fork makes a thread whose id is in the body: a new one each time.
    ("post", "/v1/threads/{thread_id}/fork"): lambda learned: {
        "thread_id": f"fork-{uuid.uuid4().hex[:12]}"},
    # A batch names its threads in the body, not the path: a new one each time.
    ("post", "/v1/batch"): lambda learned: {"operations": [
        {"op": "thread.put", "thread_id": f"batch-{uuid.uuid4().hex[:12]}",
         "body": {"state": {}}}]},
}


@dataclass(frozen=True)
class Op:
    method: str
    path: str
    spec: dict[str, Any]

    @property
    def params(self) -> list[str]:
        return PARAM.findall(self.path)

    def url(self, values: dict[str, str]) -> str:
        return PARAM.sub(lambda m: values[m.group(1)], self.path)


@dataclass(frozen=True)
class Keys:
    a: str
    a_read: str
    a_secrets: str
    b: str
    revoked: str


@pytest.fixture(scope="module")
def keys(secured_database_url: str) -> Keys:
    tenant_a, tenant_b = f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
    revoked = create_key(secured_database_url, tenant_a)
    revoke_key(secured_database_url, revoked)
    return Keys(
        a=create_key(secured_database_url, tenant_a),
        a_read=create_key(secured_database_url, tenant_a, "read"),
        a_secrets=create_key(secured_database_url, tenant_a, "read,secrets:read"),
        b=create_key(secured_database_url, tenant_b),
        revoked=revoked,
    )


async def operations(client: httpx.AsyncClient) -> tuple[dict[str, Any], list[Op]]:
    spec = (await client.get("/openapi.json")).json()
    ops = [Op(method, path, operation)
           for path, item in spec["paths"].items() if path.startswith("/v1")
           for method, operation in item.items() if method in METHODS]
    assert ops, "the OpenAPI document lists no /v1 operation"
    return spec, ops


def resolve(spec: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def example(spec: dict[str, Any], schema: dict[str, Any]) -> Any:
    """The smallest value the schema accepts, as far as a schema can say."""
    schema = resolve(spec, schema)
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            options = [s for s in schema[key] if resolve(spec, s).get("type") != "null"]
            return example(spec, options[0])
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        required = set(schema.get("required", []))
        return {name: example(spec, prop) for name, prop in schema.get("properties", {}).items()
                if name in required}
    if kind == "array":
        return [example(spec, schema.get("items", {})) for _ in range(schema.get("minItems", 0))]
    if kind == "string":
        if schema.get("format") == "date-time":
            return "2026-01-01T00:00:00.000000Z"
        return "x" * max(1, schema.get("minLength", 1))
    if kind in ("integer", "number"):
        return schema.get("minimum", 1)
    if kind == "boolean":
        return False
    return {}


def body_for(spec: dict[str, Any], op: Op, learned: dict[str, str]) -> Any:
    if (op.method, op.path) in EXAMPLES:
        try:
            return EXAMPLES[op.method, op.path](learned)
        except KeyError:  # what it refers to could not be created
            pass
    content = op.spec.get("requestBody", {}).get("content", {})
    schema = next((value["schema"] for media, value in content.items() if "json" in media), None)
    return None if schema is None else example(spec, schema)


def query_for(spec: dict[str, Any], op: Op) -> dict[str, Any]:
    return {p["name"]: example(spec, p.get("schema", {})) for p in op.spec.get("parameters", [])
            if p["in"] == "query" and p.get("required")}


async def call(client: httpx.AsyncClient, spec: dict[str, Any], op: Op, values: dict[str, str],
               token: str | None, learned: dict[str, str] | None = None) -> httpx.Response:
    body = body_for(spec, op, learned or {}) if op.method in WRITES else None
    headers = bearer(token) if token else {}
    if "text/event-stream" in op.spec.get("responses", {}).get("200", {}).get("content", {}):
        # A stream the caller may read never ends in process: ask for what it refuses, so a
        # caller it admits gets its 406 (the key is checked before the media type).
        headers["Accept"] = "application/json"
    return await client.request(
        op.method.upper(), op.url(values), params=query_for(spec, op), headers=headers,
        json=body,
    )


async def seed(client: httpx.AsyncClient, spec: dict[str, Any], ops: list[Op],
               token: str) -> tuple[dict[str, str], dict[str, str]]:
    """Create one of everything tenant A can create; returns the path values and the
    server-generated ids learned per collection."""
    uid = uuid.uuid4().hex[:8]
    values = {p: f"{p.replace('_', '-')}-a-{uid}" for op in ops for p in op.params}
    learned: dict[str, str] = {}
    item_param = {op.path: op.params[-1] for op in ops if op.params}
    creators = sorted((op for op in ops if op.method in ("put", "post") and op.params),
                      key=lambda op: (op.path.count("/"), (op.method, op.path) in EXAMPLES,
                                      op.method != "put"))
    for op in creators:
        response = await call(client, spec, op, values, token, learned)
        if response.status_code not in (200, 201):
            continue
        body = response.json()
        created = body.get("id") or (body.get("data") or [{}])[0].get("id")
        child = next((path for path in item_param if path.startswith(op.path + "/{")
                      and path.count("/") == op.path.count("/") + 1), None)
        if created and child:
            learned[op.path] = created
            values[item_param[child]] = created
    return values, learned


def fresh_values(values: dict[str, str]) -> dict[str, str]:
    """Names of the same shape as A's that nobody uses."""
    return {name: value.replace("-a-", "-f-") if "-a-" in value else value[:-6] + "ZZZZZZ"
            for name, value in values.items()}


def normalised(response: httpx.Response, swap: dict[str, str]) -> Any:
    text = response.text
    for old, new in swap.items():
        text = text.replace(old, new)
    return json.loads(text) if text else None


def assert_unauthorized(response: httpx.Response, op: Op) -> None:
    assert response.status_code == 401, (op.method, op.path, response.text)
    assert response.headers["www-authenticate"].startswith("Bearer"), (op.method, op.path)
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["code"] == "unauthorized"


async def test_every_operation_declares_the_bearer_scheme(
        secured_client: httpx.AsyncClient) -> None:
    spec, ops = await operations(secured_client)
    assert spec["components"]["securitySchemes"]["ApiKey"]["scheme"] == "bearer"
    for op in ops:
        # The key is one alternative, `{}` the other (an open server's anonymous
        # calls are valid); every /v1 operation still declares the bearer scheme.
        assert op.spec.get("security") == [{}, {"ApiKey": []}], (op.method, op.path)
        assert {"401", "403"} <= set(op.spec["responses"]), (op.method, op.path)
    for path in ("/healthz", "/readyz", "/metrics"):
        assert "security" not in spec["paths"][path]["get"], path
        assert (await secured_client.get(path)).status_code == 200, "stays unauthenticated"
    assert (await secured_client.get("/openapi.json")).status_code == 200


@pytest.mark.slow
async def test_matrix(secured_client: httpx.AsyncClient, keys: Keys) -> None:
    spec, ops = await operations(secured_client)
    values, learned = await seed(secured_client, spec, ops, keys.a)
    # Reads: the GETs and the POSTs that only read (a search): B's writes come after them.
    gets = [op for op in ops if op.method == "get" or op.spec.get("x-agentstate-scope") == "read"]
    before = {op.path: await call(secured_client, spec, op, values, keys.a) for op in gets}
    # Single resources (not pages) that tenant A owns: B must get exactly a missing id's 404.
    owned = [op for op in gets if op.params and before[op.path].status_code == 200
             and "data" not in before[op.path].json()]
    assert any(op.path == "/v1/threads/{thread_id}" for op in owned), "seeding failed"

    for op in ops:
        # No key, a revoked key, a malformed key: 401 whatever the operation.
        assert_unauthorized(await call(secured_client, spec, op, values, None), op)
        assert_unauthorized(await call(secured_client, spec, op, values, keys.revoked), op)
        assert_unauthorized(await call(secured_client, spec, op, values, keys.a[:-2] + "zz"), op)
        # A read-only key of the owner: reads pass, writes are 403 before anything happens
        # (a POST that only reads, such as a search, says so: `x-agentstate-scope: read`).
        read_only = await call(secured_client, spec, op, values, keys.a_read)
        if op.method in WRITES and op.spec.get("x-agentstate-scope") != "read":
            assert read_only.status_code == 403, (op.method, op.path, read_only.text)
            assert read_only.json()["code"] == "forbidden"
        else:
            assert read_only.status_code not in (401, 403), (op.method, op.path, read_only.text)

    fresh = fresh_values(values)
    swap = {values[name]: fresh[name] for name in values}
    learned_fresh = {path: swap.get(value, value) for path, value in learned.items()}
    # Reads first (B has nothing anywhere yet), then writes, each on A's names and on fresh
    # ones: B's state evolves the same way on both, so every answer must match.
    for op in gets + [op for op in ops if op not in gets]:
        on_a = await call(secured_client, spec, op, values, keys.b, learned)
        on_fresh = await call(secured_client, spec, op, fresh, keys.b, learned_fresh)
        where = (op.method, op.path, on_a.text, on_fresh.text)
        assert on_a.status_code == on_fresh.status_code, where
        assert on_a.status_code not in (401, 403, 500), where
        if op in gets or on_a.status_code >= 400:
            assert normalised(on_a, swap) == normalised(on_fresh, {}), where
        if op in owned:
            assert on_a.status_code == 404, where
        if not op.params:
            assert not any(value in on_a.text for value in values.values()), where

    for op in gets:
        after = await call(secured_client, spec, op, values, keys.a)
        assert (after.status_code, after.text) == (before[op.path].status_code,
                                                   before[op.path].text), (op.path, after.text)


@pytest.mark.slow
async def test_include_secrets_needs_the_secrets_scope(secured_client: httpx.AsyncClient,
                                                       keys: Keys) -> None:
    spec, ops = await operations(secured_client)
    guarded = [op for op in ops if op.method == "get" and any(
        p["name"] == "include_secrets" for p in op.spec.get("parameters", []))]
    assert guarded, "no GET takes include_secrets: the MCP server reads lost their parameter"
    values, _ = await seed(secured_client, spec, ops, keys.a)
    for op in guarded:
        url = op.url(values)
        denied = await secured_client.get(url, params={"include_secrets": "true"},
                                   headers=bearer(keys.a_read))
        assert denied.status_code == 403, (op.path, denied.text)
        allowed = await secured_client.get(url, params={"include_secrets": "true"},
                                    headers=bearer(keys.a_secrets))
        assert allowed.status_code not in (401, 403), (op.path, allowed.text)
        masked = await secured_client.get(url, headers=bearer(keys.a_read))
        assert masked.status_code not in (401, 403), (op.path, masked.text)
