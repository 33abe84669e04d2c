"""The export format, import, copy and backup, through the CLI and the HTTP API, on
real SQLite and real Postgres.

The CLI runs in-process here (`app.cli.main` in a worker thread, its own event loop); the
tests that run it as a separate process (kill -9 mid-copy, a backup under a live server) are
in tests/test_copy_resumes_and_backup_runs_live.py and marked slow.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from pydantic import SecretStr

from app.core.secretbox import new_key
from app.core.settings import Settings
from app.db import migrate
from app.db.engine import Database
from app.portability import format as fmt
from app.portability.validation import CHECKS
from tests.conftest import BACKENDS, http_client, running
from tests.support import create_postgres_database, drop_postgres_database, pg_connect

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


def test_binary_and_boolean_columns_have_a_form() -> None:
    """Bytes travel as base64 and come back as bytes (checkpoint segments will need it)."""
    from sqlalchemy import Boolean, Column, LargeBinary, MetaData, Table

    table = Table("t", MetaData(), Column("data", LargeBinary), Column("flag", Boolean))
    assert fmt.column_kind(table.c.data) == "bytes" and fmt.column_kind(table.c.flag) == "bool"
    assert fmt.encode({"data": b"\x00\xffab", "flag": True}) == '{"data":"AP9hYg==","flag":true}'


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
                assert not column.nullable, (
                    f"{table.name}.{column.name} may be NULL: rows of no thread travel in no "
                    "bundle; give them a path outside threads, as events that name no "
                    "thread have")
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
            entry["checkpoints"] = await read_all(client, f"{base}/checkpoints")
            entry["agents"] = await read_all(client, f"{base}/agents")
            for agent in entry["agents"]:
                state = await client.get(f"{base}/agents/{agent['agent_name']}/state")
                agent["etag"] = state.headers["etag"]
        view[thread_id] = entry
    view["lineage"] = (await client.get("/v1/messages/a-cont/lineage")).json()
    view["agent_states"] = await read_all(client, "/v1/agent-states")
    view["mcp_servers"] = await read_all(client, "/v1/mcp-servers", include_secrets="true")
    view["events"] = await read_all(client, "/v1/events")
    view["store"] = (await client.post("/v1/store/items/search", json={
        "vector": {"index": "tiny", "embedding": [1.0, -1.0]}, "limit": 100})).json()
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
    # Checkpoints: a value as bytes, a list of items continued by base_version, writes.
    item = {"type": "msgpack", "data": "AAEC"}
    for n, values in ((1, [{"channel": "log", "version": 1, "type": "list", "items": [item]},
                           {"channel": "raw", "version": "v1", "type": "bytes", "data": "/wA="}]),
                      (2, [{"channel": "log", "version": 2, "type": "list", "base_version": 1,
                            "items": [{"type": "msgpack", "data": "AwQ="}]}]),
                      (3, [])):
        await ok(client.post(f"/v1/threads/{a}/checkpoints", json={
            "checkpoint_ns": "sub:1" if n == 3 else "", "checkpoint_id": f"cp{n}",
            "parent_checkpoint_id": None if n == 1 else "cp1",
            "checkpoint": {"v": 1, "channel_versions": {"log": n, "raw": "v1"}},
            "metadata": {"step": n, "run_id": f"run-{tag}"}, "values": values}), 201)
    await ok(client.post(f"/v1/threads/{a}/checkpoints/cp1/writes", json={
        "task_id": "t1", "task_path": "~a", "writes": [
            {"idx": 0, "channel": "log", "type": "msgpack", "data": "BQ=="}]}))
    await ok(client.post(f"/v1/threads/{a}/fork", json={"thread_id": b, "revision": 12}), 201)
    await ok(client.post(f"/v1/threads/{b}/messages", json={"messages": [
        {"id": "fork-1", "role": "user", "content": "fork"},
        {"id": "fork-2", "role": "assistant", "content": "on", "parent_id": "fork-1"}]}), 201)
    # A parent link across threads (a's message continues b's): the export carries it by
    # (thread_id, seq), so it resolves whatever order the threads are imported in.
    await ok(client.post(f"/v1/threads/{a}/messages", json={
        "id": "a-cont", "role": "user", "content": "back in a", "parent_id": "fork-2"}), 201)
    await ok(client.put(f"/v1/threads/{gone}", json={"state": {}},
                        headers={"If-None-Match": "*"}), 201)
    await ok(client.delete(f"/v1/threads/{gone}", headers={"If-Match": '"1"'}), 204)
    await ok(client.put(f"/v1/mcp-servers/broker-{tag}", json={
        "server_type": "broker", "state": {"account": "DU1"},
        "secrets": {"token": f"s3cret-{tag}"}, "last_connected_at": "2026-11-20T09:00:00Z"},
        headers={"If-None-Match": "*"}), 201)
    await ok(client.put(f"/v1/mcp-servers/old-{tag}", json={"server_type": "news"},
                        headers={"If-None-Match": "*"}), 201)
    # A year of three digits is written with four (RFC 3339), so it reads back on import.
    await ok(client.put(f"/v1/mcp-servers/early-{tag}", json={
        "server_type": "clock", "last_connected_at": "0999-01-02T03:04:05Z"},
        headers={"If-None-Match": "*"}), 201)
    await ok(client.delete(f"/v1/mcp-servers/old-{tag}", headers={"If-Match": '"1"'}), 204)
    # Store items (a live one with a vector and a time to live, a deleted one) and a key of a
    # write outside threads.
    memory = f"/v1/store/items/users/{tag}@2Fx/memories"
    await ok(client.put(f"{memory}/likes", json={
        "value": {"text": "dark chocolate", "n": 2.5}, "ttl_seconds": 86400, "index": ["text"],
        "vectors": {"tiny": {"text": [0.5, -1.0]}}}, headers={"Idempotency-Key": "mem-1"}), 201)
    await ok(client.put(f"{memory}/old", json={"value": {}}), 201)
    await ok(client.delete(f"{memory}/old", headers={"If-Match": '"1"'}), 204)
    return [a, b, gone]


def body_lines(text: str) -> list[str]:
    return text.splitlines()


# --- the round trip ----------------------------------------------------------------------


async def analyzed(url: str, *tables: str) -> bool:
    """Whether each table has been analyzed by hand (ANALYZE, not autovacuum), waiting out
    the statistics a backend that just ended has not flushed yet."""
    connection = await pg_connect(url)
    try:
        for _ in range(50):
            counts = dict(await connection.fetch(
                "SELECT relname, analyze_count FROM pg_stat_user_tables"))
            if all(counts[table] > 0 for table in tables):
                return True
            await anyio.sleep(0.2)
            await connection.execute("SELECT pg_stat_clear_snapshot()")
        return False
    finally:
        await connection.close()


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
            assert [(m["thread_id"], m["id"]) for m in before["default"]["lineage"]["data"]] == [
                ("b-default", "fork-1"), ("b-default", "fork-2"), ("a-default", "a-cont")]
            # A fork's source travels with it (compared with the import's view below).
            assert before["default"]["b-default"]["body"]["forked_from"] == {
                "thread_id": "a-default", "revision": 12}

        first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
        code, _, err = await cli(source, "export", "-o", str(first), env=env)
        assert code == 0, err
        code, _, err = await cli(target, "import", str(first), env=env)
        assert code == 0, err
        assert "threads: 6 created" in err and "api_keys: 3 created" in err, err
        if target_backend == "postgres":  # the planner has the imported tables' statistics
            assert await analyzed(target, "store_items", "store_vectors")
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


# --- import refuses what the API would refuse, and writes no partial thread --------------

NOW = "2026-12-01T10:00:00.000000Z"


def thread_records(thread_id: str, *, state: dict | None = None,
                   messages: list[dict] | tuple = (), tenant: str = "default") -> list[dict]:
    """One thread's records as an export writes them: revision 1 holding `messages`."""
    n = len(messages)
    key = {"tenant_id": tenant, "thread_id": thread_id}
    records = [
        {"kind": "thread", **key, "revision": 1, "state": state or {}, "metadata": {},
         "created_at": NOW, "updated_at": NOW, "deleted_at": None, "last_seq": n,
         "message_count": n, "history_limit": None},
        {"kind": "thread_revision", **key, "revision": 1, "state": state or {}, "metadata": {},
         "updated_at": NOW},
    ]
    for seq, message in enumerate(messages, start=1):
        records.append({"kind": "message", **key, "seq": seq, "message_id": f"m{seq}",
                        "position": seq, "role": "user", "content": f"text {seq}", "name": None,
                        "tool_calls": None, "tool_call_id": None, "agent_name": None,
                        "metadata": {}, "created_at": NOW, "status": "live",
                        "compacted_by": None, "summary_of": None, "revision": 1, **message})
    counts = {"thread": 1, "thread_revision": 1, **({"message": n} if n else {})}
    return [*records, {"kind": "thread_end", **key, "records": counts}]


