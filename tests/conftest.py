"""Fixtures: every HTTP test runs on real SQLite and on real Postgres.

Postgres gets a fresh database per test run on the local server
(AGENTSTATE_TEST_POSTGRES_URL, default postgresql://postgres@127.0.0.1:5432/postgres),
migrated with the project's own migrations. AGENTSTATE_TEST_BACKENDS=sqlite (or postgres)
narrows the run.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from fastapi import FastAPI
from pydantic import SecretStr

from app.core.settings import Settings
from app.db import migrate
from app.db.engine import Database
from app.main import create_app
from tests.support import create_postgres_database, drop_postgres_database

BACKENDS = [b for b in os.environ.get("AGENTSTATE_TEST_BACKENDS", "sqlite,postgres").split(",") if b]


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session", params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A migrated, empty database of each backend, shared by the tests of the run."""
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('sqlite') / 'state.db'}"
        asyncio.run(_upgrade(url))
        yield url
        return
    url = create_postgres_database()
    try:
        asyncio.run(_upgrade(url))
        yield url
    finally:
        drop_postgres_database(url)


async def _upgrade(url: str) -> None:
    db = Database(Settings(database_url=url))
    try:
        await migrate.upgrade(db.engine)
    finally:
        await db.dispose()


@pytest.fixture
def backend(database_url: str) -> str:
    return "sqlite" if database_url.startswith("sqlite") else "postgres"


@pytest.fixture
def settings(database_url: str) -> Settings:
    return Settings(database_url=database_url, auto_migrate=False, _env_file=None)  # type: ignore[call-arg]


@pytest.fixture
async def app(settings: Settings) -> AsyncIterator[FastAPI]:
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://agentstate.test") as c:
        yield c


@pytest.fixture
def secret_key() -> str:
    from app.core.secretbox import new_key

    return new_key()


@pytest.fixture
async def keyed_client(settings: Settings, secret_key: str) -> AsyncIterator[httpx.AsyncClient]:
    """Like `client`, on a server that has a key for MCP secrets (AGENTSTATE_SECRET_KEYS)."""
    application = create_app(settings.model_copy(update={"secret_keys": [SecretStr(secret_key)]}))
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://agentstate.test") as c:
            yield c


@pytest.fixture
def uid() -> str:
    """A fresh suffix, so tests sharing a database never see each other's rows."""
    return uuid.uuid4().hex[:12]
