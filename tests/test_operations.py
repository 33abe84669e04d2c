"""/healthz, /readyz, /metrics, /openapi.json and behaviour when the database goes away."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re

import httpx
import pytest
from sqlalchemy.engine import make_url

from app.core.settings import Settings
from app.main import create_app
from tests.support import ServerProcess, create_postgres_database, drop_postgres_database

pytestmark = pytest.mark.anyio


async def test_health_and_ready(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = await client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"


@pytest.fixture
def unmigrated_postgres() -> str:
    url = create_postgres_database()
    yield url
    drop_postgres_database(url)


async def test_readyz_503_until_migrated(unmigrated_postgres: str) -> None:
    app = create_app(Settings(database_url=unmigrated_postgres, _env_file=None))  # type: ignore[call-arg]
    assert app.state.settings.should_auto_migrate is False, "Postgres is never auto-migrated"
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t") as client:
            response = await client.get("/readyz")
            assert response.status_code == 503
            assert response.json()["code"] == "not_ready"
            assert "agentstate migrate" in response.json()["detail"]
            assert int(response.headers["retry-after"]) >= 1


async def test_sqlite_default_migrates_itself(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("AGENTSTATE_DATABASE_URL", raising=False)
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert settings.database_url == f"sqlite+aiosqlite:///{tmp_path}/xdg/agentstate/state.db"
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t") as client:
            assert (await client.get("/readyz")).status_code == 200
            assert (await client.post("/v1/threads", json={})).status_code == 201
    assert (tmp_path / "xdg" / "agentstate" / "state.db").exists()


def test_xdg_fallback(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert Settings(_env_file=None).database_url.endswith(  # type: ignore[call-arg]
        f"{tmp_path}/.local/share/agentstate/state.db")
    assert Settings(database_url="postgresql://u:p@h/db", _env_file=None).database_url == (  # type: ignore[call-arg]
        "postgresql+asyncpg://u:p@h/db")


async def test_metrics(client: httpx.AsyncClient, uid: str) -> None:
    await client.put(f"/v1/threads/m-{uid}", json={"state": {}})
    await client.put(f"/v1/threads/m-{uid}", json={"state": {}}, headers={"If-Match": '"9"'})
    text = (await client.get("/metrics")).text
    assert 'agentstate_http_requests_total{method="PUT",route="/v1/threads/{thread_id}",status="412"}' in text
    assert "agentstate_http_request_duration_seconds_bucket" in text
    assert 'agentstate_precondition_failures_total{route="/v1/threads/{thread_id}"}' in text
    assert "agentstate_db_pool_in_use" in text


def concrete(path: str) -> str:
    """An OpenAPI path with its parameters filled in (`checkpoint_id` is not a reserved word)."""
    return re.sub(r"\{[a-z_]+\}", lambda m: "1" if m.group() == "{revision}" else "x", path)


async def test_metrics_route_labels_are_the_openapi_paths(client: httpx.AsyncClient) -> None:
    """Every operation, HEAD of every GET, /docs and /openapi.json is counted under its
    route's path as the OpenAPI document writes it; "unmatched" for a path no route has.
    (HEAD and the documentation pages were "unmatched", and one checkpoint route was
    labelled `{checkpoint_id:checkpoint_id}`.)"""
    spec = (await client.get("/openapi.json")).json()
    expected = {("GET", "/openapi.json")}
    for path, item in spec["paths"].items():
        for method in item:
            expected.add((method.upper(), path))
            stream = method == "get" and path == "/v1/events/stream"  # it never ends: 406
            await client.request(method.upper(), concrete(path),
                                 headers={"Accept": "application/json"} if stream else None)
            if method == "get" and not stream:
                expected.add(("HEAD", path))
                await client.head(concrete(path))
    for path, template in (("/docs", "/docs"), ("/docs/assets/favicon.png",
                                                 "/docs/assets/{name}"), ("/nowhere", "unmatched")):
        await client.get(path)
        expected.add(("GET", template))
    text = (await client.get("/metrics")).text
    labelled = set(re.findall(r'^agentstate_http_requests_total\{method="([A-Z]+)",'
                              r'route="([^"]+)"', text, flags=re.MULTILINE))
    assert labelled == expected, (sorted(labelled - expected), sorted(expected - labelled))


# Resources under section 2's rules, where a write without a precondition answers 428.
REVISIONED = {"/v1/threads/{thread_id}", "/v1/threads/{thread_id}/agents/{agent_name}/state",
              "/v1/mcp-servers/{server_name}"}


async def test_openapi_declares_errors(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    assert "Problem" in spec["components"]["schemas"]
    for path, operations in spec["paths"].items():
        if not path.startswith("/v1"):
            continue
        for method, operation in operations.items():
            declared = set(operation["responses"])
            assert {"400", "422", "503"} <= declared, (method, path)
            if method in ("put", "patch", "delete"):
                assert "412" in declared, (method, path)
            if method in ("put", "patch", "delete") and path in REVISIONED:
                assert "428" in declared, (method, path)  # If-Match required there
            problem = operation["responses"]["422"]["content"]["application/problem+json"]
            assert problem["schema"]["$ref"] == "#/components/schemas/Problem"


class Proxy:
    """A TCP proxy in front of Postgres that the test can cut and restore."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.server: asyncio.Server | None = None
        self.port = 0
        self.tasks: set[asyncio.Task] = set()
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:  # like a database that went down: connections drop
            writer.close()
        self.writers.clear()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        for task in (asyncio.create_task(pipe(reader, up_writer)),
                     asyncio.create_task(pipe(up_reader, writer))):
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)


