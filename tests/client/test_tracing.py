"""The client under OpenTelemetry (agentstate_client/_tracing.py): each attempt of a request is
a CLIENT span of its operation and sends that span's `traceparent`, through httpx's transports
and the lean HTTP/1.1 one alike; a watch sends the caller's. The server's side is
tests/test_tracing.py."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from agentstate_client import AgentStateClient, AsyncAgentStateClient, NotFound
from opentelemetry import trace

from tests.client.test_http1 import THREAD, fixed, raw_server
from tests.support import recorded_spans

pytestmark = pytest.mark.anyio


@pytest.fixture
def spans() -> Iterator[Any]:
    with recorded_spans() as (_provider, exporter):
        yield exporter


def traceparent(span: Any) -> str:
    context = span.context
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def test_each_attempt_is_a_span_that_sends_its_traceparent(spans: Any) -> None:
    sent: list[httpx.Request] = []
    answers = iter([httpx.Response(503, json={"code": "unavailable"}),
                    httpx.Response(200, json={"data": [THREAD], "has_more": False}),
                    httpx.Response(404, json={"code": "not_found", "detail": "gone"})])

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return next(answers)

    with AgentStateClient("http://state.test:8080", api_key="agst_secret", backoff=0.001,
                          transport=httpx.MockTransport(answer)) as client, \
            trace.get_tracer("test").start_as_current_span("agent turn"):
        client.list_threads(metadata={"user": "alice"})  # retried once, after the 503
        with pytest.raises(NotFound):
            client.get_thread("t1")
    turn, *attempts = sorted(spans.get_finished_spans(), key=lambda s: s.start_time)
    assert turn.name == "agent turn"
    assert [(s.name, s.kind.name, s.status.status_code.name) for s in attempts] == [
        ("GET list_threads", "CLIENT", "ERROR"), ("GET list_threads", "CLIENT", "UNSET"),
        ("GET get_thread", "CLIENT", "ERROR")]
    assert all(s.parent.span_id == turn.context.span_id for s in attempts)
    assert [r.headers["traceparent"] for r in sent] == [traceparent(s) for s in attempts]
    first = dict(attempts[0].attributes)
    assert first == {"http.request.method": "GET", "url.full": "http://state.test:8080/v1/threads",
                     "server.address": "state.test", "server.port": 8080,
                     "http.response.status_code": 503, "error.type": "503"}
    assert "alice" not in json.dumps([dict(s.attributes) for s in attempts])
    assert "agst_secret" not in json.dumps([dict(s.attributes) for s in attempts])


def test_a_transport_failure_is_an_error_span(spans: Any) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with AgentStateClient("http://state.test", max_retries=0,
                          transport=httpx.MockTransport(refuse)) as client:
        with pytest.raises(Exception, match="refused"):
            client.get_thread("t1")
    (attempt,) = spans.get_finished_spans()
    assert attempt.status.status_code.name == "ERROR"
    assert attempt.attributes["error.type"] == "ConnectError"


async def test_the_lean_transport_sends_traceparent_on_the_wire(spans: Any) -> None:
    async def answer(_head: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(fixed())
        return True

    async with raw_server(answer) as (server, url), AsyncAgentStateClient(url) as client:
        assert client._direct is not None  # the lean transport, not httpx's
        await client.get_thread("t1")
    (attempt,) = spans.get_finished_spans()
    assert f"traceparent: {traceparent(attempt)}\r\n".encode() in server.requests[0]
    assert attempt.parent is None and attempt.attributes["http.response.status_code"] == 200


def test_a_watch_sends_the_callers_traceparent(spans: Any) -> None:
    sent: list[httpx.Request] = []
    event = {"cursor": "c1", "seq": 1, "type": "thread.created", "thread_id": "t1",
             "resource": "/v1/threads/t1", "revision": 1, "at": "2026-12-01T00:00:00Z",
             "actor": "anonymous"}

    def stream(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              content=f"id: c1\ndata: {json.dumps(event)}\n\n".encode())

    with AgentStateClient("http://state.test", transport=httpx.MockTransport(stream)) as client, \
            trace.get_tracer("test").start_as_current_span("watching") as watching:
        with client.watch() as watch:
            assert next(iter(watch)).seq == 1
    assert sent[0].headers["traceparent"] == traceparent(watching)


@pytest.mark.slow  # a Python process of its own, whose imports are its own
def test_without_opentelemetry_imported_the_client_imports_none_of_it() -> None:
    probe = ("import json, sys, httpx, agentstate_client\n"
             "answer = lambda request: httpx.Response(200, json={'data': [], 'has_more': False})\n"
             "with agentstate_client.AgentStateClient(\n"
             "        'http://t', transport=httpx.MockTransport(answer)) as client:\n"
             "    client.list_threads()\n"
             "print(json.dumps(sorted(m for m in sys.modules if m.startswith('opentelemetry'))))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, cwd="/")
    assert json.loads(done.stdout) == []


async def test_with_no_tracer_provider_set_the_callers_context_is_still_sent() -> None:
    """LangGraph and the Agents SDK import OpenTelemetry's API whether or not anything is
    traced; with no tracer provider set the client makes no span, but a context the
    application carries (here one taken from an incoming request) is passed on."""
    from opentelemetry import context, propagate
    from opentelemetry.test.globals_test import reset_trace_globals

    async def answer(_head: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(fixed())
        return True

    reset_trace_globals()
    incoming = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    token = context.attach(propagate.extract({"traceparent": incoming}))
    try:
        async with raw_server(answer) as (server, url), AsyncAgentStateClient(url) as client:
            await client.get_thread("t1")
    finally:
        context.detach(token)
    assert f"traceparent: {incoming}\r\n".encode() in server.requests[0]
