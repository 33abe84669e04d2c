"""Keyset pagination: opaque cursors and the list envelope. (The query parameters and the
`Link` header are in `app/http/pagination.py`.)"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from app.core.errors import InvalidCursor

T = TypeVar("T")
R = TypeVar("R")


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
        raise bad_cursor()
    if not all(_storable(value) for value in decoded[1:]):
        raise bad_cursor()  # we never hand out a number a BIGINT column cannot hold
    return decoded[1:]


def _storable(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    return -(2**63) <= value < 2**63


def decode_name_cursor(kind: str, cursor: str | None, arity: int) -> tuple[str, ...] | None:
    """`decode_cursor` for lists keyed by names (strings) only."""
    values = decode_cursor(kind, cursor, arity)
    if values is None:
        return None
    if not all(isinstance(value, str) for value in values):
        raise bad_cursor()
    return tuple(values)


def bad_cursor() -> InvalidCursor:
    return InvalidCursor("The cursor is not one this list handed out.")


def split_page(kind: str, rows: Sequence[R], limit: int, key: Callable[[R], Sequence[Any]],
               out: Callable[[R], T], *, max_bytes: int | None = None) -> Page[T]:
    """Rows fetched with `limit + 1`: the page of `out(row)`s, with the cursor after it if
    there is more.

    With `max_bytes` (`AGENTSTATE_MAX_PAGE_BYTES`) the page also ends early, with a cursor,
    once its rows add up to more than that many bytes (measured on the row as read, a close
    estimate of its JSON); a page always holds at least one item, so any item is readable.
    """
    page = list(rows[:limit])
    if max_bytes is not None:
        total = 0
        for index, row in enumerate(page):
            total += _row_bytes(row)
            if total > max_bytes and index > 0:
                page = page[:index]
                break
    more = len(rows) > len(page)
    return Page(data=[out(row) for row in page],
                next_cursor=encode_cursor(kind, key(page[-1])) if more else None,
                has_more=more)


class RenderedPage:
    """A page whose items are already JSON text (a hot list renders its rows without a model
    per row); `json()` is the same envelope `Page` serialises to."""

    def __init__(self, items: list[str], next_cursor: str | None) -> None:
        self.items = items
        self.next_cursor = next_cursor

    @property
    def has_more(self) -> bool:
        return self.next_cursor is not None

    def data_json(self) -> str:
        return "[" + ",".join(self.items) + "]"

    def cursor_json(self) -> str:
        return json.dumps(self.next_cursor)

    def json(self) -> str:
        more = "true" if self.has_more else "false"
        return (f'{{"data":{self.data_json()},"next_cursor":{self.cursor_json()},'
                f'"has_more":{more}}}')


def split_rendered(kind: str, rows: Sequence[R], limit: int,
                   key: Callable[[R], Sequence[Any]], render: Callable[[R], str], *,
                   max_bytes: int) -> RenderedPage:
    """`split_page` for rows rendered to JSON text by `render(row)`: the byte budget counts
    the rendered text itself."""
    items: list[str] = []
    total = 0
    for row in rows[:limit]:
        item = render(row)
        total += len(item)
        if total > max_bytes and items:
            break
        items.append(item)
    more = len(rows) > len(items)
    return RenderedPage(items, encode_cursor(kind, key(rows[len(items) - 1])) if more else None)


def _row_bytes(row: Any) -> int:
    return len(str(tuple(row) if isinstance(row, Sequence) else row))
