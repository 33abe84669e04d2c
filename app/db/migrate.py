"""Alembic, driven from Python: `agentstate migrate`, auto-migration on SQLite, /readyz."""

from __future__ import annotations

from importlib.resources import files
from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.operations import Operations
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.types import NullType

from app.db.engine import WRITE
from app.db.models import Base


def include_name(name: str | None, type_: str, _parent: object) -> bool:
    """GIN expression indexes (`*_gin`) live only in migrations, on Postgres: the models
    cannot express them portably and autogenerate cannot compare them. So do SQLite's FTS5
    tables of the store (`store_items_fts` and its shadow tables), and Postgres's stored
    tsvector of store items (`search_tsv`, a generated column SQLite has no use for), and
    where pgvector exists the store's `embedding_vec` and its HNSW indexes (built when a
    search needs one: app/store/pgvector.py)."""
    if name is not None and type_ == "table" and name.startswith("store_items_fts"):
        return False
    if type_ == "column" and name in ("search_tsv", "embedding_vec"):
        return False
    if type_ == "index" and name is not None and name.startswith("ix_store_vectors_hnsw_"):
        return False
    return not (type_ == "index" and name is not None and name.endswith("_gin"))


def alembic_config(database_url: str | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(files("agentstate_migrations")))
    config.set_main_option(
        "file_template",
        "%%(year)d_%%(month).2d_%%(day).2d_%%(hour).2d%%(minute).2d-%%(rev)s_%%(slug)s",
    )
    if database_url:
        config.attributes["database_url"] = database_url
    return config


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def _on(connection: Connection, fn: Any, *args: Any) -> Any:
    config = alembic_config()
    config.attributes["connection"] = connection
    return fn(config, *args)


async def _run(engine: AsyncEngine, fn: Any, revision: str) -> Any:
    # One transaction, begun as a write (BEGIN IMMEDIATE on SQLite), so that servers starting
    # together migrate one after the other instead of failing with "database is locked".
    async with engine.connect() as connection:
        await connection.execution_options(**{WRITE: True})
        async with connection.begin():
            return await connection.run_sync(_on, fn, revision)


def _upgrade(config: Config, revision: str) -> list[tuple[str, str]]:
    """`alembic upgrade`, then each applied revision that offers `upgrade_again(bind)` and
    answers True (what it skipped for want of something the database has since gained,
    e.g. pgvector installed after the store's migration ran) has its `upgrade()` run again,
    in the same transaction. Those revisions (id, message), oldest first."""
    command.upgrade(config, revision)
    connection: Connection = config.attributes["connection"]
    context = MigrationContext.configure(connection)
    script = ScriptDirectory.from_config(config)
    again = []
    for applied in reversed(list(script.iterate_revisions(context.get_current_heads(), "base"))):
        offered = getattr(applied.module, "upgrade_again", None)
        if offered is not None and offered(connection):
            with Operations.context(context):
                applied.module.upgrade()
            again.append((applied.revision, applied.doc))
    return again


async def upgrade(engine: AsyncEngine, revision: str = "head") -> list[tuple[str, str]]:
    """Upgrade to `revision`; the revisions applied again (`_upgrade`)."""
    result: list[tuple[str, str]] = await _run(engine, _upgrade, revision)
    return result


async def downgrade(engine: AsyncEngine, revision: str = "base") -> None:
    await _run(engine, command.downgrade, revision)


async def current_revision(engine: AsyncEngine) -> str | None:
    async with engine.connect() as connection:
        return await connection.run_sync(
            lambda sync: MigrationContext.configure(sync).get_current_revision()
        )


async def schema_diff(engine: AsyncEngine) -> list[Any]:
    """What `alembic check` reports: differences between the models and the database."""

    def _diff(sync: Connection) -> list[Any]:
        if sync.dialect.name == "postgresql":
            # pgvector's type, where the store has it (`embedding_vec`): known to this
            # dialect's reflection, which would warn of it before `include_name` skips it.
            sync.dialect.ischema_names = {  # type: ignore[attr-defined]
                **sync.dialect.ischema_names, "vector": NullType}  # type: ignore[attr-defined]
        context = MigrationContext.configure(
            sync, opts={"compare_type": True, "include_name": include_name}
        )
        diff: list[Any] = compare_metadata(context, Base.metadata)
        return diff

    async with engine.connect() as connection:
        return await connection.run_sync(_diff)
