"""What `agentstate serve` adds around the application to be safe by default (issue 13).

- DNS rebinding: a server that may run open (no keys required) answers only loopback `Host`
  names, so a web page whose domain is made to resolve to 127.0.0.1 cannot read it through
  the visitor's browser. Starlette's TrustedHostMiddleware does the matching;
  AGENTSTATE_ALLOWED_HOSTS adds names (and then applies with keys too; `*` allows any).
- Header fields larger than AGENTSTATE_MAX_HEADER_BYTES in all are answered 431. With
  `serve --http h11` a larger head that arrives in pieces is refused by the parser first.
"""

from __future__ import annotations

from typing import Any

from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from app.core.settings import Settings

LOOPBACK_HOSTS = ["localhost", "127.0.0.1", "[::1]"]


def install_posture(app: Any, settings: Settings) -> None:
    if settings.allowed_hosts:
        app.add_middleware(TrustedHostMiddleware,
                           allowed_hosts=[*LOOPBACK_HOSTS, *settings.allowed_hosts])
    elif not settings.require_api_keys:
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=LOOPBACK_HOSTS)
    app.add_middleware(HeaderLimit, max_bytes=settings.max_header_bytes)


class HeaderLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            # Header fields only: a long request target is the application's 414.
            size = sum(len(name) + len(value) + 4 for name, value in scope["headers"])
            if size > self.max_bytes:
                body = (b'{"type":"urn:agentstate:problem:headers_too_large","title":"Request '
                        b'Header Fields Too Large","status":431,"code":"headers_too_large",'
                        b'"detail":"The request head is larger than this server accepts."}')
                await send({"type": "http.response.start", "status": 431, "headers": [
                    (b"content-type", b"application/problem+json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close")]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