def export_text(*threads: list[dict], header: dict | None = None) -> str:
    records = [record for thread in threads for record in thread]
    total = sum(1 for record in records if record["kind"] != "thread_end")
    lines = [header or {"format": "agentstate-export", "version": 1,
                        "schema": migrate.head_revision(), "secrets": "ciphertext"},
             *records, {"kind": "end", "records": total}]
    return "".join(json.dumps(line) + "\n" for line in lines)


async def import_text(database_url: str, tmp_path: Path, text: str,
                      *args: str) -> tuple[int, str]:
    path = tmp_path / f"import-{os.urandom(4).hex()}.jsonl"
    path.write_text(text)
    code, _, err = await cli(database_url, "import", str(path), *args)
    return code, err


def line_of(text: str, needle: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), start=1) if needle in line)


async def test_import_refuses_an_unknown_version(database_url: str, client: httpx.AsyncClient,
                                                  tmp_path: Path, uid: str) -> None:
    for header, expected in (
            ({"format": "agentstate-export", "version": 2, "schema": None,
              "secrets": "ciphertext"}, "line 1: format version 2 is not one this agentstate"),
            ({"table": "threads", "row": {}}, "line 1: not an agentstate export")):
        code, err = await import_text(database_url, tmp_path,
                                      export_text(thread_records(uid), header=header))
        assert code == 1 and expected in err, err
        assert (await client.get(f"/v1/threads/{uid}")).status_code == 404


