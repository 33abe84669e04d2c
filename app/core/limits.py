"""Limits that come from settings and so are checked in services, not in static schemas."""

from __future__ import annotations

from typing import Any

from app.core.errors import Unprocessable
from app.core.settings import Settings


def count_keys(value: Any, stop_after: int) -> int:
    """The members of every object in `value`, nested ones included (iterative: no recursion
    limit); counting stops once past `stop_after`."""
    count, stack = 0, [value]
    while stack and count <= stop_after:
        item = stack.pop()
        if isinstance(item, dict):
            count += len(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count


def check_metadata(metadata: dict[str, Any] | None, settings: Settings,
                   pointer: str = "/metadata") -> None:
    """At most `max_metadata_keys` keys, counting the keys of nested objects too."""
    limit = settings.max_metadata_keys
    if metadata is not None and count_keys(metadata, limit) > limit:
        raise Unprocessable(
            f"metadata may have at most {limit} keys, nested ones included.",
            errors=[{"pointer": pointer, "code": "too_many_keys",
                     "message": f"at most {limit} keys, nested ones included"}],
        )
