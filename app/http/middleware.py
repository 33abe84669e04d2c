"""Pure ASGI middleware, outermost first:

- `RequestContextMiddleware`: X-Request-ID on every response, the access log and metrics, and
  the last word on an unhandled error (a problem+json 500 that closes the connection).
- `RequestShapeMiddleware`: what is decided from the request line alone, before any handler:
  414 for a URI over 8 KiB, 422 for U+0000 in a query parameter, and the methods of a path
  (RFC 9110): OPTIONS (204 + Allow), HEAD as GET without the body, 405 with the full Allow,
  `Accept-Patch` on PATCH. All generated from the application's routes.
- `BodyLimitMiddleware`: body size (413), then on `/v1` and `/langgraph` the caller's key
  (401/403), then the body's media type (415) and JSON rules (400/422), parsed once.
"""

from __future__ import annotations

import logging
import os
import re
import time
from typing import Any
from urllib.parse import parse_qsl

from starlette.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.errors import (
    AppError,
    Forbidden,
    InvalidJson,
    PayloadTooLarge,
    Unprocessable,
    UnsupportedMediaType,
    problem_from_status,
)
from app.core.jsonutil import parse_checked
from app.core.logging import request_id_var
from app.core.metrics import Metrics
from app.http.dependencies import PRINCIPAL, SDK_PREFIX, authenticate
from app.http.plan import PARSED_BODY
from app.http.problems import problem_response

access_log = logging.getLogger("agentstate.access")
error_log = logging.getLogger("agentstate.errors")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:@-]{1,128}$")
_BODY_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
# Checkpoint writes have their own, higher body limit (AGENTSTATE_MAX_CHECKPOINT_BODY_BYTES).
_CHECKPOINTS = re.compile(r"^/v1/threads/[^/]+/checkpoints(/|$)")
# POSTs that only read (a body too long for a URL): a read-only key learns its body's errors.
_READING_POSTS = re.compile(r"^/(v1|langgraph)/store/(items/search|namespaces)$")


MAX_URI_BYTES = 8192
# The order methods are listed in an Allow header.
_METHOD_ORDER = ("GET", "HEAD", "PUT", "PATCH", "POST", "DELETE", "OPTIONS")
_ROUTE_METHODS = ("GET", "PUT", "PATCH", "POST", "DELETE")
ACCEPT_PATCH = "application/merge-patch+json, application/json"


class RequestContextMiddleware:
    """X-Request-ID on every response (echoed if valid), one access-log line, metrics.

    An error nothing else handled ends here: logged with its traceback, answered as a
    problem+json 500 with `Connection: close` (the server closes the connection rather than
    leave it in an unknown state), never re-raised to the server.
    """

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics
        # The metrics' children by label values, looked up once: `labels()` checks and
        # joins its arguments on every call. Bounded: routes x methods x statuses.
        self._counted: dict[tuple[str, str, int], Any] = {}
        self._timed: dict[tuple[str, str], Any] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_of(scope)
        token = request_id_var.set(request_id)
        status = 500
        response_started = False
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status, response_started
            if message["type"] == "http.response.start":
                status = message["status"]
                response_started = True
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception as exc:
            error_log.error("unhandled %s", type(exc).__name__, exc_info=exc)
            if response_started:
                raise  # nothing left to say: the server drops the connection
            response = problem_response(AppError("An unexpected error occurred."),
                                        scope["path"])
            response.headers["Connection"] = "close"
            await response(scope, receive, send_with_id)
        finally:
            elapsed = time.perf_counter() - started
            template = route_template(scope)
            method = scope["method"]
            counted = self._counted.get((method, template, status))
            if counted is None:
                counted = self._counted[(method, template, status)] = \
                    self.metrics.requests.labels(method, template, str(status))
            counted.inc()
            timed = self._timed.get((method, template))
            if timed is None:
                timed = self._timed[(method, template)] = \
                    self.metrics.latency.labels(method, template)
            timed.observe(elapsed)
            if status == 412:
                self.metrics.conflicts.labels(template).inc()
            access_log.info(
                "%s %s %s", method, template, status,
                extra={"method": method, "route": template, "status": status,
                       "duration_ms": round(elapsed * 1000, 3)},
            )
            request_id_var.reset(token)