async def test_import_refuses_a_line_the_api_would_refuse(
        database_url: str, client: httpx.AsyncClient, tmp_path: Path, uid: str) -> None:
    """The line number and the field; nothing of that thread; the others go in."""
    good = thread_records(f"good-{uid}", messages=[{}, {}])
    # Any short name is a role: a 65-character one is not.
    bad = thread_records(f"bad-{uid}", messages=[{}, {"role": "w" * 65}, {}])
    odd = thread_records(f"odd-{uid}", messages=[{"tool_call_id": "c1"}])  # a user's tool id
    text = export_text(bad, good, odd)
    code, err = await import_text(database_url, tmp_path, text)
    assert code == 1, err
    line = line_of(text, '"role": "' + "w" * 65 + '"')
    assert f"refused: line {line}: message.role: at most 64 characters" in err, err
    odd_line = line_of(text, '"tool_call_id": "c1"')
    assert f"line {odd_line}: message.tool_call_id: " in err and "tool messages" in err, err
    assert "threads: 1 created, 2 refused" in err, err
    assert (await client.get(f"/v1/threads/bad-{uid}")).status_code == 404
    assert (await client.get(f"/v1/threads/odd-{uid}")).status_code == 404
    messages = await read_all(client, f"/v1/threads/good-{uid}/messages")
    assert [m["id"] for m in messages] == ["m1", "m2"]

    # The API's JSON limits hold too: nesting depth, and what Postgres cannot store.
    deep: dict = {}
    for _ in range(70):
        deep = {"d": deep}
    code, err = await import_text(database_url, tmp_path,
                                  export_text(thread_records(f"deep-{uid}", state=deep)))
    assert code == 1 and "line 2: thread.nested deeper than 64 levels" in err, err
    nul = thread_records(f"nul-{uid}", state={"text": "a\u0000b"})
    text = export_text(nul)
    code, err = await import_text(database_url, tmp_path, text)
    assert code == 1 and "line 2: thread.a string holds \\u0000" in err, err
    assert (await client.get(f"/v1/threads/nul-{uid}")).status_code == 404

    # A parent link is the id sent and where it pointed, together; one without the other is
    # refused. A whole link imports, into a thread imported after it or not.
    half = thread_records(f"half-{uid}", messages=[{"parent_id": "m0"}])
    code, err = await import_text(database_url, tmp_path, export_text(half))
    assert code == 1 and "message.parent_id: parent_id, parent_thread_id and parent_seq" in err
    linked = thread_records(f"linked-{uid}", messages=[
        {"message_id": f"{uid}-c", "parent_id": f"{uid}-p", "parent_thread_id": f"later-{uid}",
         "parent_seq": 1}])
    later = thread_records(f"later-{uid}", messages=[{"message_id": f"{uid}-p"}])
    code, err = await import_text(database_url, tmp_path, export_text(linked, later))
    assert code == 0, err
    got = (await client.get(f"/v1/messages/{uid}-c/lineage")).json()
    assert [(m["thread_id"], m["id"]) for m in got["data"]] == [
        (f"later-{uid}", f"{uid}-p"), (f"linked-{uid}", f"{uid}-c")]

    # A fork's source is a thread id and a revision, together (the files above carry
    # neither: no source).
    forked, half_fork = thread_records(f"fork-{uid}"), thread_records(f"half-fork-{uid}")
    forked[0].update(forked_from_thread_id=f"src-{uid}", forked_from_revision=3)
    half_fork[0].update(forked_from_thread_id=f"src-{uid}")
    code, err = await import_text(database_url, tmp_path, export_text(half_fork, forked))
    assert code == 1 and "thread.forked_from_revision: goes with forked_from_thread_id" in err
    got = (await client.get(f"/v1/threads/fork-{uid}")).json()
    assert got["forked_from"] == {"thread_id": f"src-{uid}", "revision": 3}


