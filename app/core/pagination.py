"""Keyset pagination: opaque cursors, the list envelope and the `Link: rel="next"` header."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Generic, TypeVar

from fastapi import Query, Request, Response
from pydantic import BaseModel

from app.core.errors import InvalidCursor

T = TypeVar("T")

Limit = Annotated[int, Query(ge=1, le=100, description="Page size, 1-100.")]
Cursor = Annotated[str | None, Query(description="Opaque cursor from `next_cursor`.")]


class Page(BaseModel, Generic[T]):
    data: list[T]
    next_cursor: str | None
    has_more: bool


def encode_cursor(kind: str, values: Sequence[Any]) -> str:
    raw = json.dumps([kind, *values], separators=(",", ":"), default=str).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(kind: str, cursor: str | None, arity: int) -> list[Any] | None:
    """The keyset values in a cursor made by `encode_cursor(kind, ...)`; 400 if it is not one."""
    if cursor is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        decoded = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        decoded = None
    if not isinstance(decoded, list) or len(decoded) != arity + 1 or decoded[0] != kind:
        raise InvalidCursor("The cursor is not one this list handed out.")
    return decoded[1:]


def decode_name_cursor(kind: str, cursor: str | None, arity: int) -> tuple[str, ...] | None:
    """`decode_cursor` for lists keyed by names (strings) only."""
    values = decode_cursor(kind, cursor, arity)
    if values is None:
        return None
    if not all(isinstance(value, str) for value in values):
        raise InvalidCursor("The cursor is not one this list handed out.")
    return tuple(values)


def split_page(kind: str, rows: Sequence[T], limit: int,
               key: Callable[[T], Sequence[Any]]) -> tuple[list[T], str | None]:
    """Rows fetched with `limit + 1`: the page, and the cursor after it if there is more."""
    page = list(rows[:limit])
    more = len(rows) > limit
    return page, encode_cursor(kind, key(page[-1])) if more else None


def set_next_link(request: Request, response: Response, next_cursor: str | None) -> None:
    if next_cursor is not None:
        url = request.url.include_query_params(cursor=next_cursor)
        response.headers["Link"] = f'<{url}>; rel="next"'
