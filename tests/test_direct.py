"""The hot writes' statements go straight to asyncpg (app/db/direct.py) and answer what
SQLAlchemy's path answers.

The rest of the suite proves the behaviour of those writes on Postgres (concurrency, faults,
timeouts, all-or-nothing batches); here, that the direct path is the one taken (it leans on
private members of SQLAlchemy's asyncpg adapter, and falls back to SQLAlchemy's path if a
release renames them: this test then says so) and that its rows equal SQLAlchemy's.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import event

from app.auth.principal import OPEN_TENANT
from app.db import direct
from app.threads.repository import _get

pytestmark = [pytest.mark.anyio, pytest.mark.postgres_only(
    reason="the direct path is asyncpg's; elsewhere it is SQLAlchemy's execute")]


async def test_an_append_and_a_batch_take_the_direct_path(
    app: FastAPI, client: httpx.AsyncClient, uid: str
) -> None:
    seen: list[tuple[str, bool]] = []  # (verb and table, whether it came the direct way)

    def record(_conn: Any, _cursor: Any, sql: str, _params: Any, context: Any,
               _many: bool) -> None:
        words = sql.split()
        seen.append((f"{words[0]} {words[2 if words[0] == 'INSERT' else 1]}",
                     isinstance(context, direct.DirectContext)))

    engine = app.state.db.engine.sync_engine
    assert (await client.post("/v1/threads", json={"thread_id": uid})).status_code == 201
    event.listen(engine, "before_cursor_execute", record)
    try:
        appended = await client.post(f"/v1/threads/{uid}/messages",
                                     json={"role": "user", "content": "hi"})
        batch = await client.post("/v1/batch", json={"operations": [{
            "op": "thread.patch", "thread_id": uid, "if_match": '"2"',
            "body": {"state": {"k": 1}, "append_messages": [{"role": "user",
                                                              "content": "again"}]}}]})
    finally:
        event.remove(engine, "before_cursor_execute", record)
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
