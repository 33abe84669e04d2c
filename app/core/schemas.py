"""Types shared by every slice's schemas."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import Path
from pydantic import BaseModel, ConfigDict, PlainSerializer, StringConstraints

NAME_PATTERN = r"^[A-Za-z0-9_:@-][A-Za-z0-9._:@-]{0,254}$"
NAME_RULE = "1-255 characters from A-Z a-z 0-9 . _ : @ -, not starting with '.'"


class Strict(BaseModel):
    """Request bodies: unknown members are errors (`unknown_field`), never ignored."""

    model_config = ConfigDict(extra="forbid")


Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]


def name_path(description: str) -> Any:
    return Path(pattern=NAME_PATTERN, description=f"{description}; {NAME_RULE}.")


def _utc_text(value: datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# RFC 3339, UTC, always microseconds: the same text on every backend.
Timestamp = Annotated[
    datetime,
    PlainSerializer(_utc_text, return_type=str, when_used="json"),
]

JsonObject = dict[str, Any]

