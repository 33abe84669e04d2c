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
    hosts = ([*LOOPBACK_HOSTS, *settings.allowed_hosts] if settings.allowed_hosts
             else None if settings.require_api_keys else LOOPBACK_HOSTS)
    # Outermost of the application's own layers: a request over a limit costs no more work.
    app.add_middleware(Posture, allowed_hosts=hosts, max_header_bytes=settings.max_header_bytes,
                       limit=settings.max_requests_in_flight,
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


class Posture:
    """The module's three checks, in this order, as one layer (a layer is a frame every
    request enters, and enters again each time it waits): the requests in flight (not
    /healthz), the size of the header fields, then, when `allowed_hosts` is given, the
    `Host` name (Starlette's TrustedHostMiddleware decides; its refusal, plain text, is
    replaced by a problem)."""

    KNOWN_HOSTS = 256  # Host values whose verdict is remembered

    def __init__(self, app: ASGIApp, allowed_hosts: list[str] | None, max_header_bytes: int,
                 limit: int, retry_after: int) -> None:
        self.app = app
        self.max_header_bytes = max_header_bytes
        self.limit = limit
        self.retry_after = str(retry_after).encode()
        self.in_flight = 0
        self.matcher = (None if allowed_hosts is None else TrustedHostMiddleware(
            self._passed, allowed_hosts=allowed_hosts, www_redirect=False))
        self._verdicts: dict[bytes | None, bool] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and not await self._host_allowed(scope, receive):
            await self._refuse_host(scope, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        counted = scope["path"] != "/healthz"
        if counted and self.in_flight >= self.limit:
            log.warning("refused a request: %d in flight", self.in_flight)
            await _refuse(scope, send, 503, "overloaded", "Service Unavailable",
                          "This server is serving as many requests as it is configured to "
                          "(AGENTSTATE_MAX_REQUESTS_IN_FLIGHT); retry after the interval "
                          "in Retry-After.", ((b"retry-after", self.retry_after),))
            return
        self.in_flight += counted
        try:
            # Header fields only: a long request target is the application's 414.
            if sum(len(name) + len(value) + 4
                   for name, value in scope["headers"]) > self.max_header_bytes:
                await _refuse(scope, send, 431, "headers_too_large",
                              "Request Header Fields Too Large",
                              "The request head is larger than this server accepts.")
            elif not await self._host_allowed(scope, receive):
                await self._refuse_host(scope, send)
            else:
                await self.app(scope, receive, send)
        finally:
            self.in_flight -= counted

    async def _host_allowed(self, scope: Scope, receive: Receive) -> bool:
        """The matcher's verdict on the request's (first) `Host` value, asked once per
        value."""
        if self.matcher is None:
            return True
        host = None
        for name, value in scope["headers"]:
            if name == b"host":
                host = value
                break
        verdict = self._verdicts.get(host)
        if verdict is None:
            probe = dict(scope)

            async def discard(message: Message) -> None:
                pass

            await self.matcher(probe, receive, discard)
            verdict = bool(probe.get("agentstate.host_passed"))
            if len(self._verdicts) >= self.KNOWN_HOSTS:
                self._verdicts.clear()
            self._verdicts[host] = verdict
        return verdict

    @staticmethod
    async def _passed(scope: Scope, receive: Receive, send: Send) -> None:
        scope["agentstate.host_passed"] = True

    @staticmethod
    async def _refuse_host(scope: Scope, send: Send) -> None:
        await _refuse(scope, send, 400, "host_not_allowed", "Bad Request",
                      "The Host header names no host this server answers for; an "
                      "operator can add it to AGENTSTATE_ALLOWED_HOSTS.")
