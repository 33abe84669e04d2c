"""MCP server secrets: redaction, encryption at rest, key rotation, the embedded key file."""

from __future__ import annotations

import json
import stat
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import text
from sqlalchemy.engine import make_url

from app.auth.service import ApiKeyService, parse_scopes
from app.core.secretbox import new_key
from app.core.settings import Settings
from app.db.engine import Database
from app.main import create_app
from tests.conftest import migrated_database
from tests.support import (
    ServerProcess,
    agentstate,
    create_postgres_database,
    drain,
    drop_postgres_database,
)

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def serving(settings: Settings, *keys: str) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings.model_copy(update={"secret_keys": [SecretStr(k) for k in keys]}))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t") as client:
            yield client


def cli(database_url: str, *args: str, keys: str = "") -> subprocess.CompletedProcess[str]:
    return agentstate(database_url, *args, env={"AGENTSTATE_SECRET_KEYS": keys})


@pytest.fixture
def fresh_url(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An empty migrated database of this backend, for tests that look at every row."""
    with migrated_database(backend, tmp_path_factory) as url:
        yield url


async def test_write_rules_and_redaction(keyed_client: httpx.AsyncClient, uid: str) -> None:
    c, u = keyed_client, f"/v1/mcp-servers/s-{uid}"

    async def clear() -> dict:
        r = await c.get(u, params={"include_secrets": "true"})
        assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
        return r.json()["secrets"]

    await c.put(u, json={"server_type": "broker", "secrets": {"a": "A1", "b": "B1"}})
    masked = await c.get(u)
    assert masked.json()["secrets"] == {"a": "***", "b": "***"}
    assert "cache-control" not in masked.headers
    assert await clear() == {"a": "A1", "b": "B1"}

    await c.put(u, json={"server_type": "broker", "secrets": {"a": "***", "c": "C1"}},
                headers={"If-Match": '"1"'})
    assert await clear() == {"a": "A1", "c": "C1"}, '"***" keeps, PUT drops what it omits'
    await c.put(u, json={"server_type": "broker", "state": {"x": 1}}, headers={"If-Match": '"2"'})
    assert await clear() == {"a": "A1", "c": "C1"}, "omitted secrets are kept"
    await c.patch(u, json={"secrets": {"a": "***", "c": None, "d": "D1"}},
                  headers={"If-Match": '"3"'})
    assert await clear() == {"a": "A1", "d": "D1"}
    await c.patch(u, json={"secrets": {"a": "A2"}}, headers={"If-Match": '"4"'})
    assert await clear() == {"a": "A2", "d": "D1"}
    unknown = await c.patch(u, json={"secrets": {"zz": "***"}}, headers={"If-Match": '"5"'})
    assert unknown.status_code == 422 and unknown.json()["code"] == "unknown_secret"
    assert unknown.json()["errors"][0]["pointer"] == "/secrets/zz"
    await c.patch(u, json={"secrets": {}}, headers={"If-Match": '"5"'})
    assert await clear() == {}, "{} clears, on PATCH as on PUT"
    await c.put(u, json={"server_type": "b", "secrets": {"k": "v"}}, headers={"If-Match": '"6"'})
    await c.put(u, json={"server_type": "b", "secrets": {}}, headers={"If-Match": '"7"'})
    assert await clear() == {} and (await c.get(u)).json()["secrets"] == {}


async def api_key(url: str, scopes: str) -> dict[str, str]:
    """The Authorization header of a new key of the default tenant with `scopes`."""
    db = Database(Settings(database_url=url, auto_migrate=False, _env_file=None))  # type: ignore[call-arg]
    try:
        async with db.write() as connection:
            _, token = await ApiKeyService(connection).create(
                "default", scopes.replace(",", "-"), parse_scopes(scopes))
            await connection.commit()
    finally:
        await db.dispose()
    return {"Authorization": f"Bearer {token}"}


async def test_include_secrets_needs_the_scope(fresh_url: str, uid: str) -> None:
    """A key with read and write sees secrets masked, and `include_secrets` is 403 naming
    `secrets:read`; a key with that scope reads them."""
    key = new_key()
    settings = Settings(database_url=fresh_url, auto_migrate=False, _env_file=None,  # type: ignore[call-arg]
                        auth_cache_seconds=0)
    writer = await api_key(fresh_url, "read,write")
    reader = await api_key(fresh_url, "read,secrets:read")
    async with serving(settings, key) as c:
        u = f"/v1/mcp-servers/{uid}"
        put = await c.put(u, json={"server_type": "x", "secrets": {"t": "v"}}, headers=writer)
        assert put.status_code == 201, put.text
        assert (await c.get(u, headers=writer)).json()["secrets"] == {"t": "***"}
        for path in (u, "/v1/mcp-servers"):
            denied = await c.get(path, params={"include_secrets": "true"}, headers=writer)
            assert denied.status_code == 403 and "secrets:read" in denied.json()["detail"]
        allowed = await c.get(u, params={"include_secrets": "true"}, headers=reader)
        assert allowed.json()["secrets"] == {"t": "v"}


@pytest.mark.postgres_only(reason="on SQLite a key is generated beside the database file")
async def test_without_a_key_secrets_are_refused(database_url: str, client: httpx.AsyncClient,
                                                 uid: str) -> None:
    u = f"/v1/mcp-servers/{uid}"
    refused = await client.put(u, json={"server_type": "x", "secrets": {"t": "v"}})
    # The operator's fix, not the client's: 503, never a 500.
    assert refused.status_code == 503 and refused.json()["code"] == "secrets_not_configured"
    assert "AGENTSTATE_SECRET_KEYS" in refused.json()["detail"]
    assert (await client.get(u)).status_code == 404, "nothing was written"
    ok = await client.put(u, json={"server_type": "x", "secrets": {}})
    assert ok.status_code == 201, "writes without secrets need no key"
    assert (await client.patch(u, json={"state": {"a": 1}}, headers={"If-Match": '"1"'})
            ).status_code == 200


def database_text(url: str) -> bytes:
    """Every byte the database keeps: the SQLite files, or a full pg_dump."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        path = Path(parsed.database)
        return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))
    dump = subprocess.run(
        ["pg_dump", "-h", parsed.host or "127.0.0.1", "-p", str(parsed.port or 5432),
         "-U", parsed.username or "postgres", parsed.database],
        capture_output=True, timeout=120, check=True)
    return dump.stdout