@pytest.mark.postgres_only(reason="an outage needs a database across a network; SQLite is a "
                           "file in the server's process")
async def test_database_outage_is_503_and_recovers(database_url: str, uid: str) -> None:
    url = make_url(database_url)
    proxy = Proxy(url.host or "127.0.0.1", url.port or 5432)
    await proxy.start()
    proxied = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    # No cache of what was read about API keys: every request looks them up, the writes'
    # in the body-limit middleware before any exception handler.
    app = create_app(Settings(database_url=proxied, pool_timeout=2, connect_timeout=2,
                              auth_cache_seconds=0, _env_file=None))  # type: ignore[call-arg]
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t") as client:
            assert (await client.post("/v1/threads", json={"thread_id": uid})).status_code == 201
            await proxy.stop()
            down = await client.get(f"/v1/threads/{uid}")
            assert down.status_code == 503, down.text
            assert down.headers["content-type"] == "application/problem+json"
            assert down.json()["code"] == "database_unavailable"
            assert int(down.headers["retry-after"]) >= 1
            assert (await client.get("/readyz")).status_code == 503
            for write in (
                    await client.put(f"/v1/threads/{uid}", json={"state": {}},
                                     headers={"If-Match": '"1"'}),
                    await client.post(f"/v1/threads/{uid}/messages",
                                      json={"role": "user", "content": "hi"}),
                    await client.post("/v1/batch", json={"operations": [
                        {"op": "thread.patch", "thread_id": uid, "if_match": "*",
                         "body": {"state": {}}}]})):
                assert write.status_code == 503, write.text
                assert int(write.headers["retry-after"]) >= 1

            await proxy.start()  # same port: the database is back
            back = await client.get(f"/v1/threads/{uid}")
            assert back.status_code == 200, "recovers without a restart"
            assert (await client.get("/readyz")).status_code == 200
    await proxy.stop()


@pytest.mark.slow
def test_logs_are_json_lines_with_request_ids_and_no_bodies(database_url: str, uid: str) -> None:
    marker = f"body-secret-{uid}"
    with ServerProcess(database_url) as server:
        httpx.put(f"{server.base_url}/v1/threads/{uid}", json={"state": {"token": marker}},
                  headers={"X-Request-ID": f"req-{uid}", "Cookie": f"session={marker}"})
        httpx.get(f"{server.base_url}/v1/threads/{uid}?note={marker}")
    lines = [line for line in server.logs().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    access = [r for r in records if r["logger"] == "agentstate.access"]
    assert any(r.get("request_id") == f"req-{uid}" and r["status"] == 201 for r in access)
    assert all(r["route"] != "unmatched" for r in access)
    assert marker not in server.logs(), "bodies, headers and query strings are never logged"


@pytest.mark.postgres_only(reason="a connection limit is a Postgres setting")
async def test_a_database_out_of_connections_is_503(database_url: str, uid: str) -> None:
    """Postgres refusing a connection (SQLSTATE 53300, too many connections) is the database
    being unavailable, like an outage: 503 with Retry-After, not an internal error."""
    import asyncpg

    url = make_url(database_url)
    role = f"limited_{uid}"
    admin = await asyncpg.connect(host=url.host, port=url.port or 5432, user=url.username,
                                  password=url.password, database=url.database)
    # Superusers ignore connection limits, so the server logs in as a role allowed one.
    await admin.execute(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 1')
    await admin.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{role}"')
    limited = url.set(username=role, password=None)
    held = await asyncpg.connect(host=url.host, port=url.port or 5432, user=role,
                                 database=url.database)  # the role's one connection
    try:
        app = create_app(Settings(database_url=limited.render_as_string(hide_password=False),
                                  _env_file=None))  # type: ignore[call-arg]
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            refused = await client.get(f"/v1/threads/{uid}")
            assert refused.status_code == 503, refused.text
            assert refused.headers["content-type"] == "application/problem+json"
            assert refused.json()["code"] == "database_unavailable"
            assert int(refused.headers["retry-after"]) >= 1
            await held.close()  # the slot is free again
            assert (await client.get(f"/v1/threads/{uid}")).status_code == 404
    finally:
        await held.close()
        await admin.execute(f'DROP OWNED BY "{role}"')
        await admin.execute(f'DROP ROLE "{role}"')
        await admin.close()
