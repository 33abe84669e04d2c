"""Issue 17: the export format, import, copy and backup, through the CLI and the HTTP API, on
real SQLite and real Postgres.

The CLI runs in-process here (`app.cli.main` in a worker thread, its own event loop); the
tests that run it as a separate process (kill -9 mid-copy, a backup under a live server) are
in tests/test_portability_processes.py and marked slow.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import inspect

from app.core.secretbox import new_key
from app.core.settings import Settings
from app.db import migrate
from app.db.engine import Database
from app.db.models import Base
from app.portability import format as fmt
from app.portability.validation import CHECKS
from tests.conftest import BACKENDS, http_client, running
from tests.support import create_postgres_database, drop_postgres_database

pytestmark = pytest.mark.anyio
OTHER = {"sqlite": "postgres", "postgres": "sqlite"}


# --- the mapping is exhaustive by construction ---------------------------------------------


def test_every_tenant_table_has_a_kind() -> None:
    """A table added later (checkpoints, ...) fails here until it is mapped in KINDS."""
    tables = {table.name for table in fmt.tenant_tables()}
    mapped = {kind.table_name for kind in fmt.KINDS}
    assert tables - mapped == set(), (
        f"map these tables in app/portability/format.py KINDS: {sorted(tables - mapped)}")
    assert mapped <= tables
    assert set(CHECKS) == {kind.name for kind in fmt.KINDS}, \
        "every kind needs its API checks in app/portability/validation.py"


def test_every_kind_is_named_by_a_unique_key_and_carries_no_internal_id() -> None:
    for kind in fmt.KINDS:
        table = kind.table
        # The natural key is a unique constraint of the table, with thread_id for the
        # foreign key to threads: importing a row twice finds the first one.
        key = {kind.thread_fk if name in kind.virtual and kind.thread_fk else name
               for name in kind.key}
        uniques = [{c.name for c in table.primary_key.columns}] + [
            {c.name for c in constraint.columns} for constraint in table.constraints
            if constraint.__class__.__name__ == "UniqueConstraint"]
        assert any(unique <= key for unique in uniques), (kind.name, key, uniques)
        for column in table.c:
            for fk in column.foreign_keys:
                assert fk.column.table.name == fmt.THREAD_TABLE, (
                    f"{table.name}.{column.name} points at {fk.column.table.name}: teach "
                    "app/portability a parent other than threads")
            if column.info.get("secret"):
                assert f"{table.name}.{column.name}" in fmt.SEALED | fmt.PORTABLE_SECRETS, (
                    f"{table.name}.{column.name} is secret: seal it or declare it portable")
        assert "id" not in kind.fields and not any(name.endswith("_pk") for name in kind.fields)
        assert set(kind.fields) >= set(kind.order)
        for column in kind.columns:
            fmt.column_kind(column)  # every column type has a form in the file


# --- helpers -----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def fresh_database(backend: str, tmp_path: Path) -> AsyncIterator[str]:
    """An empty database of `backend`, only this test's."""
    if backend == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / f'fresh-{os.urandom(4).hex()}.db'}"
    else:
        url = await anyio.to_thread.run_sync(create_postgres_database)
    try:
        yield url
    finally:
        if backend == "postgres":
            await anyio.to_thread.run_sync(drop_postgres_database, url)


async def migrated(url: str) -> str:
    db = Database(Settings(database_url=url, _env_file=None))  # type: ignore[call-arg]
    try:
        await migrate.upgrade(db.engine)
    finally:
        await db.dispose()
    return url


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


async def cli(database_url: str, *args: str, env: dict[str, str] | None = None,
              stdin: bytes | None = None) -> tuple[int, str, str]:
    """`agentstate ARGS` in-process (its own event loop, in a worker thread): exit status,
    stdout, stderr."""
    from app.cli import main

    def run() -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        values = {"AGENTSTATE_DATABASE_URL": database_url, "AGENTSTATE_AUTO_MIGRATE": "false",
                  **(env or {})}
        with environment(values), contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:
                code = int(exc.code or 0)
        return code, out.getvalue(), err.getvalue()

    return await anyio.to_thread.run_sync(run)


async def read_all(client: httpx.AsyncClient, path: str, **params: Any) -> list[dict]:
    items: list[dict] = []
    cursor = None
    while True:
        query = {"limit": 100, **params, **({"cursor": cursor} if cursor else {})}
        page = await client.get(path, params=query)
        assert page.status_code == 200, (path, page.text)
        body = page.json()
        items += body["data"]
        if not body["has_more"]:
            return items
        cursor = body["next_cursor"]


