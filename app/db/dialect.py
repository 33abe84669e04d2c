"""The few statements whose spelling differs between Postgres and SQLite."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, String, bindparam, cast, func, literal
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
    return _contains(dialect_name(connection), column, literal(dumps(query)))


def json_contains_param(dialect: str, column: Any, name: str) -> ColumnElement[bool]:
    """`json_contains` with the query the parameter `name`, its JSON text (`dumps`'s): for
    a statement built once per backend (`dialect`, a dialect's name)."""
    return _contains(dialect, column, bindparam(name, type_=String()))


def _contains(dialect: str, column: Any, query: Any) -> ColumnElement[bool]:
    if dialect == "postgresql":
        return cast(column, JSONB).op("@>")(cast(query, JSONB))
    return func.agentstate_json_contains(column, query) == 1
