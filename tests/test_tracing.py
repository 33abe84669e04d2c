"""Traces (docs/operations.md, "Traces"): a traced client call is one trace across the client,
the server and its statements, the direct path's included; nothing secret or stored in them;
off, nothing of OpenTelemetry is imported.

The server runs in-process in a context of its own (`isolated`), as it would in its own
process: only the `traceparent` header can join its spans to the client's. One slow test runs
a real `agentstate serve` with `OTEL_TRACES_EXPORTER=console`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from agentstate_client import AgentStateClient, AsyncAgentStateClient
from fastapi import FastAPI
from pydantic import SecretStr, ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from app.core.settings import Settings, describe_settings_error
from app.main import create_app
from tests.support import (
    ROOT,
    ServerProcess,
    create_key,
    eventually,
    recorded_spans,
    span_tree,
    statements,
    wait_until_blocked,
    write_lock,
)

pytestmark = pytest.mark.anyio


def isolated(app: ASGIApp) -> ASGIApp:
    """`app` served as a server process serves it: each request in a context of its own."""
    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        await asyncio.get_running_loop().create_task(app(scope, receive, send),
                                                     context=contextvars.Context())
    return serve


@pytest.fixture
def spans() -> Iterator[tuple[Any, Any]]:
    with recorded_spans() as recorded:
        yield recorded


@contextlib.asynccontextmanager
async def traced(settings: Settings, provider: Any,
                 **client_options: Any) -> AsyncIterator[tuple[FastAPI, AsyncAgentStateClient]]:
    app = create_app(settings, tracer_provider=provider)
    async with app.router.lifespan_context(app), AsyncAgentStateClient(
            "http://agentstate.test", transport=httpx.ASGITransport(app=isolated(app)),
            **client_options) as client:
        yield app, client


def db_spans(exporter: Any) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if "db.statement" in (s.attributes or {})]


async def test_off_a_global_tracer_provider_gets_no_spans_from_the_server(
        app: FastAPI, client: httpx.AsyncClient, spans: tuple[Any, Any], uid: str) -> None:
    """An agent's process may set a global tracer provider (the client's spans use it) and
    serve agentstate in the same process: with tracing off, FastAPI's own telemetry must
    not start by itself and record the server's requests (with their query strings)."""
    _provider, exporter = spans
    created = await client.post("/v1/threads", json={"thread_id": uid})
    assert created.status_code == 201, created.text
    listed = await client.get(f"/v1/threads?metadata=%7B%22secret%22%3A%20%22{uid}%22%7D")
    assert listed.status_code == 200, listed.text
    assert exporter.get_finished_spans() == (), span_tree(exporter.get_finished_spans())


async def test_a_traced_client_call_is_one_trace_of_client_server_and_statements(
        settings: Settings, spans: tuple[Any, Any], backend: str, uid: str) -> None:
    provider, exporter = spans
    async with traced(settings, provider, headers={"X-Request-ID": f"req-{uid}"}) as (
            app, client):
        with statements(app) as heard:
            # The feed numbers events after the commit (Postgres), in a pass that starts a
            # moment after the response: each call waits until that pass is over and every
            # statement's span has ended (or the create's pass lands in the append's spans).
            def ended() -> bool:
                return not app.state.feed.sequencing and len(db_spans(exporter)) == len(heard)

            exporter.clear()  # the start-up checks' statements
            await client.create_thread(uid)
            await eventually(ended, "every statement's span has ended", timeout=10)
            exporter.clear()
            heard.clear()
            await client.append_messages(uid, [{"role": "user", "content": "hello"}])
            await eventually(ended, "every statement's span has ended", timeout=10)
    finished = exporter.get_finished_spans()
    print("\n".join(span_tree(finished)))
    assert len({s.context.trace_id for s in finished}) == 1, span_tree(finished)

    (call,) = [s for s in finished if s.parent is None]
    assert call.name == "POST append_messages" and call.kind.name == "CLIENT"
    assert call.attributes["http.request.method"] == "POST"
    assert call.attributes["http.response.status_code"] == 201
    assert call.attributes["url.full"] == f"http://agentstate.test/v1/threads/{uid}/messages"

    (server,) = [s for s in finished if s.kind.name == "SERVER"]
    assert server.parent.span_id == call.context.span_id  # joined by traceparent only
    assert server.name == "POST /v1/threads/{thread_id}/messages"
    assert server.attributes["http.route"] == "/v1/threads/{thread_id}/messages"
    assert server.attributes["http.status_code"] == 201
    assert server.attributes["agentstate.tenant_id"] == "default"
    assert server.attributes["agentstate.request_id"] == f"req-{uid}"

    # Each statement is one span, a child of the server's, the direct path's too.
    children = sorted(db_spans(exporter), key=lambda s: s.start_time)
    assert {s.parent.span_id for s in children} == {server.context.span_id}
    assert all(s.kind.name == "CLIENT" for s in children)
    assert [s.attributes["db.statement"] for s in children] == [s.sql for s in heard]
    assert set(finished) == {call, server, *children}
    came_direct = [s.sql.split()[:3] for s in heard if s.direct]
    if backend == "postgres":
        assert ["UPDATE", "threads", "SET"] in came_direct, heard
        assert ["INSERT", "INTO", "messages"] in came_direct, heard
    else:
        assert came_direct == []


