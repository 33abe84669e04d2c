"""The few statements whose spelling differs between Postgres and SQLite."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, cast, func, literal
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.jsonutil import dumps


def dialect_name(connection: AsyncConnection) -> str:
    return connection.dialect.name


def insert_ignoring_conflicts(dialect: str, model: Any, index_elements: list[str]) -> Any:
    """INSERT ... ON CONFLICT (index_elements) DO NOTHING, for either backend (`dialect`,
    a dialect's name: a statement built once per backend needs no connection)."""
    module = postgresql if dialect == "postgresql" else sqlite
    return module.insert(model).on_conflict_do_nothing(index_elements=index_elements)


def json_contains(connection: AsyncConnection, column: Any, query: Any) -> ColumnElement[bool]:
    """`column @> query` with Postgres jsonb semantics on both backends.

    Columns are stored as `json` (which keeps key order); Postgres compares them as jsonb,
    served by a GIN index on the same expression. SQLite calls our registered function.
    """
    if dialect_name(connection) == "postgresql":
        return cast(column, JSONB).op("@>")(cast(literal(dumps(query)), JSONB))
    return func.agentstate_json_contains(column, dumps(query)) == 1