@pytest.mark.slow
async def test_plaintext_appears_nowhere(database_url: str, uid: str, secret_key: str) -> None:
    secret = f"pl41ntext-{uid}-token"
    env = {"AGENTSTATE_SECRET_KEYS": secret_key, "AGENTSTATE_LOG_LEVEL": "DEBUG"}
    u = f"/v1/mcp-servers/leak-{uid}"
    with ServerProcess(database_url, env=env) as server:
        async with httpx.AsyncClient(base_url=server.base_url) as c:
            responses = [
                await c.put(u, json={"server_type": "broker", "secrets": {"broker_token": secret}}),
                await c.put(u, json={"server_type": "broker", "secrets": {"broker_token": secret}}),
                await c.put(u, json={"server_type": "b", "secrets": {"broker_token": secret}},
                            headers={"If-Match": '"7"'}),
                await c.put(u, json={"server_type": "b", "secrets": {"bad name": secret}}),
                await c.put(u, json={"server_type": "b", "secrets": {"k": [secret]}}),
                await c.patch(u, json={"secrets": {"second": secret * 2}},
                              headers={"If-Match": '"1"'}),
                await c.put(u, json={"server_type": "b", "secrets": {"broker_token": "***"}},
                            headers={"If-Match": '"2"'}),
                await c.get(u),
                await c.get("/v1/mcp-servers"),
            ]
            assert [r.status_code for r in responses] == [201, 428, 412, 422, 422, 200, 200,
                                                          200, 200]
            for r in responses:
                assert secret not in r.text, r.text
            clear = await c.get(u, params={"include_secrets": "true"})
            assert clear.json()["secrets"] == {"broker_token": secret}, "it really is stored"
            events, _ = await drain(c)
            assert f"/v1/mcp-servers/leak-{uid}" in json.dumps(events)
            assert secret not in json.dumps(events)
        logs = server.logs()
    assert secret not in logs and "Traceback" not in logs

    # An export carries the ciphertext and the id of the key that opens it, or
    # nothing of the secrets with --redact-secrets; never the secret in clear.
    from app.core.secretbox import key_id

    exported = cli(database_url, "export", keys=secret_key)
    assert exported.returncode == 0, exported.stderr
    assert secret not in exported.stdout + exported.stderr
    assert f'"server_name":"leak-{uid}"' in exported.stdout
    line = json.loads(next(line for line in exported.stdout.splitlines()
                           if line.startswith('{"kind":"mcp_server"') and f"leak-{uid}" in line))
    assert line["secret_names"] == ["broker_token"]
    assert set(line["secrets"]) == {"ciphertext", "key_id"}
    assert line["secrets"]["key_id"] == key_id(secret_key)
    redacted = cli(database_url, "export", "--redact-secrets", keys=secret_key)
    assert redacted.returncode == 0, redacted.stderr
    assert secret not in redacted.stdout + redacted.stderr
    line = json.loads(next(line for line in redacted.stdout.splitlines()
                           if line.startswith('{"kind":"mcp_server"') and f"leak-{uid}" in line))
    assert line["secrets"] == {"redacted": True}
    assert line["secret_names"] == ["broker_token"]

    stored = database_text(database_url)
    assert f"leak-{uid}".encode() in stored and b"broker_token" in stored
    assert secret.encode() not in stored


