"""The OpenAPI document is complete enough for the clients our users generate.

Read from the live `/openapi.json`, operation by operation, so a new endpoint is held to the
same rules: stable readable operationIds; every error status declared with the Problem schema
(413 and 415 on every operation that takes a body, 503 wherever the database is touched,
401/403 where keys apply and nowhere else); the response headers we send declared; header
parameters spelled one way with patterns; security that lets an open server's anonymous calls
validate; described tags; an example for each request body. And `/docs` works offline.

Decision on `/docs`: keep it, served from assets installed with a well-kept PyPI package
(fastapi-offline ships current Swagger UI and ReDoc builds; swagger-ui-bundle is stuck on
Swagger UI 4, which cannot render OpenAPI 3.1). A page that loads its scripts from a CDN
shows nothing on an air-gapped host, so no documentation page may name another host.

"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from importlib import metadata
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx
import pytest

from app.core.settings import Settings
from app.main import create_app
from tests.conftest import http_client, running

pytestmark = pytest.mark.anyio

METHODS = ("get", "put", "patch", "post", "delete")
PROBLEM = {"$ref": "#/components/schemas/Problem"}
OPS_PATHS = ("/healthz", "/readyz", "/metrics")

# The operationIds generated clients name their methods after. Changing one breaks every
# generated client: a rename here must be deliberate.
OPERATION_IDS = {
    ("get", "/healthz"): "getHealth",
    ("get", "/readyz"): "getReadiness",
    ("get", "/metrics"): "getMetrics",
    ("post", "/v1/threads"): "createThread",
    ("get", "/v1/threads"): "listThreads",
    ("get", "/v1/threads/{thread_id}"): "getThread",
    ("put", "/v1/threads/{thread_id}"): "putThread",
    ("patch", "/v1/threads/{thread_id}"): "patchThread",
    ("delete", "/v1/threads/{thread_id}"): "deleteThread",
    ("get", "/v1/threads/{thread_id}/revisions"): "listThreadRevisions",
    ("get", "/v1/threads/{thread_id}/revisions/{revision}"): "getThreadRevision",
    ("post", "/v1/threads/{thread_id}/fork"): "forkThread",
    ("post", "/v1/threads/{thread_id}/messages"): "appendMessages",
    ("get", "/v1/threads/{thread_id}/messages"): "listMessages",
    ("get", "/v1/threads/{thread_id}/messages/{message_id}"): "getMessage",
    ("post", "/v1/threads/{thread_id}/compactions"): "createCompaction",
    ("get", "/v1/threads/{thread_id}/compactions"): "listCompactions",
    ("get", "/v1/threads/{thread_id}/compactions/{compaction_id}"): "getCompaction",
    ("delete", "/v1/threads/{thread_id}/compactions/{compaction_id}"): "revertCompaction",
    ("get", "/v1/threads/{thread_id}/agents/{agent_name}/state"): "getAgentState",
    ("put", "/v1/threads/{thread_id}/agents/{agent_name}/state"): "putAgentState",
    ("patch", "/v1/threads/{thread_id}/agents/{agent_name}/state"): "patchAgentState",
    ("delete", "/v1/threads/{thread_id}/agents/{agent_name}/state"): "deleteAgentState",
    ("get", "/v1/threads/{thread_id}/agents"): "listThreadAgentStates",
    ("get", "/v1/agent-states"): "queryAgentStates",
    ("get", "/v1/mcp-servers"): "listMcpServers",
    ("get", "/v1/mcp-servers/{server_name}"): "getMcpServer",
    ("put", "/v1/mcp-servers/{server_name}"): "putMcpServer",
    ("patch", "/v1/mcp-servers/{server_name}"): "patchMcpServer",
    ("delete", "/v1/mcp-servers/{server_name}"): "deleteMcpServer",
    ("get", "/v1/events"): "listEvents",
    # Message removal.
    ("post", "/v1/threads/{thread_id}/messages:remove"): "removeMessages",
    ("delete", "/v1/threads/{thread_id}/messages/{message_id}"): "deleteMessage",
    ("patch", "/v1/threads/{thread_id}/messages/{message_id}"): "redactMessage",
    ("post", "/v1/batch"): "runBatch",
    ("get", "/v1/events/stream"): "streamEvents",
    ("post", "/v1/threads/{thread_id}/checkpoints"): "createCheckpoint",
    ("get", "/v1/threads/{thread_id}/checkpoints"): "listCheckpoints",
    ("delete", "/v1/threads/{thread_id}/checkpoints"): "deleteCheckpoints",
    ("post", "/v1/threads/{thread_id}/checkpoints/prune"): "pruneCheckpoints",
    ("post", "/v1/threads/{thread_id}/checkpoints/copy"): "copyCheckpoints",
    ("get", "/v1/threads/{thread_id}/checkpoints/latest"): "getLatestCheckpoint",
    ("post", "/v1/threads/{thread_id}/checkpoints/batch"): "batchCheckpoints",
    ("get", "/v1/threads/{thread_id}/checkpoints/latest/delta-history"):
        "getLatestDeltaHistory",
    ("get", "/v1/threads/{thread_id}/checkpoints/{checkpoint_id}/delta-history"):
        "getDeltaHistory",
    ("post", "/v1/threads/{thread_id}/checkpoints/items"): "getCheckpointItems",
    ("get", "/v1/threads/{thread_id}/checkpoints/{checkpoint_id}"): "getCheckpoint",
    ("post", "/v1/threads/{thread_id}/checkpoints/{checkpoint_id}/writes"):
        "putCheckpointWrites",
    ("post", "/v1/checkpoints/delete-runs"): "deleteCheckpointRuns",
    ("get", "/v1/messages/{message_id}/lineage"): "getMessageLineage",
    ("get", "/v1/store/items/{namespace}/{key}"): "getStoreItem",
    ("put", "/v1/store/items/{namespace}/{key}"): "putStoreItem",
    ("patch", "/v1/store/items/{namespace}/{key}"): "patchStoreItem",
    ("delete", "/v1/store/items/{namespace}/{key}"): "deleteStoreItem",
    ("post", "/v1/store/items/search"): "searchStoreItems",
    ("post", "/v1/store/namespaces"): "listStoreNamespaces",
}


def operations() -> list[tuple[str, str]]:
    """(method, path) of every operation, from the app's routes (collected once)."""
    spec = create_app(Settings(database_url="sqlite+aiosqlite:///:memory:",  # type: ignore[call-arg]
                               auto_migrate=False, _env_file=None)).openapi()
    return [(method, path) for path, item in spec["paths"].items()
            for method in item if method in METHODS]


