"""Limits that come from settings and so are checked in services, not in static schemas."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request

from app.core.errors import Unprocessable
from app.core.settings import Settings


# async: FastAPI runs a plain `def` dependency in its thread pool, a thread hop per request.
async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


def check_metadata(metadata: dict[str, Any] | None, settings: Settings,
                   pointer: str = "/metadata") -> None:
    if metadata is not None and len(metadata) > settings.max_metadata_keys:
        raise Unprocessable(
            f"metadata may have at most {settings.max_metadata_keys} keys.",
            errors=[{"pointer": pointer, "code": "too_many_keys",
                     "message": f"at most {settings.max_metadata_keys} keys"}],
        )
