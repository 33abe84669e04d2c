"""Pure ASGI middleware: request id, access log and metrics; body limits before any handler."""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.errors import (
    AppError,
    InvalidJson,
    PayloadTooLarge,
    Unprocessable,
    UnsupportedMediaType,
)
from app.core.jsonutil import exceeds_depth, has_unstorable_escape, loads_strict
from app.core.logging import request_id_var
from app.core.metrics import Metrics
from app.http.problems import problem_response

access_log = logging.getLogger("agentstate.access")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:@-]{1,128}$")
_BODY_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


class RequestContextMiddleware:
    """X-Request-ID on every response (echoed if valid), one access-log line, metrics."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = _header(scope, b"x-request-id")
        request_id = incoming if incoming and _REQUEST_ID.match(incoming) else uuid.uuid4().hex
        token = request_id_var.set(request_id)
        status = 500
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            elapsed = time.perf_counter() - started
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = scope["method"]
            self.metrics.requests.labels(method, template, str(status)).inc()
            self.metrics.latency.labels(method, template).observe(elapsed)
            if status == 412:
                self.metrics.conflicts.labels(template).inc()
            access_log.info(
                "%s %s %s", method, template, status,
                extra={"method": method, "route": template, "status": status,
                       "duration_ms": round(elapsed * 1000, 3)},
            )
            request_id_var.reset(token)


class BodyLimitMiddleware:
    """Enforce the body limits before any handler or database work (API.md section 1).

    Size is counted on the bytes received, chunked or not (413). A JSON body is then checked
    for depth (422), for being JSON at all (400) and for strings Postgres cannot store (422),
    and handed on unchanged.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, max_depth: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_depth = max_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        try:
            body = await self._read(scope, receive)
            self._check(scope, body)
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
        declared = _header(scope, b"content-length")
        if declared and declared.isdigit() and int(declared) > self.max_bytes:
            raise PayloadTooLarge(f"The body exceeds {self.max_bytes} bytes.")
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise PayloadTooLarge(f"The body exceeds {self.max_bytes} bytes.")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    def _check(self, scope: Scope, body: bytes) -> None:
        if not body.strip():
            return
        content_type = (_header(scope, b"content-type") or "application/json").lower()
        media = content_type.split(";")[0].strip()
        if not (media == "application/json" or media.endswith("+json")):
            raise UnsupportedMediaType(
                f"Content-Type {media!r} is not JSON; send Content-Type: application/json."
            )
        if exceeds_depth(body, self.max_depth):
            raise Unprocessable(
                f"JSON nests deeper than {self.max_depth} levels.", errors=[
                    {"pointer": "", "code": "json_too_deep",
                     "message": f"maximum depth is {self.max_depth}"}],
            )
        try:
            loads_strict(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidJson(f"The request body is not valid JSON: {_short(exc)}") from None
        if has_unstorable_escape(body):
            raise Unprocessable(
                "Strings may not contain U+0000 or unpaired UTF-16 surrogates.", errors=[
                    {"pointer": "", "code": "invalid_string",
                     "message": "U+0000 or an unpaired surrogate escape"}],
            )


def _short(exc: Exception) -> str:
    return str(exc).split(":")[0][:120]


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def install_middleware(app: Any, metrics: Metrics, max_bytes: int, max_depth: int) -> None:
    # Starlette wraps in reverse order: the last added is outermost.
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_bytes, max_depth=max_depth)
    app.add_middleware(RequestContextMiddleware, metrics=metrics)
