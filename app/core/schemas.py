"""Types shared by every slice's schemas."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, PlainSerializer, StringConstraints

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


def _utc_text(value: datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# RFC 3339, UTC, always microseconds: the same text on every backend.
Timestamp = Annotated[
    datetime,
    PlainSerializer(_utc_text, return_type=str, when_used="json"),
]

JsonObject = dict[str, Any]
