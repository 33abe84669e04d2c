"""Pagination query parameters and the `Link: rel="next"` header (API.md section 1)."""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, Any, TypeVar
from urllib.parse import parse_qsl, quote_plus, urlencode

from fastapi import Query, Request, Response

from app.core.pagination import Page, RenderedPage

T = TypeVar("T")

Limit = Annotated[int, Query(ge=1, le=100, description="Page size, 1-100.")]
Cursor = Annotated[str | None, Query(description="Opaque cursor from `next_cursor`.")]


def linked(request: Request, response: Response, page: Page[T]) -> Page[T]:
    """The page, with `Link: <...>; rel="next"` when there is a next page."""
    set_next_link(request, response, page.next_cursor if page.has_more else None)
    return page


def linked_json(request: Request, page: RenderedPage) -> Response:
    """A page rendered ahead (`RenderedPage`) as the response, with `Link` like `linked`."""
    response = Response(page.json(), media_type="application/json")
    set_next_link(request, response, page.next_cursor)
    return response


def set_next_link(request: Request, response: Response, next_cursor: Any) -> None:
    """A relative reference (path and query), or an absolute URL on the configured
    `public_base_url`; never built from the client's Host header."""
    if next_cursor is not None:
        target = next_target(request.scope, next_cursor)
        base = request.app.state.settings.public_base_url
        if base:
            target = base.rstrip("/") + target
        response.headers["Link"] = f'<{target}>; rel="next"'


def next_target(scope: Any, next_cursor: Any) -> str:
    """The request's path and query with `cursor` set to `next_cursor`: what Starlette's
    `request.url.include_query_params(cursor=...)` gives as path and query, without
    building the request's URL twice (a tenth of a page's CPU). tests/test_http_semantics.py
    holds the two equal."""
    path, query = scope["path"], scope.get("query_string", b"")
    before = (_recent_before_cursor if len(path) + len(query) <= CACHED_TARGET
              else _before_cursor)
    return before(path, query) + quote_plus(str(next_cursor))


def _before_cursor(path: str, query: bytes) -> str:
    """`next_target` up to the cursor's value."""
    params = [(name, value) for name, value in
              parse_qsl(query.decode(), keep_blank_values=True) if name != "cursor"]
    params.append(("cursor", ""))
    path = path.replace("?", "%3F").replace("#", "%23").replace("\\", "%5C")
    return f"{path}?{urlencode(params)}"


# Kept for the queries asked lately (a client reading the newest page of a conversation
# again and again asks the same one), up to a size: 256 of them hold at most half a MiB.
CACHED_TARGET = 1024
_recent_before_cursor = lru_cache(maxsize=256)(_before_cursor)
