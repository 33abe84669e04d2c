"""Declarative base, naming convention and the column types every slice shares."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, TypeAlias, cast

from sqlalchemy import JSON, BigInteger, DateTime, Integer, MetaData, Row, String, Table
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.types import TypeDecorator

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# `json` on both backends: it keeps the client's text (key order included), so every backend
# answers with the same bytes. Containment casts to jsonb (see app/db/dialect.py), served by
# GIN expression indexes that the migrations create on Postgres.
JSONType = JSON()


class OpaqueJSON(TypeDecorator[Any]):
    """`JSONType` for a column that may hold any JSON document, a bare number included.

    SQLite gives a column declared `JSON` NUMERIC affinity, which converts stored text that
    reads as a number: the document `2.0` would read back as `2`, `-0.0` as `0`, a 20-digit
    integer rounded to 15 digits. Such a document is bound as a BLOB of its text instead,
    which affinity leaves alone; it reads back (as JSON, or `CAST(... AS TEXT)`) as written.
    """

    impl = JSON
    cache_ok = True

    def bind_processor(self, dialect: Dialect) -> Any:
        serialize = super().bind_processor(dialect)
        if dialect.name != "sqlite" or serialize is None:
            return serialize

        def bind(value: Any) -> Any:
            text = serialize(value)
            if isinstance(text, str) and text[:1] in _NUMBER_START:
                return text.encode()
            return text

        return bind


_NUMBER_START = frozenset("-0123456789")
# SQLite only autoincrements a column declared exactly INTEGER PRIMARY KEY.
BigIntPK = BigInteger().with_variant(Integer(), "sqlite")
# Client-chosen names: 1-255 characters.
Name = String(255)
# Names that lists sort by: byte order on Postgres whatever the database's locale, so both
# backends page in the same order (names are ASCII, where "C" is SQLite's BINARY).
SortedName = String(255).with_variant(String(255, collation="C"), "postgresql")


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC in, timezone-aware UTC out, on every backend.

    SQLite stores it as ISO text that sorts correctly, Postgres as timestamptz.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        moment: datetime = value
        return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


# A row of any shape, as repositories return them (SQLAlchemy types rows by their columns).
AnyRow: TypeAlias = Row[*tuple[Any, ...]]


def table(model: type[Base]) -> Table:
    """A mapped class's table, typed as the `Table` it is."""
    return cast(Table, model.__table__)


def utcnow() -> datetime:
    return datetime.now(UTC)
