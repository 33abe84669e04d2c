"""OpenTelemetry in the client, when the application uses it.

When the process has imported OpenTelemetry's API (`opentelemetry.trace`: an application
that traces does so before it makes its first call), every request the client sends is a
CLIENT span of the operation that sent it (`GET get_thread`), and carries that span's W3C
`traceparent` (and `tracestate`, baggage: whatever the propagators configured by
`OTEL_PROPAGATORS` inject), so the server's span of the request, and its statements' spans,
are its children: one trace. Spans go to the tracer provider the application set
(`trace.set_tracer_provider`); with none set they are not recorded, but a context the
application carries is still passed on. A change-feed watch passes the context on without
a span of its own (it lasts as long as the application watches).

Otherwise nothing here imports OpenTelemetry: the client needs only httpx (the `otel` extra
of `agentstate-client` installs the API). No value, key or query string goes into a span:
its attributes are the method, the URL without its query, the server's address and the
status.
"""

from __future__ import annotations

import sys
from typing import Any
from urllib.parse import urlsplit

_API = "opentelemetry.trace"


def _loaded() -> bool:
    return _API in sys.modules


def inject(headers: dict[str, str]) -> None:
    """Put the current trace context into `headers`, when OpenTelemetry is in use."""
    if _loaded():
        from opentelemetry import propagate

        propagate.inject(headers)


class _Off:
    """What `attempt` gives when OpenTelemetry is not in use: nothing happens."""

    def __enter__(self) -> _Off:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        return None

    def record(self, response: Any, error: BaseException | None) -> None:
        return None


_OFF = _Off()


class _Span(_Off):
    """One attempt of a request as a CLIENT span, current while it is sent; its context in
    the request's headers."""

    def __init__(self, operation: str, kwargs: dict[str, Any]) -> None:
        from opentelemetry import context, propagate, trace

        from agentstate_client._core import __version__

        method = kwargs["method"]
        url = urlsplit(kwargs["url"])
        tracer = trace.get_tracer("agentstate_client", __version__)
        self.span = tracer.start_span(f"{method} {operation}", kind=trace.SpanKind.CLIENT,
                                      attributes={
            "http.request.method": method,
            "url.full": f"{url.scheme}://{url.netloc.rpartition('@')[2]}{url.path}",
            "server.address": url.hostname or "",
            "server.port": url.port or (443 if url.scheme == "https" else 80),
        })
        self._context = context
        self._token = context.attach(trace.set_span_in_context(self.span))
        propagate.inject(kwargs["headers"])

    def record(self, response: Any, error: BaseException | None) -> None:
        from opentelemetry.trace import StatusCode

        if error is not None:
            self.span.set_attribute("error.type", type(error).__qualname__)
            self.span.set_status(StatusCode.ERROR)
            return
        status = response.status_code
        self.span.set_attribute("http.response.status_code", status)
        if status >= 400:
            self.span.set_attribute("error.type", str(status))
            self.span.set_status(StatusCode.ERROR)

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None:  # cancelled, interrupted
            self.span.set_attribute("error.type", exc_type.__qualname__)
        self._context.detach(self._token)
        self.span.end()


def attempt(steps: Any, kwargs: dict[str, Any]) -> _Off:
    """A context for sending one attempt of the operation `steps` (its generator), whose
    `record(response, error)` notes the outcome: a span when OpenTelemetry is in use."""
    if not _loaded():
        return _OFF
    from opentelemetry import trace

    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        # No provider set (LangGraph and the Agents SDK import the API whether or not the
        # application traces): a span would not be recorded, only the context passed on.
        inject(kwargs["headers"])
        return _OFF
    return _Span(getattr(steps, "__name__", "request"), kwargs)
