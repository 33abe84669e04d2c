"""Types shared by every slice's schemas."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any

from fastapi import Path
from pydantic import BaseModel, ConfigDict, PlainSerializer, StringConstraints

from app.core.errors import Unprocessable

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


def json_object_param(name: str, raw: str | None) -> dict[str, Any] | None:
    """A query parameter that carries a JSON object (`?metadata=`, `?state_contains=`)."""
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise Unprocessable(
            f"{name} must be a JSON object, e.g. {name}={{\"team\":\"research\"}}.",
            errors=[{"parameter": name, "code": "json_object", "message": "not a JSON object"}],
        )
    return value
