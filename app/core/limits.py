"""Limits that come from settings and so are checked in services, not in static schemas."""

from __future__ import annotations

from typing import Any

from app.core.errors import Unprocessable
from app.core.settings import Settings


def check_metadata(metadata: dict[str, Any] | None, settings: Settings,
                   pointer: str = "/metadata") -> None:
    if metadata is not None and len(metadata) > settings.max_metadata_keys:
        raise Unprocessable(
            f"metadata may have at most {settings.max_metadata_keys} keys.",
            errors=[{"pointer": pointer, "code": "too_many_keys",
                     "message": f"at most {settings.max_metadata_keys} keys"}],
        )