async def test_import_refuses_history_of_a_thread_that_keeps_none(
        database_url: str, client: httpx.AsyncClient, tmp_path: Path, uid: str) -> None:
    """The server keeps no revisions for a thread with history_limit 0 (and its writes count
    on that): an import does not bring any in."""
    records = thread_records(uid)
    records[0]["history_limit"] = 0
    text = export_text(records)
    code, err = await import_text(database_url, tmp_path, text)
    line = line_of(text, '"kind": "thread_revision"')
    assert code == 1, err
    assert (f"line {line}: thread_revision.revision: the thread keeps no history "
            "(history_limit 0)") in err, err
    assert (await client.get(f"/v1/threads/{uid}")).status_code == 404
    del records[1]
    records[-1]["records"] = {"thread": 1}
    code, err = await import_text(database_url, tmp_path, export_text(records))
    assert code == 0, err
    assert (await client.get(f"/v1/threads/{uid}/revisions")).json()["data"] == []


async def test_import_of_a_truncated_file_keeps_whole_threads(
        database_url: str, client: httpx.AsyncClient, tmp_path: Path, uid: str) -> None:
    text = export_text(thread_records(f"first-{uid}", messages=[{}]),
                       thread_records(f"second-{uid}", messages=[{}, {}, {}]))
    cut_at = text.index('"message_id": "m2"', text.index(f"second-{uid}"))
    code, err = await import_text(database_url, tmp_path, text[:cut_at])
    line = text[:cut_at].count("\n") + 1
    assert code == 1 and f"stopped at line {line}: truncated" in err, err
    assert (await client.get(f"/v1/threads/first-{uid}")).status_code == 200
    assert (await client.get(f"/v1/threads/second-{uid}")).status_code == 404

    # Cut at a line boundary: the thread_end is missing, so the thread is not written either.
    whole_lines = text[:text.index("\n", cut_at) + 1]
    code, err = await import_text(database_url, tmp_path, whole_lines)
    assert code == 1 and f"the input ends inside thread default/second-{uid}" in err, err
    assert (await client.get(f"/v1/threads/second-{uid}")).status_code == 404
    # A line lost in the middle: the thread_end's counts tell.
    lines = text.splitlines(keepends=True)
    lost = line_of(text, '"message_id": "m2"')
    code, err = await import_text(database_url, tmp_path,
                                  "".join(lines[:lost - 1] + lines[lost:]))
    assert code == 1 and "its thread_end counts" in err, err
    assert (await client.get(f"/v1/threads/second-{uid}")).status_code == 404
    # Whole, it goes in; what was there already is left as it is.
    code, err = await import_text(database_url, tmp_path, text)
    assert code == 0 and "threads: 1 created, 1 unchanged" in err, err


