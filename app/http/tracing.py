"""Traces (docs/operations.md): a server span per request, a child span per database statement.

Installed only when tracing is on (`Settings.tracing`, or a tracer provider handed to
`create_app`); otherwise `install_tracing` returns a `Tracing` that does nothing, and nothing
of the otel extra (SDK, exporters, instrumentation) is imported.

- The server span is OpenTelemetry's ASGI middleware, outside all of ours: it continues the
  caller's W3C `traceparent` (the propagators `OTEL_PROPAGATORS` names, `tracecontext` and
  `baggage` by default) and skips the paths `OTEL_PYTHON_ASGI_EXCLUDED_URLS` (or
  `OTEL_PYTHON_EXCLUDED_URLS`) match. When the response starts it is named
  `{method} {route template}` and given `http.route`, the status, `agentstate.tenant_id` and
  `agentstate.request_id` (`_Describe`). The query string is left out of its attributes: it
  carries state values (`?state_contains=`, `?metadata=`); and the request headers an operator
  asks to capture (`OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST`) never show
  `Authorization` or cookies.
- A statement's span is OpenTelemetry's SQLAlchemy instrumentation on the request engine
  (`Tracing.watch`): its `before_cursor_execute`/`after_cursor_execute`/`handle_error`
  listeners, which the direct path (app/db/direct.py) calls too, so every statement is one
  span, with its text (bind placeholders, never the parameters) and no `connect` spans.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import __version__ as agentstate_version
from app.core.settings import Settings
from app.core.tracing import exporter_names, tracer_provider
from app.db.tenancy import request_tenant
from app.http.dependencies import PRINCIPAL

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from sqlalchemy.ext.asyncio import AsyncEngine

# Never captured, whatever OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_* ask for.
_SECRET_HEADERS = ["authorization", "proxy-authorization", "cookie", "set-cookie"]
# Request attributes that carry the query string, as the semantic conventions name them.
_URL_ATTRIBUTES = ("http.target", "http.url", "url.full")


class Tracing:
    """What the lifespan does for tracing: nothing, when it is off."""

    def watch(self, engine: AsyncEngine) -> None:
        """Trace the statements `engine` runs."""

    def close(self) -> None:
        """Export what is left (the spans still queued) and stop."""


class _On(Tracing):
    def __init__(self, provider: TracerProvider, owned: bool) -> None:
        self.provider = provider
        self.owned = owned

    def watch(self, engine: AsyncEngine) -> None:
        # The instrumentor's `instrument()` patches SQLAlchemy's engine constructors for the
        # whole process (and traces every `connect`); its EngineTracer is the part that
        # listens to one engine's statements, which is all a server built here needs.
        from opentelemetry.instrumentation.sqlalchemy.engine import EngineTracer
        from opentelemetry.metrics import NoOpMeter

        tracer = self.provider.get_tracer("opentelemetry.instrumentation.sqlalchemy",
                                          agentstate_version)
        usage = NoOpMeter("agentstate").create_up_down_counter("db.client.connections.usage")
        EngineTracer(tracer, engine.sync_engine, usage)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        if self.owned:
            self.provider.shutdown()


def install_tracing(app: FastAPI, settings: Settings,
                    provider: TracerProvider | None = None) -> Tracing:
    """Trace `app`'s requests when tracing is on: into `provider` when given (tests,
    embedding), else into one built from the `OTEL_*` variables. Call it after the other
    middleware is installed, so the server span is outermost."""
    if provider is None and not settings.tracing:
        return Tracing()
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
    from opentelemetry.metrics import NoOpMeterProvider
    from opentelemetry.util.http import get_custom_headers, get_excluded_urls

    owned = provider is None
    if provider is None:
        provider = tracer_provider(exporter_names(settings.otel_traces_exporter or ""),
                                   agentstate_version)
    sanitize = get_custom_headers("OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SANITIZE_FIELDS")
    app.add_middleware(_Describe)  # inside the server span, outside the request id
    app.add_middleware(
        OpenTelemetryMiddleware, tracer_provider=provider, meter_provider=NoOpMeterProvider(),
        excluded_urls=get_excluded_urls("ASGI"),
        default_span_details=_method_only, server_request_hook=_without_query,
        exclude_spans=["receive", "send"],
        http_capture_headers_sanitize_fields=[*sanitize, *_SECRET_HEADERS])
    return _On(provider, owned)


def _method_only(scope: Scope) -> tuple[str, dict[str, Any]]:
    """The span's name until the route is known (`_Describe`): matching the request against
    every route up front, as FastAPI's instrumentation does, would cost a pass per request."""
    return scope.get("method", "HTTP"), {}


def _without_query(span: Any, scope: Scope) -> None:
    """The server span's attributes without the query string's values."""
    if not scope.get("query_string"):
        return
    attributes = getattr(span, "attributes", None) or {}
    for key in _URL_ATTRIBUTES:
        value = attributes.get(key)
        if isinstance(value, str):
            span.set_attribute(key, value.split("?", 1)[0])
    if "url.query" in attributes:
        span.set_attribute("url.query", "REDACTED")


class _Describe:
    """Names the server span after its route template and gives it the tenant and request
    id, when the response starts (the route, the caller and the X-Request-ID header are
    known by then)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        from opentelemetry.trace import get_current_span

        span = get_current_span()
        if scope["type"] != "http" or not span.is_recording():
            await self.app(scope, receive, send)
            return

        async def described(message: Message) -> None:
            if message["type"] == "http.response.start":
                route = getattr(scope.get("route"), "path", None)
                if route:
                    span.update_name(f"{scope['method']} {route}")
                    span.set_attribute("http.route", route)
                principal = scope.get(PRINCIPAL)
                tenant = principal.tenant_id if principal is not None else request_tenant.get()
                if tenant is not None:
                    span.set_attribute("agentstate.tenant_id", tenant)
                for name, value in message.get("headers", ()):
                    if name == b"x-request-id":
                        span.set_attribute("agentstate.request_id", value.decode("latin-1"))
            await send(message)

        await self.app(scope, receive, described)
