"""Pagination query parameters and the `Link: rel="next"` header (API.md section 1)."""

from __future__ import annotations

from typing import Annotated, Any, TypeVar
from urllib.parse import parse_qsl, urlencode

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
    path = scope["path"].replace("?", "%3F").replace("#", "%23").replace("\\", "%5C")
    params = [(name, value) for name, value in
              parse_qsl(scope.get("query_string", b"").decode(), keep_blank_values=True)
              if name != "cursor"]
    params.append(("cursor", str(next_cursor)))
    return f"{path}?{urlencode(params)}"