async def test_on_conflict(database_url: str, client: httpx.AsyncClient, tmp_path: Path,
                           uid: str) -> None:
    stored = export_text(thread_records(uid, state={"v": 1}, messages=[{}]))
    changed = export_text(thread_records(uid, state={"v": 2}, messages=[{}, {}]))
    assert (await import_text(database_url, tmp_path, stored))[0] == 0

    code, err = await import_text(database_url, tmp_path, changed)
    assert code == 1 and f"thread default/{uid} is stored with other content" in err, err
    code, err = await import_text(database_url, tmp_path, changed, "--on-conflict", "skip")
    assert code == 0 and "threads: 1 skipped" in err, err
    thread = (await client.get(f"/v1/threads/{uid}")).json()
    assert thread["state"] == {"v": 1} and thread["message_count"] == 1

    code, err = await import_text(database_url, tmp_path, changed, "--on-conflict", "replace")
    assert code == 0 and "threads: 1 replaced" in err, err
    thread = (await client.get(f"/v1/threads/{uid}")).json()
    assert thread["state"] == {"v": 2} and thread["message_count"] == 2
    assert [m["id"] for m in await read_all(client, f"/v1/threads/{uid}/messages")] == \
        ["m1", "m2"]
    code, err = await import_text(database_url, tmp_path, changed, "--on-conflict", "replace")
    assert code == 0 and "threads: 1 unchanged" in err, err


@pytest.mark.parametrize("source_backend", BACKENDS)
async def test_secrets_sealed_under_a_passphrase_or_redacted(source_backend: str,
                                                              tmp_path: Path) -> None:
    """Restorable where other keys are configured, with the passphrase; never in clear."""
    old, new = new_key(), new_key()
    passphrase = tmp_path / "passphrase"
    passphrase.write_text("correct horse battery staple\n")
    wrong = tmp_path / "wrong"
    wrong.write_text("incorrect\n")
    async with fresh_database(source_backend, tmp_path) as source, \
            fresh_database(OTHER[source_backend], tmp_path) as target:
        await migrated(source)
        await migrated(target)
        keyed = Settings(database_url=source, auto_migrate=False, _env_file=None,  # type: ignore[call-arg]
                         secret_keys=[SecretStr(old)])
        async with running(keyed) as app, http_client(app) as client:
            assert (await client.put("/v1/mcp-servers/ib", json={
                "server_type": "broker", "secrets": {"token": "tok-123", "pin": "0000"}},
                headers={"If-None-Match": "*"})).status_code == 201
        sealed, redacted = tmp_path / "sealed.jsonl", tmp_path / "redacted.jsonl"
        code, _, err = await cli(source, "export", "-o", str(sealed), "--secrets-passphrase-file",
                                 str(passphrase), env={"AGENTSTATE_SECRET_KEYS": old})
        assert code == 0, err
        assert "tok-123" not in sealed.read_text()
        assert json.loads(sealed.read_text().splitlines()[0])["kdf"]["name"] == "scrypt"
        code, _, err = await cli(source, "export", "-o", str(redacted), "--redact-secrets")
        assert code == 0, err

        code, _, err = await cli(target, "import", str(sealed),
                                 env={"AGENTSTATE_SECRET_KEYS": new})
        assert code == 2 and "pass --secrets-passphrase-file" in err, err
        code, _, err = await cli(target, "import", str(sealed), "--secrets-passphrase-file",
                                 str(wrong), env={"AGENTSTATE_SECRET_KEYS": new})
        assert code == 1 and "the passphrase does not open the secrets of MCP server " \
            "default/ib" in err, err
        code, _, err = await cli(target, "import", str(sealed), "--secrets-passphrase-file",
                                 str(passphrase), env={"AGENTSTATE_SECRET_KEYS": new})
        assert code == 0 and "mcp_servers: 1 created" in err, err
        code, _, err = await cli(target, "import", str(sealed), "--secrets-passphrase-file",
                                 str(passphrase), env={"AGENTSTATE_SECRET_KEYS": new})
        assert code == 0 and "mcp_servers: 1 unchanged" in err, err
        rekeyed = Settings(database_url=target, auto_migrate=False, _env_file=None,  # type: ignore[call-arg]
                           secret_keys=[SecretStr(new)])
        async with running(rekeyed) as app, http_client(app) as client:
            server = (await client.get("/v1/mcp-servers/ib",
                                       params={"include_secrets": "true"})).json()
            assert server["secrets"] == {"token": "tok-123", "pin": "0000"}
            assert server["revision"] == 1
            assert (await client.delete("/v1/mcp-servers/ib",
                                        headers={"If-Match": '"1"'})).status_code == 204
        code, _, err = await cli(target, "import", str(redacted), "--on-conflict", "replace",
                                 env={"AGENTSTATE_SECRET_KEYS": new})
        assert code == 0 and "mcp_servers: 1 replaced" in err, err
        async with running(rekeyed) as app, http_client(app) as client:
            server = (await client.get("/v1/mcp-servers/ib",
                                       params={"include_secrets": "true"})).json()
            assert server["secrets"] == {}, "a redacted export restores no secrets"


