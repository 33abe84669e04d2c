"""Path and query parameter types shared by the routers."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path

from app.core.errors import Unprocessable
from app.core.jsonutil import parse_checked
from app.core.schemas import NAME_PATTERN, NAME_RULE


def name_path(description: str) -> Any:
    return Path(pattern=NAME_PATTERN, description=f"{description}; {NAME_RULE}.")


ThreadId = Annotated[str, name_path("Thread id")]
MessageId = Annotated[str, name_path("Message id")]
CompactionId = Annotated[str, name_path("Compaction id")]
AgentName = Annotated[str, name_path("Agent name")]
ServerName = Annotated[str, name_path("Server name")]


def json_object_param(name: str, raw: str | None, max_depth: int) -> dict[str, Any] | None:
    """A query parameter that carries a JSON object (`?metadata=`, `?state_contains=`), under
    the body rules (depth, numbers in double range, no U+0000 or lone surrogates): 422."""
    if raw is None:
        return None
    try:
        value = parse_checked(raw.encode("utf-8", "surrogatepass"), max_depth, parameter=name)
    except (ValueError, UnicodeDecodeError):
        value = None
    if not isinstance(value, dict):
        raise Unprocessable(
            f"{name} must be a JSON object, e.g. {name}={{\"team\":\"research\"}}.",
            errors=[{"parameter": name, "code": "json_object", "message": "not a JSON object"}],
        )
    return value