@pytest.mark.slow
async def test_key_rotation(fresh_url: str, uid: str) -> None:
    settings = Settings(database_url=fresh_url, auto_migrate=False, _env_file=None)  # type: ignore[call-arg]
    old, new = new_key(), new_key()
    async with serving(settings, old) as c:
        for i in range(3):
            r = await c.put(f"/v1/mcp-servers/r{i}-{uid}",
                            json={"server_type": "x", "secrets": {"t": f"v{i}"}})
            assert r.status_code == 201
        await c.put(f"/v1/mcp-servers/plain-{uid}", json={"server_type": "x"})
        events_before = (await c.get("/v1/events", params={"limit": 100})).json()["data"]
    before = database_text(fresh_url)

    async with serving(settings, new) as c:
        masked = await c.get(f"/v1/mcp-servers/r0-{uid}")
        assert masked.status_code == 200 and masked.json()["secrets"] == {"t": "***"}
        unreadable = await c.get(f"/v1/mcp-servers/r0-{uid}", params={"include_secrets": "true"})
        assert unreadable.status_code == 500
        assert unreadable.json()["code"] == "secrets_undecryptable"
    async with serving(settings, new, old) as c:
        r = await c.get(f"/v1/mcp-servers/r1-{uid}", params={"include_secrets": "true"})
        assert r.json()["secrets"] == {"t": "v1"}, "any configured key decrypts"

    failed = cli(fresh_url, "secrets", "rotate", keys=new)
    assert failed.returncode == 1 and f"default/r0-{uid}" in failed.stderr
    assert "v0" not in failed.stderr
    rotated = cli(fresh_url, "secrets", "rotate", keys=f"{new},{old}")
    assert rotated.returncode == 0, rotated.stderr
    assert "re-encrypted the secrets of 3 MCP servers" in rotated.stderr
    assert database_text(fresh_url) != before

    async with serving(settings, new) as c:
        for i in range(3):
            r = await c.get(f"/v1/mcp-servers/r{i}-{uid}", params={"include_secrets": "true"})
            assert r.status_code == 200 and r.json()["secrets"] == {"t": f"v{i}"}
            assert r.json()["revision"] == 1, "rotation changes no resource"
        events_after = (await c.get("/v1/events", params={"limit": 100})).json()["data"]
    assert events_after == events_before, "rotation is not a change of any resource"
    assert cli(fresh_url, "secrets", "rotate", keys="not-a-key").returncode == 2


async def test_ciphertext_is_bound_to_its_owner(keyed_client: httpx.AsyncClient,
                                                database_url: str, uid: str) -> None:
    a, b = f"/v1/mcp-servers/own-a-{uid}", f"/v1/mcp-servers/own-b-{uid}"
    await keyed_client.put(a, json={"server_type": "x", "secrets": {"t": "for-a"}})
    await keyed_client.put(b, json={"server_type": "x", "secrets": {"t": "for-b"}})
    db = Database(Settings(database_url=database_url, _env_file=None))  # type: ignore[call-arg]
    try:
        async with db.engine.begin() as connection:
            await connection.execute(text(
                "UPDATE mcp_servers SET secrets = (SELECT secrets FROM mcp_servers "
                "WHERE server_name = :a) WHERE server_name = :b"),
                {"a": f"own-a-{uid}", "b": f"own-b-{uid}"})
    finally:
        await db.dispose()
    moved = await keyed_client.get(b, params={"include_secrets": "true"})
    assert moved.status_code == 500 and moved.json()["code"] == "secrets_undecryptable"
    assert "for-a" not in moved.text