class RequestShapeMiddleware:
    """What the request line decides, for every path of the application (module docstring).

    The methods of a path are those some route of the application matches it with (asked of
    the routes themselves, so an endpoint added later is covered); a request whose method
    matches goes straight on after one pass. A path no route matches goes on to the router
    (its 404).

    A (method, path) that matched fully is remembered (up to `KNOWN` of them), so the
    requests an agent repeats on its threads skip the pass: only a full match is kept, and a
    route removed since only means the router answers the request (its 404) itself.
    """

    KNOWN = 4096

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._full: set[tuple[str, str]] = set()

    @staticmethod
    def _matches(scope: Scope, method: str) -> Match:
        """How the application's routes match this path with `method` (Starlette's public
        `BaseRoute.matches`: FULL, PARTIAL for the path with another method, or NONE)."""
        probe = {**scope, "method": method}
        best = Match.NONE
        routes: list[BaseRoute] = scope["app"].routes
        for route in routes:
            match, _ = route.matches(probe)
            if match == Match.FULL:
                return Match.FULL
            if match == Match.PARTIAL:
                best = match
        return best

    def _methods(self, scope: Scope) -> set[str] | None:
        """The methods of this path (with HEAD for GET, and OPTIONS); None: no route."""
        methods = {m for m in _ROUTE_METHODS if self._matches(scope, m) == Match.FULL}
        if not methods:
            return None
        if "GET" in methods:
            methods.add("HEAD")
        methods.add("OPTIONS")
        return methods

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or "app" not in scope:
            await self.app(scope, receive, send)
            return
        try:
            self._check_request_line(scope)
        except AppError as error:
            await problem_response(error, scope["path"][:200])(scope, receive, send)
            return
        method = scope["method"]
        key = (method, scope["path"])
        if key in self._full or (method in _ROUTE_METHODS
                                 and self._matches(scope, method) == Match.FULL):
            if key not in self._full:
                if len(self._full) >= self.KNOWN:
                    self._full.clear()
                self._full.add(key)
            if method == "PATCH":  # the common case: one pass over the routes
                send = _with_headers(send, [(b"accept-patch", ACCEPT_PATCH.encode())])
            await self.app(scope, receive, send)
            return
        methods = self._methods(scope)
        if methods is None:  # no route has this path: the router's 404
            await self.app(scope, receive, send)
            return
        allow = ", ".join(m for m in _METHOD_ORDER if m in methods)
        extra = {"Allow": allow}
        if "PATCH" in methods:
            extra["Accept-Patch"] = ACCEPT_PATCH
        if method == "OPTIONS":
            await Response(status_code=204, headers=extra)(scope, receive, send)
        elif method == "HEAD" and "GET" in methods:
            as_get = {**scope, "method": "GET"}
            try:
                await self.app(as_get, receive, _without_body(send))
            finally:
                if "route" in as_get:  # the route that answered, for the metrics' label
                    scope["route"] = as_get["route"]
        else:
            refusal = problem_from_status(
                405, f"{method} is not allowed here; Allow: {allow}.", headers=extra)
            await problem_response(refusal, scope["path"])(scope, receive, send)

    @staticmethod
    def _check_request_line(scope: Scope) -> None:
        raw_path = scope.get("raw_path") or scope["path"].encode()
        query = scope.get("query_string", b"")
        if len(raw_path) + len(query) > MAX_URI_BYTES:
            raise problem_from_status(
                414, f"The request URI is longer than {MAX_URI_BYTES} bytes.")
        if b"%00" in query or b"\x00" in query:
            for name, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
                if "\x00" in name or "\x00" in value:
                    raise Unprocessable(
                        f"Query parameter {name.replace(chr(0), '?')!r} contains U+0000.",
                        errors=[{"parameter": name.replace("\x00", ""), "code": "invalid_string",
                                 "message": "U+0000 is not allowed in a string"}])


def route_template(scope: Scope) -> str:
    """The path of the route that answered, as the OpenAPI document writes it
    (`/v1/threads/{thread_id}`, never a converter's `{checkpoint_id:checkpoint_id}`): the
    `route` label of the metrics and the access log. FastAPI names its own routes in the
    scope; the application's plain routes (`/docs`, `/openapi.json`) are found by matching
    them. "unmatched": no route answered (a path no route has, or a request this module
    answers before routing: OPTIONS, 405, 414)."""
    route = scope.get("route")
    if route is None and "app" in scope:
        route = next((candidate for candidate in scope["app"].routes
                      if hasattr(candidate, "path_format")
                      and candidate.matches(scope)[0] == Match.FULL), None)
    return getattr(route, "path_format", None) or "unmatched"


