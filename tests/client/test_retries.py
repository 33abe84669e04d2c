"""Retries, backoff and the error factory: what is retried, what is not, and that a retried
append is stored once. Faults are injected by transports in front of a real server."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest
from agentstate_client import (
    AgentStateClient,
    APIConnectionError,
    APIError,
    APITimeoutError,
    AsyncAgentStateClient,
)
from agentstate_client import errors as E
from agentstate_client._core import RetryPolicy

from tests.support import ServerProcess

Fault = Callable[[httpx.Request, int], httpx.Response | Exception | None]


class FaultyTransport(httpx.BaseTransport):
    """Forwards to the real server; `fault(request, attempt)` may replace the answer with a
    response, or raise an error *after* the server handled the request (a lost response)."""

    def __init__(self, fault: Fault) -> None:
        self.inner = httpx.HTTPTransport()
        self.fault = fault
        self.seen: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        outcome = self.fault(request, len(self.seen))
        if isinstance(outcome, httpx.Response):
            return outcome
        response = self.inner.handle_request(request)
        response.read()
        if isinstance(outcome, Exception):
            raise outcome
        return response


class AsyncFaultyTransport(httpx.AsyncBaseTransport):
    def __init__(self, fault: Fault) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.fault = fault
        self.seen: list[httpx.Request] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        outcome = self.fault(request, len(self.seen))
        if isinstance(outcome, httpx.Response):
            return outcome
        response = await self.inner.handle_async_request(request)
        await response.aread()
        if isinstance(outcome, Exception):
            raise outcome
        return response


def problem(status: int, code: str, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(status, headers={"content-type": "application/problem+json",
                                           **(headers or {})},
                          json={"type": f"urn:agentstate:problem:{code}", "title": code,
                                "status": status, "detail": code, "instance": "/", "code": code})


def drop_first(request: httpx.Request, attempt: int) -> Exception | None:
    return httpx.ReadError("connection dropped", request=request) if attempt == 1 else None


@pytest.fixture
def sleeps(server: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The waits the client asks for, without waiting (the server is started before)."""
    asked: list[float] = []
    monkeypatch.setattr(time, "sleep", asked.append)
    return asked


@pytest.mark.slow
def test_retried_append_after_dropped_connection_is_stored_once(server: ServerProcess, uid: str,
                                                                 sleeps: list[float]) -> None:
    transport = FaultyTransport(drop_first)
    with AgentStateClient(server.base_url, transport=transport) as client:
        message = client.append_message(f"drop-{uid}", "user", "transfer $100")
    assert len(transport.seen) == 2 and len(sleeps) == 1
    keys = {request.headers["idempotency-key"] for request in transport.seen}
    assert len(keys) == 1, "both attempts carry the same Idempotency-Key"
    with AgentStateClient(server.base_url) as plain:
        stored = list(plain.iter_messages(f"drop-{uid}"))
        assert stored == [message], "the first attempt's message, once"
        assert plain.get_thread(f"drop-{uid}").revision == 2


@pytest.mark.slow
@pytest.mark.anyio
async def test_async_retried_append_is_stored_once(server: ServerProcess, uid: str) -> None:
    transport = AsyncFaultyTransport(drop_first)
    async with AsyncAgentStateClient(server.base_url, transport=transport, backoff=0.01) as client:
        result = await client.append_messages(f"adrop-{uid}", [{"role": "user", "content": "a"},
                                                               {"role": "user", "content": "b"}])
        assert [m.seq for m in result.data] == [1, 2]
        assert len(transport.seen) == 2
        assert (await client.get_thread(f"adrop-{uid}")).message_count == 2


@pytest.mark.slow
def test_in_flight_idempotent_request_is_retried(server: ServerProcess, uid: str,
                                                 sleeps: list[float]) -> None:
    def busy_first(request: httpx.Request, attempt: int) -> httpx.Response | None:
        return problem(409, "idempotency_in_flight", {"Retry-After": "1"}) if attempt == 1 else None

    transport = FaultyTransport(busy_first)
    with AgentStateClient(server.base_url, transport=transport) as client:
        assert client.append_message(f"busy-{uid}", "user", "x").seq == 1
    assert sleeps == [1.0]


@pytest.mark.slow
def test_create_is_not_retried_after_dropped_connection(server: ServerProcess, uid: str,
                                                        sleeps: list[float]) -> None:
    transport = FaultyTransport(drop_first)
    with AgentStateClient(server.base_url, transport=transport) as client:
        with pytest.raises(APIConnectionError) as dropped:
            client.create_thread(f"once-{uid}")
        assert isinstance(dropped.value.__cause__, httpx.ReadError)
        assert len(transport.seen) == 1 and sleeps == []
        assert client.get_thread(f"once-{uid}").revision == 1, "the server did create it"


@pytest.mark.slow
def test_conditional_put_is_not_retried_on_503(server: ServerProcess, uid: str,
                                               sleeps: list[float]) -> None:
    transport = FaultyTransport(lambda request, attempt: problem(503, "database_unavailable"))
    with AgentStateClient(server.base_url, transport=transport) as client:
        with pytest.raises(E.DatabaseUnavailable):
            client.put_thread(f"p-{uid}", {}, if_match="*")
    assert len(transport.seen) == 1 and sleeps == []


