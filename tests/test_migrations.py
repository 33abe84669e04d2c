"""Migrations: upgrade, downgrade, upgrade again; the models and the migrations agree."""

from __future__ import annotations

import subprocess
import sys

import pytest
from sqlalchemy import inspect

from app.core.settings import Settings
from app.db import migrate
from app.db.engine import Database
from tests.support import ROOT, create_postgres_database, drop_postgres_database

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["sqlite", "postgres"])
def empty_url(request: pytest.FixtureRequest, tmp_path) -> str:
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'm.db'}"
        return
    url = create_postgres_database()
    yield url
    drop_postgres_database(url)


async def tables(db: Database) -> set[str]:
    async with db.engine.connect() as connection:
        return set(await connection.run_sync(lambda c: inspect(c).get_table_names()))


async def test_upgrade_downgrade_upgrade(empty_url: str) -> None:
    db = Database(Settings(database_url=empty_url, _env_file=None))  # type: ignore[call-arg]
    try:
        await migrate.upgrade(db.engine)
        assert await migrate.current_revision(db.engine) == migrate.head_revision()
        assert {"threads", "events"} <= await tables(db)
        assert await migrate.schema_diff(db.engine) == [], "models and migrations disagree"

        await migrate.downgrade(db.engine, "base")
        assert await migrate.current_revision(db.engine) is None
        assert await tables(db) <= {"alembic_version"}

        await migrate.upgrade(db.engine)
        assert await migrate.schema_diff(db.engine) == []
    finally:
        await db.dispose()


@pytest.mark.slow
def test_migrate_command(empty_url: str) -> None:
    env = {"AGENTSTATE_DATABASE_URL": empty_url, "PATH": "/usr/bin:/bin"}
    first = subprocess.run([sys.executable, "-m", "app.cli", "migrate"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert f"to {migrate.head_revision()}" in first.stderr
    second = subprocess.run([sys.executable, "-m", "app.cli", "migrate"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert second.returncode == 0 and "already at" in second.stderr


def test_revision_files_are_dated_and_linear() -> None:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(migrate.alembic_config())
    assert len(script.get_heads()) == 1, "migrations must form one line"
    for rev in script.walk_revisions():
        assert rev.path is not None
        name = rev.path.rsplit("/", 1)[-1]
        assert name[:4].isdigit() and name[4] == "_", name