def _without_body(send: Send) -> Send:
    async def head_send(message: Message) -> None:
        if message["type"] == "http.response.body":
            message = {**message, "body": b""}
        await send(message)

    return head_send


def _with_headers(send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
    async def send_with(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return send_with


class BodyLimitMiddleware:
    """Enforce the body limits before any handler or database work (API.md section 1).

    In this order: size, counted on the bytes received, chunked or not (413); on `/v1` and
    `/langgraph`, the caller's key (401, and 403 for a key that may not write when the body
    is refused): a caller without a valid key learns nothing about what its body would have
    done; then a body needs a JSON Content-Type (415; JSON Patch is 415 on PATCH) and is
    parsed once with the JSON rules (400 not JSON; 422 too deep, number out of range, U+0000
    or a lone surrogate). The parsed value goes on in the scope (`PARSED_BODY`).
    """

    def __init__(self, app: ASGIApp, max_bytes: int, max_depth: int,
                 max_checkpoint_bytes: int | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_depth = max_depth
        self.max_checkpoint_bytes = max_checkpoint_bytes or max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        try:
            body = await self._read(scope, receive)
            principal = None
            if scope["path"].startswith(("/v1/", SDK_PREFIX)):
                principal = await authenticate(scope["app"], scope["path"],
                                               _headers(scope, b"authorization"),
                                               _headers(scope, b"x-api-key"))
                scope[PRINCIPAL] = principal
            try:
                parsed = self._check(scope, body)
            except AppError:
                if principal is not None and not principal.can("write") \
                        and not _READING_POSTS.match(scope["path"]):
                    raise Forbidden("This API key lacks the 'write' scope.") from None
                raise
            if parsed is not None:
                scope[PARSED_BODY] = parsed
        except AppError as error:
            await problem_response(error, scope["path"])(scope, receive, send)
            return

        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _read(self, scope: Scope, receive: Receive) -> bytes:
        limit = (self.max_checkpoint_bytes if _CHECKPOINTS.match(scope["path"])
                 else self.max_bytes)
        declared = _header(scope, b"content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise PayloadTooLarge(f"The body exceeds {limit} bytes.")
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"The body exceeds {limit} bytes.")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    def _check(self, scope: Scope, body: bytes) -> tuple[Any] | None:
        """The parsed body as a 1-tuple (None: no body)."""
        if not body.strip():
            return None
        content_type = _header(scope, b"content-type")
        if content_type is None:
            raise UnsupportedMediaType(
                "The body has no Content-Type; send Content-Type: application/json.")
        media = content_type.split(";")[0].strip().lower()
        if media == "application/json-patch+json" and scope["method"] == "PATCH":
            raise UnsupportedMediaType(
                "JSON Patch is not supported; send a JSON Merge Patch (RFC 7396) as "
                "application/merge-patch+json.", headers={"Accept-Patch": ACCEPT_PATCH})
        if not (media == "application/json" or media.endswith("+json")):
            raise UnsupportedMediaType(
                f"Content-Type {media!r} is not JSON; send Content-Type: application/json."
            )
        try:
            return (parse_checked(body, self.max_depth),)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidJson(f"The request body is not valid JSON: {_short(exc)}") from None


def _short(exc: Exception) -> str:
    return str(exc).split(":")[0][:120]


def request_id_of(scope: Scope) -> str:
    """The request's `X-Request-ID`: the client's, if it sent a well-formed one, else new."""
    incoming = _header(scope, b"x-request-id")
    # 32 random hex digits, as `uuid4().hex` gave, without building a UUID (2 us a request).
    return incoming if incoming and _REQUEST_ID.match(incoming) else os.urandom(16).hex()


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def _headers(scope: Scope, name: bytes) -> list[str]:
    return [bytes(value).decode("latin-1") for key, value in scope.get("headers", [])
            if key == name]


def install_middleware(app: Any, metrics: Metrics, max_bytes: int, max_depth: int,
                       max_checkpoint_bytes: int | None = None) -> None:
    # Starlette wraps in reverse order: the last added is outermost.
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_bytes, max_depth=max_depth,
                       max_checkpoint_bytes=max_checkpoint_bytes)
    app.add_middleware(RequestShapeMiddleware)
    app.add_middleware(RequestContextMiddleware, metrics=metrics)