@pytest.mark.slow
def test_get_honours_retry_after_then_gives_up(server: ServerProcess, uid: str,
                                               sleeps: list[float]) -> None:
    def unavailable_twice(request: httpx.Request, attempt: int) -> httpx.Response | None:
        return problem(503, "database_unavailable", {"Retry-After": "2"}) if attempt < 3 else None

    with AgentStateClient(server.base_url) as setup:
        setup.create_thread(f"g-{uid}")
    transport = FaultyTransport(unavailable_twice)
    with AgentStateClient(server.base_url, transport=transport) as client:
        assert client.get_thread(f"g-{uid}").revision == 1
    assert sleeps == [2.0, 2.0]

    always = FaultyTransport(lambda request, attempt: problem(503, "database_unavailable"))
    with AgentStateClient(server.base_url, transport=always, max_retries=3) as client:
        with pytest.raises(E.DatabaseUnavailable) as gave_up:
            client.get_thread(f"g-{uid}")
    assert len(always.seen) == 4 and gave_up.value.status_code == 503


@pytest.mark.slow
def test_timeouts_become_api_timeout_errors(server: ServerProcess, sleeps: list[float]) -> None:
    transport = FaultyTransport(
        lambda request, attempt: httpx.ReadTimeout("slow", request=request))
    with AgentStateClient(server.base_url, transport=transport, max_retries=1) as client:
        with pytest.raises(APITimeoutError):
            client.list_threads()
    assert len(transport.seen) == 2 and len(sleeps) == 1


def test_backoff_is_exponential_with_jitter_and_capped() -> None:
    policy = RetryPolicy(initial_delay=0.5, max_delay=4.0)
    for attempt, full in enumerate([0.5, 1.0, 2.0, 4.0, 4.0]):
        delays = {policy.delay(attempt) for _ in range(50)}
        assert all(0.75 * full <= d <= full for d in delays) and len(delays) > 1
    too_long = httpx.Response(503, headers={"Retry-After": "3600"})
    assert policy.delay(0, too_long) <= 0.5, "an absurd Retry-After falls back to backoff"
    dated = httpx.Response(503, headers={"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})
    assert policy.delay(0, dated) == 0.0, "a date in the past means now"


@pytest.mark.parametrize(("status", "code", "cls"), [
    (400, "invalid_json", E.InvalidJson), (400, "invalid_cursor", E.InvalidCursor),
    (400, "invalid_header", E.InvalidHeader), (400, "bad_request", E.BadRequest),
    (401, "unauthorized", E.Unauthorized), (403, "forbidden", E.Forbidden),
    (404, "not_found", E.NotFound), (409, "thread_exists", E.ThreadExists),
    (409, "message_exists", E.MessageExists), (409, "idempotency_in_flight", E.IdempotencyInFlight),
    (409, "compaction_covered", E.CompactionCovered), (410, "thread_deleted", E.ThreadDeleted),
    (412, "revision_mismatch", E.RevisionMismatch), (412, "already_exists", E.AlreadyExists),
    (413, "payload_too_large", E.PayloadTooLarge),
    (415, "unsupported_media_type", E.UnsupportedMediaType),
    (422, "validation_failed", E.UnprocessableEntity), (422, "unknown_field", E.UnknownField),
    (422, "idempotency_key_reused", E.IdempotencyKeyReused),
    (422, "compaction_not_contiguous", E.CompactionNotContiguous),
    (422, "message_not_live", E.MessageNotLive), (422, "message_not_found", E.MessageNotFound),
    (428, "precondition_required", E.PreconditionRequired),
    (503, "database_unavailable", E.DatabaseUnavailable), (503, "not_ready", E.NotReady),
    # Codes this client does not know yet fall back to the class of their status.
    (409, "some_new_conflict", E.Conflict), (422, "too_many_messages", E.UnprocessableEntity),
    (418, "teapot", APIError),
])
def test_error_factory_maps_codes_then_statuses(status: int, code: str, cls: type) -> None:
    error = E.error_from_response(problem(status, code))
    assert type(error) is cls and error.code == code and error.status_code == status


def test_error_factory_reads_problem_members_and_survives_html() -> None:
    response = httpx.Response(412, headers={"x-request-id": "r1"}, json={
        "type": "urn:agentstate:problem:revision_mismatch", "title": "Revision mismatch",
        "status": 412, "detail": "stale", "instance": "/v1/threads/t", "code": "revision_mismatch",
        "current_revision": 7})
    error = E.error_from_response(response)
    assert isinstance(error, E.RevisionMismatch) and error.current_revision == 7
    assert (error.detail, error.instance, error.request_id) == ("stale", "/v1/threads/t", "r1")
    assert str(error) == "412 revision_mismatch: stale"

    html = E.error_from_response(httpx.Response(502, text="<html>Bad Gateway</html>"))
    assert type(html) is APIError and html.code == "http_error" and "Bad Gateway" in html.detail
    proxy = E.error_from_response(httpx.Response(503, text="busy"))
    assert type(proxy) is E.ServiceUnavailable
