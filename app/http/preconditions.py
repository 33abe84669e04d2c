"""Precondition headers (RFC 9110 section 13) read into `app.core.revisions.Preconditions`,
and the conditional GET (304, or 412 for If-Match) every revisioned resource answers the
same way.

A header sent as several field lines is one comma-separated list (RFC 9110 section 5.3): the
lines are joined before parsing, so no line is silently dropped.
"""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import Request, Response
from pydantic import BaseModel

from app.core.errors import RevisionMismatch
from app.core.revisions import NONE, ETagList, Preconditions, etag, not_modified
from app.http.params import DeclaredHeader

_IF_MATCH = '`"<revision>"`, a list of them, or `*`. Strong comparison.'


# GET of a revisioned resource: If-Match (412) and If-None-Match (304).
VALIDATOR = (DeclaredHeader("If-None-Match", "The ETag you hold: 304 if it is still current."),
             DeclaredHeader("If-Match", "412 unless it names the current ETag (or is `*`)."))
# PUT, PATCH, DELETE of a revisioned resource.
CONDITIONS = (DeclaredHeader("If-Match", _IF_MATCH),
              DeclaredHeader("If-None-Match", "`*` to create only."))
# Writes to a thread's children (append, compact, revert): only If-Match, on the thread.
THREAD_IF_MATCH = (DeclaredHeader(
    "If-Match", "Optional: the thread's `\"<revision>\"` (or a list, or `*`); 412 otherwise."),)


def _joined(request: Request, name: str) -> str | None:
    lines = request.headers.getlist(name)
    return ", ".join(lines) if lines else None


def read_preconditions(request: Request, headers: tuple[DeclaredHeader, ...]) -> Preconditions:
    """The preconditions among `headers` that the request sends (400 for a malformed one,
    If-Match first)."""
    if not headers:
        return NONE
    names = {header.name for header in headers}
    return Preconditions(
        ETagList.parse("If-Match", _joined(request, "if-match")) if "If-Match" in names
        else None,
        ETagList.parse("If-None-Match", _joined(request, "if-none-match"))
        if "If-None-Match" in names else None)


M = TypeVar("M")


def with_etag(response: Response, body: M, revision: int) -> M:
    response.headers["ETag"] = etag(revision)
    return body


def conditional(response: Response, body: M, revision: int,
                validator: Preconditions) -> M | Response:
    """GET of a revisioned resource, RFC 9110 section 13.2.2: 412 when If-Match names no
    current ETag; 304 with the ETag when the client holds the current one; else the body
    with its ETag."""
    if validator.if_match is not None and not validator.if_match.matches_strong(revision):
        raise RevisionMismatch(revision)
    if not_modified(validator.if_none_match, revision):
        return Response(status_code=304, headers={"ETag": etag(revision)})
    return with_etag(response, body, revision)


def model_json(body: BaseModel | str, *, status_code: int = 200,
               headers: dict[str, str] | None = None) -> Response:
    """The body as JSON, serialised once by its own model (or rendered already, as text):
    the bytes the route's response model would send, without FastAPI validating again a
    model that was built validated (the route keeps declaring its `response_model` for the
    OpenAPI document; a returned Response carries its headers itself)."""
    text = body if isinstance(body, str) else body.model_dump_json()
    return Response(text, status_code=status_code, media_type="application/json",
                    headers=headers)


def json_with_etag(body: BaseModel | str, revision: int, *, status_code: int = 200,
                   headers: dict[str, str] | None = None) -> Response:
    """`model_json` with the body's ETag."""
    return model_json(body, status_code=status_code,
                      headers={"ETag": etag(revision), **(headers or {})})


def conditional_json(body: BaseModel | str, revision: int,
                     validator: Preconditions) -> Response:
    """`conditional`, answered with `json_with_etag`."""
    unchanged = conditional(Response(), body, revision, validator)
    if isinstance(unchanged, Response):
        return unchanged
    return json_with_etag(body, revision)


NOT_MODIFIED: dict[int | str, dict[str, Any]] = {
    304: {"description": "Not Modified: If-None-Match names the current ETag."},
    412: {"description": "If-Match names no current ETag."}}
