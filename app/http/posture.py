"""What `agentstate serve` adds around the application to be safe by default.

- DNS rebinding: a server that may run open (no keys required) answers only loopback `Host`
  names, so a web page whose domain is made to resolve to 127.0.0.1 cannot read it through
  the visitor's browser. Starlette's TrustedHostMiddleware does the matching (a refusal is
  answered 400 `host_not_allowed` as problem+json, like every error);
  AGENTSTATE_ALLOWED_HOSTS adds names (and then applies with keys too; `*` allows any).
- Header fields larger than AGENTSTATE_MAX_HEADER_BYTES in all are answered 431. With
  `serve --http h11` a larger head that arrives in pieces is refused by the parser first.
- At most AGENTSTATE_MAX_REQUESTS_IN_FLIGHT requests are in the application at once (per
  worker); one more is answered 503 `overloaded` with `Retry-After`. uvicorn's own
  `limit_concurrency` answered plain text, and counted idle keep-alive connections too.
  `/healthz` is never refused: a process that is busy is still alive.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.settings import Settings
from app.http.middleware import request_id_of

LOOPBACK_HOSTS = ["localhost", "127.0.0.1", "[::1]"]
log = logging.getLogger("agentstate.serve")


def install_posture(app: Any, settings: Settings) -> None:
    if settings.allowed_hosts:
        app.add_middleware(TrustedHosts, allowed_hosts=[*LOOPBACK_HOSTS, *settings.allowed_hosts])
    elif not settings.require_api_keys:
        app.add_middleware(TrustedHosts, allowed_hosts=LOOPBACK_HOSTS)
    app.add_middleware(HeaderLimit, max_bytes=settings.max_header_bytes)
    # Added last, so outermost: a request over the limit costs no further work.
    app.add_middleware(InFlightLimit, limit=settings.max_requests_in_flight,
                       retry_after=settings.retry_after_seconds)


async def _refuse(scope: Scope, send: Send, status: int, code: str, title: str,
                  detail: str, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    """A problem+json answer from in front of the application (with `X-Request-ID`, as
    every answer), closing the connection."""
    body = json.dumps({"type": f"urn:agentstate:problem:{code}", "title": title,
                       "status": status, "detail": detail, "instance": scope["path"],
                       "code": code}, separators=(",", ":")).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/problem+json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"), (b"x-request-id", request_id_of(scope).encode()),
        *headers]})
    await send({"type": "http.response.body", "body": body})


class TrustedHosts:
    """Starlette's TrustedHostMiddleware decides which `Host` names pass; its refusal (plain
    text) is replaced by a problem."""

    def __init__(self, app: ASGIApp, allowed_hosts: list[str]) -> None:
        self.app = app
        self.matcher = TrustedHostMiddleware(self._passed, allowed_hosts=allowed_hosts,
                                             www_redirect=False)

    @staticmethod
    async def _passed(scope: Scope, receive: Receive, send: Send) -> None:
        scope["agentstate.host_passed"] = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        probe = dict(scope)

        async def discard(message: Message) -> None:
            pass

        await self.matcher(probe, receive, discard)
        if probe.get("agentstate.host_passed"):
            await self.app(scope, receive, send)
        else:
            await _refuse(scope, send, 400, "host_not_allowed", "Bad Request",
                          "The Host header names no host this server answers for; an "
                          "operator can add it to AGENTSTATE_ALLOWED_HOSTS.")


class HeaderLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            # Header fields only: a long request target is the application's 414.
            size = sum(len(name) + len(value) + 4 for name, value in scope["headers"])
            if size > self.max_bytes:
                await _refuse(scope, send, 431, "headers_too_large",
                              "Request Header Fields Too Large",
                              "The request head is larger than this server accepts.")
                return
        await self.app(scope, receive, send)


class InFlightLimit:
    """At most `limit` requests of this worker in the application at once; the next one is
    refused (module docstring) until one of them ends."""

    def __init__(self, app: ASGIApp, limit: int, retry_after: int) -> None:
        self.app = app
        self.limit = limit
        self.retry_after = str(retry_after).encode()
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == "/healthz":
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            log.warning("refused a request: %d in flight", self.in_flight)
            await _refuse(scope, send, 503, "overloaded", "Service Unavailable",
                          "This server is serving as many requests as it is configured to "
                          "(AGENTSTATE_MAX_REQUESTS_IN_FLIGHT); retry after the interval "
                          "in Retry-After.", ((b"retry-after", self.retry_after),))
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