async def test_a_framework_adapter_call_is_traced_through_the_client(
        settings: Settings, spans: tuple[Any, Any], uid: str) -> None:
    """The adapters call the client, so their requests are the client's spans: an OpenAI
    Agents session turn inside the application's span, each request joined to the server."""
    from agentstate_client.openai_agents import AgentStateSession
    from opentelemetry import trace

    provider, exporter = spans
    async with traced(settings, provider) as (_app, client):
        session = AgentStateSession(f"session-{uid}", client=client)
        exporter.clear()
        with trace.get_tracer("test").start_as_current_span("agent turn") as turn:
            await session.add_items([{"role": "user", "content": "hello"}])
            assert [item["content"] for item in await session.get_items()] == ["hello"]
    finished = exporter.get_finished_spans()
    calls = [s for s in finished if s.parent is not None
             and s.parent.span_id == turn.get_span_context().span_id]
    assert [s.name for s in calls] == ["POST batch", "GET list_messages_json"], span_tree(finished)
    for call in calls:
        (server,) = [s for s in finished if s.kind.name == "SERVER"
                     and s.parent.span_id == call.context.span_id]
        assert server.attributes["http.status_code"] == 200
    assert len({s.context.trace_id for s in finished}) == 1


async def test_an_adk_session_read_is_named_for_what_it_reads(
        settings: Settings, spans: tuple[Any, Any], uid: str) -> None:
    """ADK's `get_session` reads the session and its app's and user's state in one request
    through the client's public `list_threads_json`, and its span says so."""
    from agentstate_client.adk import AgentStateSessionService
    from opentelemetry import trace

    provider, exporter = spans
    async with traced(settings, provider) as (_app, client):
        service = AgentStateSessionService(client=client)
        await service.create_session(app_name=f"app-{uid}", user_id="u", session_id="s",
                                     state={"app:tier": "gold"})
        exporter.clear()
        with trace.get_tracer("test").start_as_current_span("read") as read:
            session = await service.get_session(app_name=f"app-{uid}", user_id="u",
                                                session_id="s")
    assert session is not None and session.state == {"app:tier": "gold"}
    finished = exporter.get_finished_spans()
    calls = [s for s in finished if s.parent is not None
             and s.parent.span_id == read.get_span_context().span_id]
    assert [s.name for s in calls] == ["GET list_threads_json"], span_tree(finished)


@pytest.mark.postgres_only(reason="the direct path is asyncpg's, and the statement timeout "
                                  "Postgres's")
