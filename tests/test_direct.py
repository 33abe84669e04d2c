"""The hot writes' statements go straight to asyncpg (app/db/direct.py) and answer what
SQLAlchemy's path answers.

The rest of the suite proves the behaviour of those writes on Postgres (concurrency, faults,
timeouts, all-or-nothing batches); here, that the direct path is the one taken (it leans on
private members of SQLAlchemy's asyncpg adapter, and falls back to SQLAlchemy's path if a
release renames them: this test then says so, and so does the server's start-up log) and that
its rows equal SQLAlchemy's.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Coroutine, Generator, Iterator
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.principal import OPEN_TENANT
from app.core.settings import Settings
from app.db import direct
from app.threads.repository import _get
from tests.conftest import http_client, running
from tests.support import ROOT, ServerProcess, statements

pytestmark = [pytest.mark.anyio, pytest.mark.postgres_only(
    reason="the direct path is asyncpg's; elsewhere it is SQLAlchemy's execute")]


def verb_and_table(sql: str) -> str:
    words = sql.split()
    return f"{words[0]} {words[2 if words[0] == 'INSERT' else 1]}"


async def test_an_append_and_a_batch_take_the_direct_path(
    app: FastAPI, client: httpx.AsyncClient, uid: str
) -> None:
    assert (await client.post("/v1/threads", json={"thread_id": uid})).status_code == 201
    with statements(app) as heard:
        appended = await client.post(f"/v1/threads/{uid}/messages",
                                     json={"role": "user", "content": "hi"})
        batch = await client.post("/v1/batch", json={"operations": [{
            "op": "thread.patch", "thread_id": uid, "if_match": '"2"',
            "body": {"state": {"k": 1}, "append_messages": [{"role": "user",
                                                              "content": "again"}]}}]})
    seen = [(verb_and_table(s.sql), s.direct) for s in heard]
    assert appended.status_code == 201, appended.text
    assert batch.status_code == 200, batch.text
    direct_ones = {statement for statement, straight in seen if straight}
    assert {"UPDATE threads", "INSERT messages", "INSERT events"} <= direct_ones, (
        "the hot writes no longer take app/db/direct.py's path (has SQLAlchemy's asyncpg "
        f"adapter changed?): {seen}")


async def test_its_rows_are_sqlalchemys(app: FastAPI, client: httpx.AsyncClient,
                                        uid: str) -> None:
    """Every column of a thread row, by position, by name and through `_mapping`, with the
    same types (aware UTC datetimes, decoded JSON), read both ways in one transaction."""
    created = await client.put(f"/v1/threads/{uid}", json={
        "state": {"nested": {"list": [1, 2.5, None, "x"]}, "b": True},
        "metadata": {"m": "v"}, "history_limit": 3})
    assert created.status_code == 201, created.text
    params = {"tenant": OPEN_TENANT, "thread": uid}
    async with app.state.db.write() as connection:
        for lock in (None, "update"):
            for returning in ("all", "keys"):
                stmt = _get(lock, returning)  # type: ignore[arg-type]
                ours = await direct.first(connection, stmt, params)
                theirs = (await connection.execute(stmt, params)).first()
                assert theirs is not None and ours is not None
                assert tuple(ours) == tuple(theirs)
                assert ours._mapping == dict(theirs._mapping)
                assert [type(v) for v in ours] == [type(v) for v in theirs]
                assert all(getattr(ours, k) == v for k, v in theirs._mapping.items())
        assert await direct.first(connection, _get(None, "all"),
                                  {"tenant": OPEN_TENANT, "thread": f"no-{uid}"}) is None
        await connection.rollback()


@contextmanager
def transactions_begun() -> Iterator[list[object]]:
    """The transactions asyncpg begins meanwhile (a BEGIN each), by the connection."""
    from asyncpg.transaction import Transaction  # type: ignore[import-untyped]

    began: list[object] = []
    start = Transaction.start

    async def counted(transaction: Any) -> None:
        began.append(transaction._connection)
        await start(transaction)

    Transaction.start = counted
    try:
        yield began
    finally:
        Transaction.start = start


class Counted:
    """Awaits a coroutine, counting the times it waits (hands the event loop a future)."""

    def __init__(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        self.coroutine = coroutine
        self.waits = 0

    def __await__(self) -> Generator[Any, Any, Any]:
        value = None
        while True:
            try:
                waiting_for = self.coroutine.send(value)
            except StopIteration as done:
                return done.value
            self.waits += 1
            value = yield waiting_for


async def waits_to_close(connection: AsyncConnection) -> bool:
    closing = Counted(connection.close())
    await closing
    return closing.waits > 0


async def test_a_connection_is_closed_at_once_only_where_closing_cannot_wait(
        app: FastAPI) -> None:
    """A request's connection is closed without SQLAlchemy's shielded task (a task and a turn
    of the event loop) only where the close sends nothing: no transaction to roll back, and
    room in the pool. Elsewhere it may wait, and must not be abandoned partway."""
    db = app.state.db
    async with db.read() as connection:
        await connection.execute(text("SELECT 1"))
        assert direct.closes_quietly(connection)
    async with db.write() as connection:
        await connection.execute(text("SELECT 1"))
        assert not direct.closes_quietly(connection)  # its transaction is to be rolled back
        await connection.commit()
        assert direct.closes_quietly(connection)
    # Proved on connections of its own: quiet means closed in one step.
    read = await db.engine.execution_options(isolation_level="AUTOCOMMIT").connect()
    await read.execute(text("SELECT 1"))
    assert direct.closes_quietly(read)
    assert not await waits_to_close(read)
    # A pool with no room: the connection beyond its size is closed, which waits.
    pool = db.engine.pool
    async with AsyncExitStack() as held:
        others = [await held.enter_async_context(db.read()) for _ in range(pool.size())]
        beyond = await held.enter_async_context(db.read())
        for connection in others:
            await connection.close()
        assert pool.checkedin() == pool.size()
        assert not direct.closes_quietly(beyond)
        assert await waits_to_close(beyond)
    assert pool.checkedout() == 0 and pool.checkedin() == pool.size()


# What app.db.direct sees, at import, of a SQLAlchemy release whose asyncpg adapter renamed the
# private members it uses (SQLAlchemy itself keeps its own class).
STAND_IN = """
import sys
sys.path.insert(0, {root!r})
import sqlalchemy.dialects.postgresql.asyncpg as dialect
real = dialect.AsyncAdapt_asyncpg_connection
dialect.AsyncAdapt_asyncpg_connection = type("AsyncAdapt_asyncpg_connection", (), {{}})
import app.db.direct
dialect.AsyncAdapt_asyncpg_connection = real
"""


@pytest.mark.slow
def test_a_sqlalchemy_without_the_adapter_members_falls_back_and_says_so_at_start(
    database_url: str, tmp_path: Path, uid: str
) -> None:
    with ServerProcess(database_url) as server:
        created = httpx.post(f"{server.base_url}/v1/threads", json={"thread_id": uid})
        assert created.status_code == 201, created.text
    assert "direct write path" not in server.logs()
    (tmp_path / "sitecustomize.py").write_text(STAND_IN.format(root=str(ROOT)))
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    with ServerProcess(database_url, env={"PYTHONPATH": path}) as server:
        appended = httpx.post(f"{server.base_url}/v1/threads/{uid}/messages",
                              json={"role": "user", "content": "hi"})
        assert appended.status_code == 201, appended.text  # SQLAlchemy's path still serves
    said = [line for line in server.logs().splitlines() if "direct write path is off" in line]
    assert len(said) == 1, server.logs()
    assert "asyncpg adapter has no _transaction, _start_transaction, _handle_exception" in said[0]
    assert '"level": "warning"' in said[0], said[0]
    # It names the bound pyproject.toml declares (a bound moved without it fails here).
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    bound = next(d for d in declared if d.startswith("sqlalchemy")).partition("]")[2]
    assert f"(sqlalchemy{bound})" in said[0], said[0]


async def test_a_write_alone_commits_by_itself_and_leaves_the_pool_as_it_was(
        settings: Settings, uid: str) -> None:
    """A PUT with If-Match, the request's one change, runs alone: no transaction is begun
    (no BEGIN, no COMMIT), and SQLAlchemy is not told, so nothing of it stays with the
    connection. On a pool of one connection, the next write that needs a transaction (a
    batch whose second operation is refused) has one on that same connection: nothing of
    it is written."""
    one = settings.model_copy(update={"pool_size": 1, "max_overflow": 0})
    async with running(one) as app, http_client(app) as client:
        for name in ("a", "b"):
            assert (await client.put(f"/v1/threads/{uid}-{name}",
                                     json={"state": {"v": 1}})).status_code == 201
        with transactions_begun() as began:
            alone = await client.put(f"/v1/threads/{uid}-a", headers={"If-Match": '"1"'},
                                     json={"state": {"v": 2}})
            assert alone.status_code == 200, alone.text
            assert began == []
            refused = await client.post("/v1/batch", json={"operations": [
                {"op": "thread.put", "thread_id": f"{uid}-a", "if_match": '"2"',
                 "body": {"state": {"v": 3}}},
                {"op": "messages.append", "thread_id": f"{uid}-b", "if_match": '"9"',
                 "body": {"messages": [{"role": "user", "content": "refused"}]}}]})
            assert refused.status_code == 412, refused.text
            assert len(began) == 1  # the batch's, on the pool's one connection
        thread = (await client.get(f"/v1/threads/{uid}-a")).json()
        assert (thread["revision"], thread["state"]) == (2, {"v": 2})
        assert app.state.db.engine.pool.checkedout() == 0
