"""Alembic environment, async. The URL comes from settings, never from alembic.ini.

Two ways in: `agentstate migrate` / the `alembic` CLI (no connection given: we build an async
engine and run), or the application and tests, which pass a live connection in
`config.attributes["connection"]` and run inside their own event loop.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from app.core.settings import Settings
from app.db.migrate import include_name
from app.db.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        include_name=include_name,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # Two `agentstate migrate` runs at once: the second waits, then finds head.
            connection.exec_driver_sql("SELECT pg_advisory_xact_lock(1634169717)")
        context.run_migrations()


async def _run_async(url: str) -> None:
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run)
            await connection.commit()
    finally:
        await engine.dispose()


def main() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.attributes.get("database_url") or Settings().database_url
    asyncio.run(_run_async(url))


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run against a database")
main()