async def api_view(client: httpx.AsyncClient, headers: dict[str, str],
                   thread_ids: list[str]) -> dict[str, Any]:
    """Everything a tenant can read, with ETags and statuses: what must read back the same."""
    client.headers.update(headers)
    view: dict[str, Any] = {"threads": await read_all(client, "/v1/threads")}
    for thread_id in thread_ids:
        got = await client.get(f"/v1/threads/{thread_id}")
        entry: dict[str, Any] = {"status": got.status_code, "etag": got.headers.get("etag"),
                                 "body": got.json()}
        if got.status_code == 200:
            base = f"/v1/threads/{thread_id}"
            entry["full"] = await read_all(client, f"{base}/messages", view="full")
            entry["live"] = await read_all(client, f"{base}/messages")
            entry["compactions"] = await read_all(client, f"{base}/compactions")
            entry["revisions"] = await read_all(client, f"{base}/revisions")
            entry["agents"] = await read_all(client, f"{base}/agents")
            for agent in entry["agents"]:
                state = await client.get(f"{base}/agents/{agent['agent_name']}/state")
                agent["etag"] = state.headers["etag"]
        view[thread_id] = entry
    view["agent_states"] = await read_all(client, "/v1/agent-states")
    view["mcp_servers"] = await read_all(client, "/v1/mcp-servers", include_secrets="true")
    view["events"] = await read_all(client, "/v1/events")
    return view


async def populate(client: httpx.AsyncClient, headers: dict[str, str], tag: str) -> list[str]:
    """Every kind of resource, written through the API; returns the thread ids."""
    client.headers.update(headers)
    a, b, gone = f"a-{tag}", f"b-{tag}", f"gone-{tag}"

    async def ok(response: Any, status: int = 200) -> dict:
        response = await response
        assert response.status_code == status, response.text
        return response.json() if response.content else {}

    await ok(client.put(f"/v1/threads/{a}", json={
        "state": {"z": 1, "a": [1.5, None, True], "nested": {"y": "é", "x": "✓"}},
        "metadata": {"team": "research"}, "history_limit": 5},
        headers={"If-None-Match": "*"}), 201)
    await ok(client.post(f"/v1/threads/{a}/messages", json={"messages": [
        {"id": "m1", "role": "system", "content": "be brief"},
        {"id": "m2", "role": "user", "content": [{"type": "text", "text": "hi"}],
         "metadata": {"k": [1, 2]}},
        {"id": "m3", "role": "assistant", "content": None, "agent_name": "planner",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "f", "arguments": "{}"}}]},
        {"id": "m4", "role": "tool", "content": "42", "tool_call_id": "c1", "name": "f"}]},
        headers={"Idempotency-Key": "turn-1"}), 201)
    for n in range(5, 12):
        await ok(client.post(f"/v1/threads/{a}/messages",
                             json={"id": f"m{n}", "role": "user", "content": f"text {n}"}), 201)
    await ok(client.put(f"/v1/threads/{a}", json={
        "state": {"step": 2}, "append_messages": [{"role": "assistant", "content": "ok"}]},
        headers={"If-Match": '"9"'}))
    await ok(client.patch(f"/v1/threads/{a}", json={"state": {"extra": True}},
                          headers={"If-Match": '"10"'}))
    first = await ok(client.post(f"/v1/threads/{a}/compactions", json={
        "source_message_ids": ["m5", "m6"], "summary": {"role": "system", "content": "five, six"},
        "reason": "length", "model": "m", "input_token_count": 10, "output_token_count": 2,
        "metadata": {"by": "test"}}, headers={"Idempotency-Key": "compact-1"}), 201)
    second = await ok(client.post(f"/v1/threads/{a}/compactions", json={
        "source_message_ids": [first["summary_message_id"], "m7"],
        "summary": {"role": "system", "content": "nested"}}), 201)
    await ok(client.delete(f"/v1/threads/{a}/compactions/{second['id']}",
                           headers={"If-Match": '"13"'}), 204)
    await ok(client.post(f"/v1/threads/{a}/compactions", json={
        "source_message_ids": ["m9", "m10"], "summary": {"role": "system", "content": "later"}}),
        201)
    for agent in ("planner", "critic", "doomed"):
        await ok(client.put(f"/v1/threads/{a}/agents/{agent}/state",
                            json={"state": {"agent": agent}}, headers={"If-None-Match": "*"}),
                 201)
    await ok(client.patch(f"/v1/threads/{a}/agents/planner/state",
                          json={"state": {"risk": 0.3}}, headers={"If-Match": '"1"'}))
    await ok(client.delete(f"/v1/threads/{a}/agents/doomed/state",
                           headers={"If-Match": '"1"'}), 204)
    await ok(client.post(f"/v1/threads/{a}/fork", json={"thread_id": b, "revision": 12}), 201)
    await ok(client.post(f"/v1/threads/{b}/messages", json={"role": "user", "content": "fork"}),
             201)
    await ok(client.put(f"/v1/threads/{gone}", json={"state": {}},
                        headers={"If-None-Match": "*"}), 201)
    await ok(client.delete(f"/v1/threads/{gone}", headers={"If-Match": '"1"'}), 204)
    await ok(client.put(f"/v1/mcp-servers/broker-{tag}", json={
        "server_type": "broker", "state": {"account": "DU1"},
        "secrets": {"token": f"s3cret-{tag}"}, "last_connected_at": "2026-11-20T09:00:00Z"},
        headers={"If-None-Match": "*"}), 201)
    await ok(client.put(f"/v1/mcp-servers/old-{tag}", json={"server_type": "news"},
                        headers={"If-None-Match": "*"}), 201)
    await ok(client.delete(f"/v1/mcp-servers/old-{tag}", headers={"If-Match": '"1"'}), 204)
    return [a, b, gone]


