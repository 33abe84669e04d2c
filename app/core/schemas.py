"""Types shared by every slice's schemas."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, Self

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    StringConstraints,
)

NAME_PATTERN = r"^[A-Za-z0-9_:@-][A-Za-z0-9._:@-]{0,254}$"
NAME_RULE = "1-255 characters from A-Z a-z 0-9 . _ : @ -, not starting with '.'"


class Strict(BaseModel):
    """Request bodies: unknown members are errors (`unknown_field`), never ignored."""

    model_config = ConfigDict(extra="forbid")


class RowModel(BaseModel):
    """Response bodies built from a database row: `XOut.from_row(row)` is the one way to
    build one. Fields are read by name from the row; a model whose fields differ from its
    columns overrides `from_row`."""

    model_config = ConfigDict(from_attributes=True)

    @classmethod
    def from_row(cls, row: Any) -> Self:
        return cls.model_validate(row)


Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]


def utc_text(value: datetime) -> str:
    """RFC 3339 in UTC (`value` is UTC), microseconds always: `isoformat` pads the year to
    four digits, which `strftime("%Y")` does not (year 999 came out as `999-...`), and is
    faster."""
    return value.isoformat(timespec="microseconds")[:26] + "Z"


# RFC 3339, UTC, always microseconds: the same text on every backend.
Timestamp = Annotated[
    datetime,
    PlainSerializer(utc_text, return_type=str, when_used="json"),
]

JsonObject = dict[str, Any]

INT64_MAX = 2**63 - 1
# An integer a client sends that ends up in a BIGINT column: within int64 (422 beyond).
Int64 = Annotated[int, Field(ge=-INT64_MAX - 1, le=INT64_MAX)]


def as_utc(value: datetime) -> datetime:
    """An aware datetime in UTC; ValueError when it has no offset or no UTC equivalent
    within years 1-9999 (`9999-12-31T23:59:59-14:00`)."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("a timestamp needs a UTC offset (Z or +hh:mm)")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("the timestamp has no UTC equivalent within years 1-9999") from None


def parse_timestamp(text: str) -> datetime:
    """RFC 3339 text (as a cursor carries it) to an aware UTC datetime; ValueError if not."""
    return as_utc(datetime.fromisoformat(text))


_RFC3339_START = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}")


def _rfc3339_text(value: Any) -> Any:
    """Text shaped like RFC 3339 only: pydantic would also read numbers (and numeric text
    such as "0.5") as Unix times, which the document's `date-time` does not allow."""
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str) or _RFC3339_START.match(value) is None:
        raise ValueError("an RFC 3339 timestamp such as 2026-01-31T12:00:00Z")
    return value


# A timestamp a client sends (body or query): RFC 3339 with an offset, read as UTC. A naive
# time is refused (422), never guessed to be UTC.
AwareTimestamp = Annotated[AwareDatetime, BeforeValidator(_rfc3339_text), AfterValidator(as_utc)]
