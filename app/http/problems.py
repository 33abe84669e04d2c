"""Rendering of every error as `application/problem+json`, and its OpenAPI declaration."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.core.errors import (
    AppError,
    InvalidJson,
    Unprocessable,
    problem_from_status,
)
from app.db.diagnosis import FAILURES

log = logging.getLogger("agentstate.errors")
PROBLEM_JSON = "application/problem+json"


class ProblemError(BaseModel):
    pointer: str | None = Field(None, description="JSON Pointer into the request body.")
    parameter: str | None = Field(None, description="Query, path or header parameter name.")
    code: str
    message: str


class Problem(BaseModel):
    """RFC 9457 problem details."""

    model_config = ConfigDict(extra="allow")
    type: str
    title: str
    status: int
    detail: str
    instance: str
    code: str = Field(description="Stable snake_case error code.")
    current_revision: int | None = Field(None, description="On 412: the current revision.")
    errors: list[ProblemError] | None = None


DESCRIPTIONS = {
    400: "Malformed request (body not JSON, bad header or cursor).",
    401: "Missing or unknown API key.",
    403: "The key lacks the scope.",
    404: "Not found.",
    406: "The response asked for is not one the client accepts (`Accept`).",
    409: "Conflict.",
    410: "The thread was deleted.",
    412: "Precondition failed (If-Match / If-None-Match).",
    413: "Body too large.",
    414: "The request URI is longer than 8 KiB (its query parameters, e.g. many long channel "
         "names).",
    415: "Content-Type is not JSON.",
    422: "Body or parameters break the schema or a limit.",
    428: "If-Match (or If-None-Match: *) is required.",
    500: "The server cannot encrypt or decrypt secrets (no or wrong AGENTSTATE_SECRET_KEYS).",
    503: "Database unavailable, or a statement cancelled after a wait; retry after "
         "Retry-After seconds.",
}
COMMON = (400, 401, 403, 422, 503)


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` for a route: the common errors plus `statuses`."""
    return {
        status: {
            "model": Problem,
            "description": DESCRIPTIONS[status],
            "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        for status in sorted({*COMMON, *statuses})
    }


def problem_response(error: AppError, instance: str) -> JSONResponse:
    return JSONResponse(
        error.body(instance), status_code=error.status, headers=error.headers,
        media_type=PROBLEM_JSON,
    )


def _pointer(loc: tuple[Any, ...]) -> str:
    return "/" + "/".join(str(part).replace("~", "~0").replace("/", "~1") for part in loc)


def validation_error(errors: list[dict[str, Any]]) -> AppError:
    """Pydantic errors to one 422 (or 400 if the body was not JSON at all)."""
    if any(err.get("type") == "json_invalid" for err in errors):
        return InvalidJson("The request body is not valid JSON.")
    items: list[dict[str, Any]] = []
    for err in errors:
        loc = tuple(err.get("loc", ()))
        code = "unknown_field" if err.get("type") == "extra_forbidden" else str(err.get("type"))
        message = str(err.get("msg", "invalid"))
        if loc and loc[0] == "body":
            items.append({"pointer": _pointer(loc[1:]), "code": code, "message": message})
        elif loc:  # (where, name) or, for one of a repeated query parameter, (where, name, n)
            items.append({"parameter": str(loc[1] if len(loc) > 1 else loc[0]), "code": code,
                          "message": message})
        else:
            items.append({"pointer": "", "code": code, "message": message})
    unknown = [item for item in items if item["code"] == "unknown_field"]
    error = Unprocessable(
        "Unknown member " + ", ".join(i.get("pointer") or "" for i in unknown)
        if unknown
        else "; ".join(f"{i.get('pointer') or i.get('parameter')}: {i['message']}" for i in items),
        errors=items,
    )
    if unknown:
        error.code = "unknown_field"
    return error


def install_handlers(app: FastAPI) -> None:
    async def app_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, AppError)
        return problem_response(exc, request.url.path)

    async def request_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return problem_response(validation_error(list(exc.errors())), request.url.path)

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        error = problem_from_status(exc.status_code, str(exc.detail) if exc.detail else None)
        response = problem_response(error, request.url.path)
        for key, value in (exc.headers or {}).items():
            response.headers[key] = value
        return response

    async def database_error(request: Request, exc: Exception) -> JSONResponse:
        # A failure that did not pass through Database.read() / write(), which answer it
        # themselves: the same 503 (app/db/diagnosis.py), or a 500 when it is a bug.
        error = request.app.state.db.unavailable(exc)
        if error is None:
            log.error("unhandled %s", type(exc).__name__, exc_info=exc)
            response = problem_response(AppError("An unexpected error occurred."),
                                        request.url.path)
            response.headers["Connection"] = "close"
            return response
        return problem_response(error, request.url.path)

    # Any other exception reaches app.http.middleware.RequestContextMiddleware (a 500 with
    # X-Request-ID and Connection: close). Not a handler for Exception here: Starlette hands
    # those to its outermost middleware, which re-raises them to the server after answering.
    app.add_exception_handler(AppError, app_error)
    app.add_exception_handler(RequestValidationError, request_validation)
    app.add_exception_handler(StarletteHTTPException, http_error)
    for exc_type in FAILURES:
        app.add_exception_handler(exc_type, database_error)
