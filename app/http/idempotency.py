"""The `Idempotency-Key` header, and the 201 that a first request and its replays share."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import JSONResponse

from app.core.errors import InvalidHeader
from app.http.params import DeclaredHeader, declares
from app.idempotency.service import IdempotencyRequest


@declares(DeclaredHeader(
    "Idempotency-Key", "Makes a retry safe: the same key and body replay the first response "
    "(kept at least 24 h). 1-255 printable ASCII characters; a quoted structured-field string "
    "is accepted too."))
async def _idempotency_request(request: Request) -> IdempotencyRequest | None:
    lines = request.headers.getlist("idempotency-key")
    if not lines:
        return None
    if len(lines) > 1:
        raise InvalidHeader("Send one Idempotency-Key header, not several.")
    key = lines[0].strip()
    if len(key) >= 2 and key[0] == key[-1] == '"':  # sf-string form of the IETF draft
        key = key[1:-1]
    if not 0 < len(key) <= 255 or not all(" " <= char <= "~" for char in key):
        raise InvalidHeader("Idempotency-Key must be 1-255 printable ASCII characters.")
    # The value the body-limit middleware parsed (app/http/routing.py): no second parse.
    body = await request.json() if (await request.body()).strip() else None
    return IdempotencyRequest.of(key, body)


IdempotencyDep = Annotated[IdempotencyRequest | None, Depends(_idempotency_request)]


def created(body: dict[str, Any], replayed: bool, headers: dict[str, str]) -> JSONResponse:
    """201, the same bytes for the first answer and its replays (which say so)."""
    if replayed:
        headers = {**headers, "Idempotent-Replayed": "true"}
    return JSONResponse(body, status_code=201, headers=headers)


def replayable(body: dict[str, Any], replayed: bool) -> JSONResponse:
    """200 with the same bytes for the first answer and its replays (which say so)."""
    return JSONResponse(body, headers={"Idempotent-Replayed": "true"} if replayed else None)
