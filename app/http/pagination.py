"""Pagination query parameters and the `Link: rel="next"` header (API.md section 1)."""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from fastapi import Query, Request, Response

from app.core.pagination import Page

T = TypeVar("T")

Limit = Annotated[int, Query(ge=1, le=100, description="Page size, 1-100.")]
Cursor = Annotated[str | None, Query(description="Opaque cursor from `next_cursor`.")]


def linked(request: Request, response: Response, page: Page[T]) -> Page[T]:
    """The page, with `Link: <...>; rel="next"` when there is a next page."""
    set_next_link(request, response, page.next_cursor if page.has_more else None)
    return page


def set_next_link(request: Request, response: Response, next_cursor: Any) -> None:
    if next_cursor is not None:
        url = request.url.include_query_params(cursor=next_cursor)
        response.headers["Link"] = f'<{url}>; rel="next"'