OPERATIONS = operations()
OP_IDS = [f"{method.upper()} {path}" for method, path in OPERATIONS]


@pytest.fixture(scope="module")
async def spec(database_url: str) -> dict[str, Any]:
    """The live document, fetched once per backend."""
    settings = Settings(database_url=database_url, auto_migrate=False,  # type: ignore[call-arg]
                        _env_file=None)
    async with running(settings) as application, http_client(application) as client:
        response = await client.get("/openapi.json")
    assert response.status_code == 200
    return response.json()


def op(spec: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    return spec["paths"][path][method]


def touches_database(path: str) -> bool:
    return path.startswith("/v1/") or path == "/readyz"


def takes_keys(path: str) -> bool:
    return path.startswith("/v1/")


async def test_operation_ids_are_readable_and_stable(spec: dict[str, Any],
                                                     request: pytest.FixtureRequest) -> None:
    found = {(m, p): op(spec, m, p)["operationId"] for m, p in OPERATIONS}
    assert found == OPERATION_IDS
    assert all(re.fullmatch(r"[a-z]+(?:[A-Z][a-z]*)*", name) for name in found.values())


@pytest.mark.parametrize("method, path", OPERATIONS, ids=OP_IDS)
async def test_every_error_status_is_a_problem(spec: dict[str, Any], method: str, path: str,
                                               request: pytest.FixtureRequest) -> None:
    """Each 4xx/5xx declares application/problem+json with the Problem schema, and nothing
    else (today FastAPI adds an application/json twin we never send)."""
    for status, response in op(spec, method, path)["responses"].items():
        if int(status) >= 400:
            assert response.get("content") == {"application/problem+json": {"schema": PROBLEM}}, (
                status, response.get("content"))


@pytest.mark.parametrize("method, path", OPERATIONS, ids=OP_IDS)
async def test_declared_statuses(spec: dict[str, Any], method: str, path: str,
                                 request: pytest.FixtureRequest) -> None:
    operation = op(spec, method, path)
    declared = set(operation["responses"])
    expected: set[str] = set()
    if "requestBody" in operation:
        expected |= {"413", "415"}
    if touches_database(path):
        expected.add("503")
    if takes_keys(path):
        expected |= {"401", "403"}
    assert expected <= declared, sorted(expected - declared)
    if not takes_keys(path):
        assert not {"401", "403"} & declared, "no keys apply here"


def required_headers(spec: dict[str, Any], method: str, path: str) -> dict[str, set[str]]:
    """status -> the response headers we send with it."""
    operation = op(spec, method, path)
    headers: dict[str, set[str]] = {}

    def need(status: str, name: str) -> None:
        if status in operation["responses"]:
            headers.setdefault(status, set()).add(name)

    for status in operation["responses"]:
        if status == "503":
            need(status, "Retry-After")
        if status == "401":
            need(status, "WWW-Authenticate")
    revisioned = re.search(r"/v1/threads/\{thread_id\}$|/state$|/v1/mcp-servers/\{server_name\}$"
                           r"|/v1/store/items/\{namespace\}/\{key\}$", path)
    if revisioned and method in ("get", "put", "patch"):
        need("200", "ETag")
        need("304", "ETag")
    if method == "put":
        need("201", "ETag")
        need("201", "Location")
    if (method, path) in (("post", "/v1/threads"), ("post", "/v1/threads/{thread_id}/fork")):
        need("201", "ETag")
        need("201", "Location")
    if (method, path) == ("post", "/v1/threads/{thread_id}/messages"):
        need("201", "ETag")
        need("201", "Idempotent-Replayed")
    if (method, path) == ("post", "/v1/threads/{thread_id}/compactions"):
        need("201", "Location")
        need("201", "Idempotent-Replayed")
    if any(p.get("name") == "cursor" for p in operation.get("parameters", [])):
        need("200", "Link")
    return headers


@pytest.mark.parametrize("method, path", OPERATIONS, ids=OP_IDS)
async def test_response_headers_are_declared(spec: dict[str, Any], method: str, path: str,
                                             request: pytest.FixtureRequest) -> None:
    required = required_headers(spec, method, path)
    responses = op(spec, method, path)["responses"]
    missing = {status: names - set(responses[status].get("headers", {}))
               for status, names in required.items()}
    assert not any(missing.values()), missing


CANONICAL_HEADERS = {"If-Match", "If-None-Match", "Idempotency-Key", "Last-Event-ID"}


@pytest.mark.parametrize("method, path", OPERATIONS, ids=OP_IDS)
async def test_header_parameters_are_spelled_one_way(spec: dict[str, Any], method: str,
                                                     path: str,
                                                     request: pytest.FixtureRequest) -> None:
    headers = [p for p in op(spec, method, path).get("parameters", []) if p["in"] == "header"]
    for parameter in headers:
        assert parameter["name"] in CANONICAL_HEADERS, parameter["name"]
        if parameter["name"] in ("If-Match", "If-None-Match"):
            schemas = [parameter["schema"], *parameter["schema"].get("anyOf", [])]
            assert any("pattern" in schema for schema in schemas), parameter


BODYLESS = [(m, p) for m, p in OPERATIONS if m in ("get", "delete") and takes_keys(p)
            and not p.endswith("/stream")]


@pytest.mark.parametrize("header", ["If-Match", "If-None-Match", "Idempotency-Key"])
async def test_the_headers_read_are_the_headers_declared(spec: dict[str, Any],
                                                         client: httpx.AsyncClient,
                                                         header: str) -> None:
    """These headers are read by the dependencies themselves and declared in the document
    by app/http/openapi.py, not by FastAPI from a parameter: an operation reads a header
    (a malformed value is a 400 `invalid_header`) exactly when the document declares it."""
    value = "x" * 300 if header == "Idempotency-Key" else "no-quotes"
    reads, declares = set(), set()
    for method, path in BODYLESS:
        url = re.sub(r"\{[^}]+\}", "some-name", path)
        answer = await client.request(method.upper(), url, headers={header: value})
        if answer.status_code == 400 and answer.json()["code"] == "invalid_header":
            reads.add(f"{method.upper()} {path}")
        if header in {p["name"] for p in op(spec, method, path).get("parameters", [])}:
            declares.add(f"{method.upper()} {path}")
    assert reads == declares
    if header == "If-Match":  # the check sees something: the revisioned GETs and DELETEs
        assert "GET /v1/threads/{thread_id}" in reads
        assert "DELETE /v1/threads/{thread_id}/messages/{message_id}" in reads


def admits_null(schema: dict[str, Any]) -> bool:
    return (schema.get("type") == "null" or "null" in (schema.get("type") or [])
            or any(admits_null(branch) for branch in schema.get("anyOf", [])))


@pytest.mark.parametrize("method, path", OPERATIONS, ids=OP_IDS)
async def test_query_and_header_parameters_admit_no_null(
        spec: dict[str, Any], method: str, path: str, request: pytest.FixtureRequest) -> None:
    """A query string or a header has no null (an absent parameter is the None), so a schema
    with a null branch says what no request can send, and a fuzzer reads its other branches
    as a type check the server does not make: `?thread_id=false` is the thread "false"."""
    for parameter in op(spec, method, path).get("parameters", []):
        if parameter["in"] in ("query", "header"):
            assert not admits_null(parameter["schema"]), parameter


@pytest.mark.parametrize("method, path", [o for o in OPERATIONS if takes_keys(o[1])],
                         ids=[i for i, o in zip(OP_IDS, OPERATIONS, strict=True)
                              if takes_keys(o[1])])
async def test_security_lets_anonymous_calls_validate(spec: dict[str, Any], method: str,
                                                      path: str,
                                                      request: pytest.FixtureRequest) -> None:
    """An open server answers calls without a key: `{}` must be one of the alternatives."""
    security = op(spec, method, path).get("security", spec.get("security"))
    assert {} in security and {"ApiKey": []} in security, security


async def test_the_version_is_the_installed_packages(spec: dict[str, Any],
                                                     request: pytest.FixtureRequest) -> None:
    """One source of truth: the package metadata, which `agentstate --version` prints too
    (tests/test_startup.py)."""
    assert spec["info"]["version"] == metadata.version("agentstate")


async def test_tags_are_described(spec: dict[str, Any], request: pytest.FixtureRequest) -> None:
    used = {tag for m, p in OPERATIONS for tag in op(spec, m, p).get("tags", [])}
    described = {tag["name"]: tag.get("description") for tag in spec.get("tags", [])}
    assert used <= described.keys(), sorted(used - described.keys())
    assert all(described[tag] for tag in used)


@pytest.mark.parametrize("method, path", [o for o in OPERATIONS if o[0] in ("put", "patch", "post")],
                         ids=[i for i, o in zip(OP_IDS, OPERATIONS, strict=True)
                              if o[0] in ("put", "patch", "post")])
async def test_request_bodies_have_examples(spec: dict[str, Any], method: str, path: str,
                                            request: pytest.FixtureRequest) -> None:
    content = op(spec, method, path)["requestBody"]["content"]
    for media, body in content.items():
        assert "example" in body or "examples" in body, media


# --- /docs offline ---------------------------------------------------------------------------

class _Assets(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href") and value:
                self.urls.append(value)


def referenced(html: str) -> list[str]:
    """URLs the page loads: src/href attributes and the URLs in its inline scripts."""
    parser = _Assets()
    parser.feed(html)
    inline = re.findall(r"""['"]((?:https?:)?//[^'"]+|/[^'"\s]+\.(?:js|css|png))['"]""", html)
    return parser.urls + inline


async def test_docs_work_offline(client: httpx.AsyncClient,
                                 request: pytest.FixtureRequest) -> None:
    page = await client.get("/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    urls = referenced(page.text)
    assert urls, "the page loads Swagger UI from somewhere"
    for url in urls:
        assert not urlsplit(url).netloc, f"/docs loads {url} from another host"
        if url.endswith((".js", ".css", ".png")):
            asset = await client.get(urljoin("http://agentstate.test/docs", url))
            assert asset.status_code == 200, url
    for other in ("/redoc",):
        response = await client.get(other)
        if response.status_code == 200:
            assert not any(urlsplit(url).netloc for url in referenced(response.text)), other
        else:
            assert response.status_code == 404
