"""Where a write's server CPU goes below HTTP: the state replace transaction (thread UPDATE
and its event) run N times on one connection, once through the server's own repositories on an
SQLAlchemy AsyncConnection and once as the same SQL sent with asyncpg, measured in CPU seconds of
this process (so the database's share and the machine's noise are left out).

    .venv/bin/python -m bench.layers [--n 2000]   (local Postgres, as bench/run.py)

Prints one JSON object: microseconds of CPU per transaction for each layer and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from app.auth.authenticator import OPEN
from app.core.settings import Settings
from app.db.engine import Database
from app.db.unit import UnitOfWork
from app.events.repository import EventRepository
from app.threads.repository import ThreadRepository
from bench.ops import run_state
from bench.server import create_postgres_database, drop_postgres_database, libpq_dsn, migrate
from bench.sqlbaseline import Slot, create_thread, op_state_replace


async def cpu_per_call(call: Callable[[], Awaitable[Any]], n: int) -> float:
    for _ in range(n // 10):  # warm caches and prepared statements
        await call()
    started = time.process_time()
    for _ in range(n):
        await call()
    return (time.process_time() - started) / n * 1e6


async def measure(url: str, n: int) -> dict[str, Any]:
    """Each side replaces the state of its own thread with If-Match, as `PUT` does; the
    asyncpg side is baseline (a)'s own transaction (bench/sqlbaseline.py)."""
    db = Database(Settings(database_url=url))
    raw = await asyncpg.connect(libpq_dsn(url))
    ours, theirs = (Slot(f"layers-{time.time_ns()}-{side}") for side in ("sqlalchemy", "asyncpg"))
    async with raw.transaction():
        for slot in (ours, theirs):
            slot.revision = await create_thread(raw, slot.thread, run_state(0))

    async def through_sqlalchemy() -> None:
        async with db.write() as connection:
            uow = UnitOfWork(connection, OPEN, db.settings)
            row = await ThreadRepository(connection, OPEN.tenant_id).advance(
                ours.thread, values={"state": run_state(ours.counter)}, expected=[ours.revision])
            uow.record("thread.updated", f"/v1/threads/{ours.thread}", revision=row.revision,
                       thread_id=ours.thread)
            await EventRepository(connection, OPEN.tenant_id).append(OPEN.actor, uow.events)
            await connection.commit()
        ours.revision, ours.counter = row.revision, ours.counter + 1

    async def through_asyncpg() -> None:
        await op_state_replace(raw, theirs)
        theirs.counter += 1

    try:
        sqlalchemy_us = await cpu_per_call(through_sqlalchemy, n)
        asyncpg_us = await cpu_per_call(through_asyncpg, n)
    finally:
        await raw.close()
        await db.dispose()
    return {"transactions": n, "sqlalchemy_us": round(sqlalchemy_us, 1),
            "asyncpg_us": round(asyncpg_us, 1), "ratio": round(sqlalchemy_us / asyncpg_us, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    url = create_postgres_database()
    try:
        migrate(url)
        try:
            import uvloop
        except ImportError:
            uvloop = None
        runner = uvloop.run if uvloop else asyncio.run
        print(json.dumps(runner(measure(url, args.n))))
    finally:
        drop_postgres_database(url)


if __name__ == "__main__":
    main()
