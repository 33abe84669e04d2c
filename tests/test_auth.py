"""API keys, tenants, open mode and the tenant guard (API.md section 9, docs/auth.md).

Keys are made with the real CLI. The table-driven check of every endpoint is in
`test_auth_matrix.py`.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import delete, or_, select, union_all, update

from app.core.settings import Settings
from app.db.tenancy import UnscopedQuery, cross_tenant, request_tenant, unscoped_tables
from app.events.models import Event
from app.http.dependencies import Reader, Writer
from app.main import create_app
from app.ops.listen import is_loopback
from app.threads.models import Thread
from tests.conftest import migrated_database
from tests.support import (
    ROOT,
    ServerProcess,
    agentstate,
    bearer,
    create_key,
    free_port,
    key_id,
    revoke_key,
)

pytestmark = pytest.mark.anyio
TOKEN = re.compile(r"^agst_[0-9a-f]{16}_[A-Za-z0-9_-]{43}$")


def app_for(url: str, **overrides: object) -> FastAPI:
    settings = Settings(  # type: ignore[call-arg]
        database_url=url, auto_migrate=False, _env_file=None, **overrides)
    return create_app(settings)


async def actors(app: FastAPI, tenant: str, thread_id: str) -> list[str]:
    async with app.state.db.read() as session:
        rows = await session.execute(
            select(Event.actor).where(Event.tenant_id == tenant, Event.thread_id == thread_id)
            .order_by(Event.id))  # the sequencer's order; seq may not be numbered yet
        return list(rows.scalars())


def assert_401(response: httpx.Response) -> dict:
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert response.headers["content-type"] == "application/problem+json"
    return response.json()


# --- the CLI -------------------------------------------------------------------------------

@pytest.mark.slow
def test_keys_cli(secured_database_url: str, uid: str) -> None:
    created = agentstate(secured_database_url, "keys", "create", "--tenant", f"t-{uid}",
                         "--name", "ci", "--scopes", "read,secrets:read")
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    assert TOKEN.match(token) and created.stdout == token + "\n", "stdout is the token alone"
    assert key_id(token) in created.stderr and "only this once" in created.stderr
    assert token not in created.stderr

    listed = agentstate(secured_database_url, "keys", "list", "--tenant", f"t-{uid}")
    assert listed.returncode == 0, listed.stderr
    assert key_id(token) in listed.stdout and "read,secrets:read" in listed.stdout
    as_json = agentstate(secured_database_url, "keys", "list", "--json")
    assert key_id(token) in as_json.stdout
    for output in (listed.stdout, as_json.stdout):
        assert token.split("_", 2)[2] not in output and "hash" not in output

    revoked = agentstate(secured_database_url, "keys", "revoke", key_id(token))
    assert revoked.returncode == 0 and "revoked" in revoked.stderr
    again = agentstate(secured_database_url, "keys", "revoke", key_id(token))
    assert again.returncode == 0 and "already revoked" in again.stderr
    listed = agentstate(secured_database_url, "keys", "list", "--tenant", f"t-{uid}", "--json")
    assert '"revoked_at": null' not in listed.stdout

    for bad in (["revoke", "0123456789abcdef"],
                ["create", "--name", "x", "--scopes", "read,wirte"],
                ["create", "--name", "x", "--tenant", ".hidden"]):
        refused = agentstate(secured_database_url, "keys", *bad)
        assert refused.returncode == 1 and refused.stderr.startswith("agentstate: "), bad
        assert "Traceback" not in refused.stderr and refused.stdout == ""


# --- keys over HTTP ------------------------------------------------------------------------

@pytest.mark.slow
async def test_key_names_tenant_scopes_and_actor(secured_app: FastAPI,
                                                 secured_client: httpx.AsyncClient,
                                                 secured_database_url: str, uid: str) -> None:
    tenant = f"t-{uid}"
    writer = create_key(secured_database_url, tenant)
    reader = create_key(secured_database_url, tenant, "read")
    admin = create_key(secured_database_url, tenant, "admin")

    made = await secured_client.put(f"/v1/threads/{uid}", json={"state": {"n": 1}},
                             headers=bearer(writer))
    assert made.status_code == 201, made.text
    read = await secured_client.get(f"/v1/threads/{uid}", headers=bearer(reader))
    assert read.status_code == 200
    denied = await secured_client.delete(f"/v1/threads/{uid}", headers={**bearer(reader),
                                                                  "If-Match": '"1"'})
    assert denied.status_code == 403 and denied.json()["code"] == "forbidden"
    assert "'write'" in denied.json()["detail"]
    patched = await secured_client.patch(f"/v1/threads/{uid}", json={"state": {"n": 2}},
                                  headers={**bearer(admin), "If-Match": '"1"'})
    assert patched.status_code == 200, "admin implies every scope"
    assert await actors(secured_app, tenant, uid) == [key_id(writer), key_id(admin)]


@pytest.mark.slow
async def test_bad_credentials_are_401(secured_client: httpx.AsyncClient, secured_database_url: str,
                                       uid: str) -> None:
    token = create_key(secured_database_url, f"t-{uid}")
    body = assert_401(await secured_client.get("/v1/threads"))
    assert "agentstate keys create" in body["detail"] and body["code"] == "unauthorized"
    flipped = token[:-1] + ("B" if token.endswith("A") else "A")
    for header in (f"Bearer {flipped}",
                   f"Bearer agst_{'0' * 16}_{token.split('_', 2)[2]}", "Bearer nonsense",
                   "Bearer ", f"Basic {token}", token, f"bearer {token}x"):
        body = assert_401(await secured_client.get("/v1/threads",
                                                   headers={"Authorization": header}))
        assert token not in body["detail"]
    # The scheme name is case-insensitive (RFC 9110).
    assert (await secured_client.get("/v1/threads", headers={"Authorization": f"bearer {token}"})
            ).status_code == 200


@pytest.mark.slow
async def test_tenants_never_see_each_other(secured_client: httpx.AsyncClient,
                                            secured_database_url: str, uid: str) -> None:
    a = create_key(secured_database_url, f"a-{uid}")
    b = create_key(secured_database_url, f"b-{uid}")
    assert (await secured_client.put(f"/v1/threads/{uid}", json={"state": {"owner": "a"}},
                              headers=bearer(a))).status_code == 201
    hidden = await secured_client.get(f"/v1/threads/{uid}", headers=bearer(b))
    missing = await secured_client.get(f"/v1/threads/x{uid}", headers=bearer(b))
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json() == {**missing.json(), "detail": missing.json()["detail"].replace(
        f"x{uid}", uid), "instance": f"/v1/threads/{uid}"}
    assert (await secured_client.get("/v1/threads", headers=bearer(b))).json()["data"] == []

    # The same id is B's own thread: made, changed and deleted without touching A's.
    assert (await secured_client.put(f"/v1/threads/{uid}", json={"state": {"owner": "b"}},
                              headers=bearer(b))).status_code == 201
    deleted = await secured_client.delete(f"/v1/threads/{uid}",
                                          headers={**bearer(b), "If-Match": '"1"'})
    assert deleted.status_code == 204
    mine = await secured_client.get(f"/v1/threads/{uid}", headers=bearer(a))
    assert mine.status_code == 200 and mine.json()["state"] == {"owner": "a"}
    assert mine.json()["revision"] == 1


async def test_open_mode_is_anonymous_default_tenant(app: FastAPI, client: httpx.AsyncClient,
                                                     uid: str) -> None:
    """The shared test database has no key: the server runs open."""
    made = await client.post("/v1/threads", json={"thread_id": uid})
    assert made.status_code == 201
    assert await actors(app, "default", uid) == ["anonymous"]
    # A key that does not exist is refused even here: the client is misconfigured.
    assert_401(await client.get(f"/v1/threads/{uid}",
                                headers=bearer(f"agst_{'1' * 16}_{'x' * 43}")))


async def test_required_keys_refuse_anonymous_even_without_keys(database_url: str) -> None:
    app = app_for(database_url, require_api_keys=True)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t") as client:
            assert_401(await client.get("/v1/threads"))
            assert (await client.get("/healthz")).status_code == 200


# --- serving beyond loopback ---------------------------------------------------------------

@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("[::1]", True),
    ("localhost", True), ("LOCALHOST", True), ("0.0.0.0", False), ("::", False),
    ("192.168.1.5", False), ("example.com", False), ("", False),
])
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.slow
def test_serve_refuses_public_address_without_keys(tmp_path_factory: pytest.TempPathFactory,
                                                   backend: str) -> None:
    with migrated_database(backend, tmp_path_factory) as url:
        refused = subprocess.run(
            [sys.executable, "-m", "app.cli", "serve", "--host", "0.0.0.0",
             "--port", str(free_port())],
            cwd=ROOT, env={"PATH": "/usr/bin:/bin", "AGENTSTATE_DATABASE_URL": url},
            capture_output=True, text=True, timeout=60,
        )
        assert refused.returncode == 2, refused.stderr
        assert "agentstate keys create --tenant" in refused.stderr
        assert "loopback" in refused.stderr

        token = create_key(url, "ops")
        with ServerProcess(url, args=("--host", "0.0.0.0")) as server:
            assert_401(httpx.get(f"{server.base_url}/v1/threads"))
            assert httpx.get(f"{server.base_url}/v1/threads",
                             headers=bearer(token)).status_code == 200


@pytest.mark.slow
def test_cli_changes_reach_a_running_server(tmp_path_factory: pytest.TempPathFactory,
                                            backend: str) -> None:
    """A key made or revoked in another process takes effect within auth_cache_seconds."""
    with migrated_database(backend, tmp_path_factory) as url, ServerProcess(
        url, env={"AGENTSTATE_AUTH_CACHE_SECONDS": "0.5"}
    ) as server:
        threads = f"{server.base_url}/v1/threads"
        assert httpx.get(threads).status_code == 200, "open: no key exists"

        token = create_key(url, "ops")
        wait_for(lambda: httpx.get(threads).status_code == 401, "the first key ends open mode")
        assert httpx.get(threads, headers=bearer(token)).status_code == 200  # now cached

        revoke_key(url, token)
        wait_for(lambda: httpx.get(threads, headers=bearer(token)).status_code == 401,
                 "the revoked key is refused")
        for _ in range(20):
            refused = httpx.get(threads, headers=bearer(token))
            assert refused.status_code == 401 and "revoked" in refused.json()["detail"]


def wait_for(condition, what: str, deadline: float = 60.0) -> None:
    """Poll until true; the deadline only guards against a hang, it measures nothing."""
    end = time.monotonic() + deadline
    while not condition():
        assert time.monotonic() < end, what
        time.sleep(0.1)


@pytest.mark.slow
def test_tokens_never_reach_the_logs(secured_database_url: str, uid: str) -> None:
    good = create_key(secured_database_url, f"t-{uid}")
    revoked = create_key(secured_database_url, f"t-{uid}")
    revoke_key(secured_database_url, revoked)
    secrets = [good, revoked, f"{good[:-3]}abc", f"agst_{'2' * 16}_{'s' * 43}", "Bearer-ish-junk"]
    with ServerProcess(secured_database_url, env={"AGENTSTATE_LOG_LEVEL": "DEBUG"}) as server:
        for token in secrets:
            for method, path in (("GET", "/v1/threads"), ("PUT", f"/v1/threads/{uid}"),
                                 ("GET", f"/v1/threads/{uid}?x=1")):
                httpx.request(method, server.base_url + path, json={"state": {}},
                              headers=bearer(token))
        httpx.get(server.base_url + "/v1/threads", headers={"Authorization": f"Basic {good}"})
    logs = server.logs()
    assert "agentstate.access" in logs and "401" in logs and "200" in logs, logs[-2000:]
    for token in secrets:
        assert token not in logs and token.split("_", 2)[-1] not in logs, token


# --- the tenant guard ----------------------------------------------------------------------

t = Thread.__table__
bare = select(t.c.id).cte("bare")
scoped = select(t.c.id).where(t.c.tenant_id == "a").cte("scoped")


@pytest.mark.parametrize("statement, unscoped", [
    (select(t).where(t.c.tenant_id == "a", t.c.thread_id == "x"), set()),
    (select(Thread).where(Thread.tenant_id == "a"), set()),
    (select(t).where(t.c.tenant_id.in_(["a", "b"])), set()),
    (select(t), {"threads"}),
    (select(Thread).where(Thread.thread_id == "x"), {"threads"}),
    (select(t).where(or_(t.c.tenant_id == "a", t.c.thread_id == "x")), {"threads"}),
    (select(t).where(t.c.tenant_id != "a"), {"threads"}),
    (update(t).where(t.c.thread_id == "x").values(revision=1), {"threads"}),
    (delete(t).where(t.c.thread_id == "x"), {"threads"}),
    (select(t.c.id).select_from(select(t).subquery()), {"threads"}),
    (select(t, Event).join(Event, Event.thread_id == t.c.thread_id).where(t.c.tenant_id == "a"),
     {"events"}),
    (update(t).where(t.c.id == 7).values(revision=1), set()),
    (delete(t).where(t.c.id.in_(select(t.c.id).where(t.c.tenant_id == "a").scalar_subquery())),
     set()),
    (delete(t).where(t.c.id.in_(select(t.c.id).scalar_subquery())), {"threads"}),
    # A CTE referenced twice is walked once, and judged as it is.
    (union_all(select(bare), select(bare)), {"threads"}),
    (union_all(select(scoped), select(scoped)), set()),
    (select(t).join(Event, Event.seq == t.c.id).where(Event.tenant_id == "a"), {"threads"}),
    (select(t, Event).join(Event, (Event.tenant_id == t.c.tenant_id)
                           & (Event.thread_id == t.c.thread_id)).where(t.c.tenant_id == "a"),
     set()),
])
def test_guard_rules(statement: object, unscoped: set[str]) -> None:
    assert unscoped_tables(statement) == unscoped


async def test_guard_stops_unscoped_statements_in_requests(app: FastAPI, uid: str) -> None:
    """An endpoint that forgets the tenant filter answers 500 and reads or writes nothing."""
    # Like a real server: the 500 is the answer, the exception is not re-raised to the caller.
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
                               base_url="http://agentstate.test")
    assert (await client.post("/v1/threads", json={"thread_id": uid})).status_code == 201

    async def careless_read(uow: Reader) -> dict:
        rows = await uow.connection.execute(select(t.c.revision).where(t.c.thread_id == uid))
        return {"revisions": list(rows.scalars())}

    async def careless_write(uow: Writer) -> dict:
        await uow.connection.execute(update(t).where(t.c.thread_id == uid).values(revision=99))
        return {}

    async def deliberate(uow: Reader) -> dict:
        statement = cross_tenant(select(t.c.tenant_id).where(t.c.thread_id == uid))
        rows = await uow.connection.execute(statement)
        return {"tenants": list(rows.scalars())}

    app.add_api_route(f"/v1/careless-read-{uid}", careless_read)
    app.add_api_route(f"/v1/careless-write-{uid}", careless_write, methods=["POST"])
    app.add_api_route(f"/v1/deliberate-{uid}", deliberate)
    for _ in range(2):  # the verdict is cached per compiled statement; it still holds
        for response in (await client.get(f"/v1/careless-read-{uid}"),
                         await client.post(f"/v1/careless-write-{uid}")):
            assert response.status_code == 500, response.text
            assert response.headers["content-type"] == "application/problem+json"
            assert "threads" not in response.text and "SELECT" not in response.text.upper()
    assert (await client.get(f"/v1/deliberate-{uid}")).json() == {"tenants": ["default"]}
    assert (await client.get(f"/v1/threads/{uid}")).json()["revision"] == 1, "nothing written"
    await client.aclose()


async def test_guard_leaves_code_outside_requests_alone(app: FastAPI, uid: str) -> None:
    """CLI maintenance and tests read across tenants; only request handling is guarded."""
    async with app.state.db.read() as session:
        assert (await session.execute(select(t).where(t.c.thread_id == uid))).first() is None
        token = request_tenant.set("default")
        try:
            with pytest.raises(UnscopedQuery, match="threads"):
                await session.execute(select(t).where(t.c.thread_id == uid))
        finally:
            request_tenant.reset(token)


@pytest.mark.slow
async def test_concurrent_first_use_of_a_key(secured_client: httpx.AsyncClient,
                                                             secured_database_url: str,
                                                             uid: str) -> None:
    token = create_key(secured_database_url, f"t-{uid}")
    responses = await asyncio.gather(*(secured_client.get("/v1/threads", headers=bearer(token))
                                       for _ in range(50)))
    assert {r.status_code for r in responses} == {200}
