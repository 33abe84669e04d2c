"""Precondition headers (RFC 9110 section 13) read into `app.core.revisions.Preconditions`,
and the conditional GET (304) every revisioned resource answers the same way."""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from fastapi import Depends, Header, Response

from app.core.revisions import ETagList, Preconditions, etag, not_modified

_IF_MATCH = '`"<revision>"`, a list of them, or `*`. Strong comparison.'


async def _conditions(
    if_match: Annotated[str | None, Header(alias="If-Match", description=_IF_MATCH)] = None,
    if_none_match: Annotated[str | None, Header(
        alias="If-None-Match", description="`*` to create only.")] = None,
) -> Preconditions:
    return Preconditions(ETagList.parse("If-Match", if_match),
                         ETagList.parse("If-None-Match", if_none_match))


async def _if_match_only(
    if_match: Annotated[str | None, Header(
        alias="If-Match",
        description="Optional: the thread's `\"<revision>\"` (or a list, or `*`); 412 otherwise.",
    )] = None,
) -> Preconditions:
    return Preconditions(ETagList.parse("If-Match", if_match))


async def _validator(
    if_none_match: Annotated[str | None, Header(
        alias="If-None-Match", description="The ETag you hold: 304 if it is still current.",
    )] = None,
) -> ETagList | None:
    return ETagList.parse("If-None-Match", if_none_match)


# PUT, PATCH, DELETE of a revisioned resource.
Conditions = Annotated[Preconditions, Depends(_conditions)]
# Writes to a thread's children (append, compact, revert): only If-Match, on the thread.
ThreadIfMatch = Annotated[Preconditions, Depends(_if_match_only)]
# GET: If-None-Match for a 304.
Validator = Annotated[ETagList | None, Depends(_validator)]

M = TypeVar("M")


def with_etag(response: Response, body: M, revision: int) -> M:
    response.headers["ETag"] = etag(revision)
    return body


def conditional(response: Response, body: M, revision: int,
                validator: ETagList | None) -> M | Response:
    """GET of a revisioned resource: 304 with the ETag when the client holds the current one,
    else the body with its ETag."""
    if not_modified(validator, revision):
        return Response(status_code=304, headers={"ETag": etag(revision)})
    return with_etag(response, body, revision)


NOT_MODIFIED: dict[int | str, dict[str, Any]] = {
    304: {"description": "Not Modified: If-None-Match names the current ETag."}}