async def test_a_failed_direct_statement_is_an_error_span(
        database_url: str, spans: tuple[Any, Any], uid: str) -> None:
    provider, exporter = spans
    settings = Settings(database_url=database_url, auto_migrate=False,  # type: ignore[call-arg]
                        statement_timeout_ms=300, _env_file=None)
    async with traced(settings, provider, max_retries=0) as (_app, client):
        await client.create_thread(uid)
        exporter.clear()
        async with write_lock(database_url) as holder:
            assert holder is not None
            append = asyncio.ensure_future(
                client.append_messages(uid, [{"role": "user", "content": "blocked"}]))
            await wait_until_blocked(database_url, holder)
            with pytest.raises(Exception) as refused:
                await append
    assert getattr(refused.value, "status_code", None) == 503, refused.value
    finished = exporter.get_finished_spans()
    (failed,) = [s for s in db_spans(exporter) if s.status.status_code.name == "ERROR"]
    assert failed.attributes["db.statement"].startswith("UPDATE threads"), span_tree(finished)
    assert "statement timeout" in (failed.status.description or "")
    (server,) = [s for s in finished if s.kind.name == "SERVER"]
    assert server.attributes["http.status_code"] == 503
    assert server.status.status_code.name == "ERROR"


@pytest.mark.slow  # an API key is made by `agentstate keys create`
async def test_no_value_secret_key_or_parameter_in_any_span(
        secured_database_url: str, spans: tuple[Any, Any], uid: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every header captured (as an operator may ask), a state value, a value in the query, an
    MCP secret and the API key sent: none of them in any span."""
    from app.core.secretbox import new_key

    provider, exporter = spans
    tenant = f"t-{uid}"
    token = create_key(secured_database_url, tenant)
    state_value, query_value, secret = f"state-{uid}", f"query-{uid}", f"secret-{uid}"
    monkeypatch.setenv("OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST", ".*")
    settings = Settings(database_url=secured_database_url, auto_migrate=False,  # type: ignore[call-arg]
                        secret_keys=[SecretStr(new_key())], _env_file=None)
    async with traced(settings, provider, api_key=token) as (_app, client):
        await client.put_thread(uid, {"note": state_value}, metadata={"tag": query_value})
        assert [t.thread_id for t in (await client.list_threads(
            metadata={"tag": query_value})).data] == [uid]
        await client.query_agent_states(state_contains={"note": state_value})
        await client.put_mcp_server(f"mcp-{uid}", "stdio", secrets={"token": secret})
    finished = exporter.get_finished_spans()
    server_spans = [s for s in finished if s.kind.name == "SERVER"]
    assert len(server_spans) == 4
    captured = [s.attributes.get("http.request.header.authorization") for s in server_spans]
    assert captured == [("[REDACTED]",)] * 4, captured  # asked for, and redacted
    # The token's secret part alone (`agst_<key id>_<secret>`; the secret may hold "_").
    forbidden = [token, token.split("_", 2)[2], state_value, query_value, secret]
    for span in finished:
        texts = [str(value) for value in (span.attributes or {}).values()]
        texts += [str(v) for e in span.events for v in (e.attributes or {}).values()]
        texts.append(span.status.description or "")
        leaked = [f for f in forbidden if any(f in text for text in texts)]
        assert not leaked, (span.name, leaked, dict(span.attributes or {}))
    writes = [s.attributes["db.statement"] for s in db_spans(exporter)
              if s.attributes["db.statement"].startswith(("INSERT", "UPDATE"))]
    assert writes and all("$1" in sql or "?" in sql for sql in writes), writes  # placeholders
    assert any(tenant in str(s.attributes.get("agentstate.tenant_id")) for s in server_spans)


def test_a_mistyped_exporter_is_one_line_naming_the_variable() -> None:
    with pytest.raises(ValidationError) as error:
        Settings(otel_traces_exporter="consle", _env_file=None)  # type: ignore[call-arg]
    assert describe_settings_error(error.value) == (
        "OTEL_TRACES_EXPORTER names 'consle', which no installed package exports traces to; "
        "installed: console, otlp, otlp_proto_grpc, otlp_proto_http (or none)")
    for off in ({}, {"otel_traces_exporter": "none"},
                {"otel_traces_exporter": "console", "otel_sdk_disabled": "TRUE"}):
        assert not Settings(_env_file=None, **off).tracing  # type: ignore[call-arg]
    assert Settings(otel_traces_exporter="console", _env_file=None).tracing  # type: ignore[call-arg]


OFF_PROBE = """
import asyncio, sys, httpx
from agentstate_client import AsyncAgentStateClient
from app.core.settings import Settings
from app.main import create_app

async def main():
    app = create_app(Settings(database_url=sys.argv[1], auto_migrate=False))
    async with app.router.lifespan_context(app), AsyncAgentStateClient(
            "http://t", transport=httpx.ASGITransport(app=app)) as client:
        await client.create_thread()
asyncio.run(main())
print(sorted(m for m in sys.modules if m.startswith(("opentelemetry.sdk",
      "opentelemetry.instrumentation", "opentelemetry.exporter"))))
"""


@pytest.mark.slow  # a Python process of its own, whose imports are its own
@pytest.mark.parametrize("env", [{}, {"OTEL_TRACES_EXPORTER": "none"},
                                 {"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}])
def test_off_nothing_of_the_otel_extra_is_imported(database_url: str,
                                                    env: dict[str, str]) -> None:
    """Neither the SDK, nor an exporter, nor an instrumentation. (OpenTelemetry's API is
    imported all the same: FastAPI imports it for telemetry of its own, which agentstate
    turns off.)"""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", OFF_PROBE, database_url], cwd=ROOT,
                          env={**clean, **env}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout


@pytest.mark.slow
def test_serve_refuses_an_exporter_that_is_not_installed(database_url: str) -> None:
    done = subprocess.run([sys.executable, "-m", "app.cli", "serve", "--port", "0"], cwd=ROOT,
                          env={**os.environ, "AGENTSTATE_DATABASE_URL": database_url,
                               "OTEL_TRACES_EXPORTER": "zipkin"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [(
        "agentstate: OTEL_TRACES_EXPORTER names 'zipkin', which no installed package exports "
        "traces to; installed: console, otlp, otlp_proto_grpc, otlp_proto_http (or none)")]


def console_spans(text: str) -> list[dict[str, Any]]:
    """The spans `ConsoleSpanExporter` printed (JSON objects, between the JSON log lines)."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while (at := text.find("{", at)) != -1:
        try:
            value, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            at += 1
            continue
        if isinstance(value, dict) and "context" in value and "kind" in value:
            found.append(value)
        at = end
    return found


@pytest.mark.slow
async def test_serve_prints_the_spans_of_a_traced_call_with_console(
        database_url: str, spans: tuple[Any, Any], uid: str) -> None:
    """A real server with OTEL_TRACES_EXPORTER=console, called by both clients (the async one
    over its lean HTTP/1.1 transport) inside one span of the caller's."""
    from opentelemetry import trace

    _provider, exporter = spans
    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": f"agentstate-{uid}",
           "AGENTSTATE_LOG_LEVEL": "WARNING"}
    with ServerProcess(database_url, env=env) as server:
        with trace.get_tracer("test").start_as_current_span("agent turn") as turn:
            with AgentStateClient(server.base_url) as blocking:
                blocking.create_thread(uid)
            async with AsyncAgentStateClient(server.base_url) as client:
                await client.append_message(uid, "user", "hello")
    printed = console_spans(server.logs())  # flushed when the server stopped
    trace_id = f"0x{turn.get_span_context().trace_id:032x}"
    ours = [s for s in printed if s["context"]["trace_id"] == trace_id]
    print("\n".join(f"{s['name']} [{s['kind']}] parent={s['parent_id']}" for s in ours))
    mine = {f"0x{s.context.span_id:016x}": s.name for s in exporter.get_finished_spans()}
    servers = [s for s in ours if s["kind"] == "SpanKind.SERVER"]
    assert [(mine.get(s["parent_id"]), s["name"]) for s in servers] == [
        ("POST create_thread", "POST /v1/threads"),
        ("POST append_message", "POST /v1/threads/{thread_id}/messages")]
    assert all(s["resource"]["attributes"]["service.name"] == f"agentstate-{uid}"
               for s in ours)
    server_ids = {s["context"]["span_id"] for s in servers}
    statements = [s for s in ours if s not in servers]
    assert statements and all(s["parent_id"] in server_ids and s["kind"] == "SpanKind.CLIENT"
                              and "db.statement" in s["attributes"] for s in statements)
