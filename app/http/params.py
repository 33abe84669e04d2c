"""Parameter types shared by the routers: path and query parameters, and the request headers
dependencies read themselves."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

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


@dataclass(frozen=True)
class DeclaredHeader:
    """A request header that a dependency reads itself and the OpenAPI document declares
    (`app/http/openapi.py` finds it in the dependency's `declared_headers`). Declared as a
    FastAPI parameter instead, it would be looked up and validated on every request, about
    100 Python calls a header, for a validation that cannot fail: a header is a string."""

    name: str
    description: str


F = TypeVar("F", bound=Callable[..., Any])


def declares(*headers: DeclaredHeader) -> Callable[[F], F]:
    """Marks a dependency function as reading `headers` itself (see `DeclaredHeader`)."""
    def mark(function: F) -> F:
        function.declared_headers = headers  # type: ignore[attr-defined]
        return function
    return mark