async def test_embedded_default_generates_a_key_once(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    for name in ("AGENTSTATE_DATABASE_URL", "AGENTSTATE_SECRET_KEYS"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    key_file = tmp_path / "agentstate" / "secret.key"
    async with serving(settings) as c:
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        put = await c.put("/v1/mcp-servers/local", json={"server_type": "x",
                                                          "secrets": {"t": "local-secret"}})
        assert put.status_code == 201, put.text
    key = key_file.read_text()
    async with serving(settings) as c:
        r = await c.get("/v1/mcp-servers/local", params={"include_secrets": "true"})
        assert r.json()["secrets"] == {"t": "local-secret"}
    assert key_file.read_text() == key, "generated once, then reused"
    assert [p.name for p in key_file.parent.iterdir() if "secret" in p.name] == ["secret.key"]


@pytest.mark.slow
async def test_a_move_from_sqlite_names_the_key_the_secrets_need(tmp_path: Path,
                                                                 uid: str) -> None:
    """SQLite to Postgres: every message on the way names the `secret.key` beside the source
    and AGENTSTATE_SECRET_KEYS; none offers a new key as the fix; the key opens them."""
    source = f"sqlite+aiosqlite:///{tmp_path}/state.db"
    key_file = tmp_path / "secret.key"
    assert agentstate(source, "migrate").returncode == 0
    settings = Settings(database_url=source, auto_migrate=False, _env_file=None)  # type: ignore[call-arg]
    async with serving(settings) as c:  # the embedded default: its key file beside the file
        put = await c.put(f"/v1/mcp-servers/m-{uid}", json={"server_type": "x",
                                                             "secrets": {"t": "moved"}})
        assert put.status_code == 201, put.text
    target = await anyio.to_thread.run_sync(create_postgres_database)
    try:
        for run in ("first", "again"):  # a rerun copies nothing and says it again
            copied = cli(source, "copy", "--from", source, "--to", target)
            assert copied.returncode == 0, copied.stderr
            (line,) = [line for line in copied.stderr.splitlines() if "MCP servers" in line]
            assert line.startswith(f"warning: the secrets of 1 MCP servers are sealed with the "
                                   f"source database's key, {key_file} (key "), (run, line)
            assert "AGENTSTATE_SECRET_KEYS (not set) does not open" in line, line
            assert f"AGENTSTATE_SECRET_KEYS=$(cat {key_file})" in line, line

        # The target's server without the key: said at start, and on reading them.
        with ServerProcess(target, env={"AGENTSTATE_SECRET_KEYS": "",
                                        "AGENTSTATE_LOG_FORMAT": "text"}) as server:
            read = httpx.get(f"{server.base_url}/v1/mcp-servers/m-{uid}",
                             params={"include_secrets": "true"}, timeout=10)
            masked = httpx.get(f"{server.base_url}/v1/mcp-servers/m-{uid}", timeout=10)
        assert masked.status_code == 200, "everything but the secrets works meanwhile"
        assert read.status_code == 503 and read.json()["code"] == "secrets_not_configured"
        detail = read.json()["detail"]
        assert "no key to open the stored secrets" in detail and "encrypt" not in detail
        assert "AGENTSTATE_SECRET_KEYS" in detail and "secret.key" in detail
        assert "A new key cannot open them" in detail, detail
        (said,) = [line for line in server.logs().splitlines() if "encrypted secrets" in line]
        assert said.startswith(f"WARNING agentstate MCP servers hold encrypted secrets (e.g. "
                               f"default/m-{uid}), and no key is configured"), said
        assert "AGENTSTATE_SECRET_KEYS=$(cat /path/to/secret.key)" in said
        assert "cannot open them" in said

        # With the key (after a new one, as a rotation has it) they open, and nothing is said.
        key = key_file.read_text().strip()
        with ServerProcess(target, env={"AGENTSTATE_SECRET_KEYS": f"{new_key()},{key}"}) as server:
            read = httpx.get(f"{server.base_url}/v1/mcp-servers/m-{uid}",
                             params={"include_secrets": "true"}, timeout=10)
        assert read.status_code == 200 and read.json()["secrets"] == {"t": "moved"}, read.text
        assert "stored MCP secrets" not in server.logs()
        assert "encrypted secrets" not in server.logs()
        copied = cli(source, "copy", "--from", source, "--to", target, keys=key)
        assert copied.returncode == 0 and "MCP servers are sealed" not in copied.stderr
    finally:
        await anyio.to_thread.run_sync(drop_postgres_database, target)