async def test_imported_message_times_read_alike_in_pages_and_single_reads(
        database_url: str, client: httpx.AsyncClient, tmp_path: Path, uid: str) -> None:
    """Pages take a message's `created_at` as text from Postgres (`to_char`) and format it
    themselves on SQLite; either way a year below 1000, a time on the second and the first
    and last microseconds Python has (which asyncpg stores as -infinity and infinity) read
    back as written, and as the single read gives them."""
    times = ["0001-01-01T00:00:00.000000Z", "0999-01-02T03:04:05.000007Z",
             "2026-12-01T10:00:00.000000Z", "9999-12-31T23:59:59.999999Z"]
    records = thread_records(uid, messages=[{"created_at": at} for at in times])
    code, err = await import_text(database_url, tmp_path, export_text(records))
    assert code == 0, err
    url = f"/v1/threads/{uid}/messages"
    listed = await client.get(url)
    assert listed.status_code == 200, listed.text
    page = listed.json()["data"]
    assert [message["created_at"] for message in page] == times
    for message in page:
        single = (await client.get(f"{url}/{message['id']}")).json()
        assert single == message
    included = (await client.get(f"/v1/threads/{uid}", params={"include": "messages"})).json()
    assert [message["created_at"] for message in included["messages"]] == times


async def test_the_progress_bar_shows_the_rate(tmp_path: Path, uid: str) -> None:
    """export, import and copy end with their bar's last state on stderr (not a terminal
    here): rows done and rows per second, for a run shorter than one update batch too."""
    source = await migrated(f"sqlite+aiosqlite:///{tmp_path / 'source.db'}")
    target = f"sqlite+aiosqlite:///{tmp_path / 'target.db'}"
    rate = re.compile(r"(?m)^(export|import|copy) .* (\d[\d,]*) rows/s ")
    for messages in (2, 1200):  # fewer rows than one batch of updates, and many batches
        text = export_text(thread_records(f"t{messages}-{uid}", messages=[{}] * messages))
        code, err = await import_text(source, tmp_path, text)
        assert code == 0, err
        code, _, copied = await cli(source, "copy", "--from", source, "--to", target)
        assert code == 0, copied
        code, _, exported = await cli(source, "export", "-o", str(tmp_path / "out.jsonl"))
        assert code == 0, exported
        for out, command in ((err, "import"), (copied, "copy"), (exported, "export")):
            found = rate.search(out)
            assert found is not None and found.group(1) == command, out
            assert int(found.group(2).replace(",", "")) > 0 and "- rows/s" not in out, out