def body_lines(text: str) -> list[str]:
    return text.splitlines()


# --- the round trip ----------------------------------------------------------------------


@pytest.mark.parametrize("source_backend", BACKENDS)
async def test_round_trip_to_the_other_backend(source_backend: str, tmp_path: Path) -> None:
    """A database with every resource kind, exported, imported into an empty database of the
    other backend and exported again: the two exports are the same file, and every resource
    reads back the same through the API (revisions, ETags, seqs, positions, compaction
    links, events)."""
    target_backend = OTHER[source_backend]
    if target_backend not in BACKENDS:
        pytest.fail(f"the round trip needs both backends; AGENTSTATE_TEST_BACKENDS={BACKENDS}")
    key = new_key()
    env = {"AGENTSTATE_SECRET_KEYS": key}
    async with fresh_database(source_backend, tmp_path) as source, \
            fresh_database(target_backend, tmp_path) as target:
        await migrated(source)
        await migrated(target)
        tokens = {}
        for tenant, scopes in (("default", "read,write,secrets:read"),
                               ("acme", "read,write,secrets:read")):
            code, out, err = await cli(source, "keys", "create", "--tenant", tenant,
                                       "--name", f"{tenant}-key", "--scopes", scopes)
            assert code == 0, err
            tokens[tenant] = out.strip()
        code, out, err = await cli(source, "keys", "create", "--tenant", "acme", "--name",
                                   "revoked")
        assert code == 0, err
        assert (await cli(source, "keys", "revoke", out.strip().split("_")[1]))[0] == 0

        settings = {url: Settings(database_url=url, auto_migrate=False, _env_file=None,  # type: ignore[call-arg]
                                  secret_keys=[SecretStr(key)], auth_cache_seconds=0)
                    for url in (source, target)}
        threads: dict[str, list[str]] = {}
        async with running(settings[source]) as app, http_client(app) as client:
            for tenant, token in tokens.items():
                threads[tenant] = await populate(
                    client, {"Authorization": f"Bearer {token}"}, tenant)
            before = {tenant: await api_view(client, {"Authorization": f"Bearer {token}"},
                                             threads[tenant])
                      for tenant, token in tokens.items()}

        first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
        code, _, err = await cli(source, "export", "-o", str(first), env=env)
        assert code == 0, err
        code, _, err = await cli(target, "import", str(first), env=env)
        assert code == 0, err
        assert "threads: 6 created" in err and "api_keys: 3 created" in err, err
        code, _, err = await cli(target, "export", "-o", str(second), env=env)
        assert code == 0, err
        assert first.read_text() == second.read_text()

        lines = body_lines(first.read_text())
        header = json.loads(lines[0])
        assert header == {"format": "agentstate-export", "version": 1,
                          "schema": migrate.head_revision(), "secrets": "ciphertext"}
        kinds = {json.loads(line)["kind"] for line in lines[1:]}
        assert kinds == {kind.name for kind in fmt.KINDS} | {"thread_end", "end"}
        assert "s3cret" not in first.read_text()
        for line in lines[1:]:
            record = json.loads(line)
            assert not ({"id", "thread_pk"} & set(record)), record

        async with running(settings[target]) as app, http_client(app) as client:
            after = {tenant: await api_view(client, {"Authorization": f"Bearer {token}"},
                                            threads[tenant])
                     for tenant, token in tokens.items()}
            assert after == before
            # New writes on the target come after the imported history.
            last_seq = max(event["seq"] for view in after.values() for event in view["events"])
            client.headers["Authorization"] = f"Bearer {tokens['default']}"
            created = await client.post("/v1/threads", json={"thread_id": "after-import"})
            assert created.status_code == 201, created.text
            newest = (await read_all(client, "/v1/events"))[-1]
            assert newest["type"] == "thread.created" and newest["seq"] > last_seq

        # Importing again changes nothing.
        code, _, err = await cli(target, "import", str(first), env=env)
        assert code == 0, err
        assert "threads: 6 unchanged" in err and "0 rows written" in err, err
