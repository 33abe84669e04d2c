"""ADK's `BaseSessionService` on agentstate, call for call against ADK's own
`InMemorySessionService`, plus what only a persistent service has (stale sessions, atomic
writes). In-process (httpx over ASGI to the app on each backend), so not `slow`."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from agentstate_client import AsyncAgentStateClient
from agentstate_client.adk import AgentStateSessionService, session_thread
from fastapi import FastAPI
from google.adk.errors._stale_session_error import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions import InMemorySessionService
from google.adk.sessions.base_session_service import GetSessionConfig
from google.genai import types

pytestmark = pytest.mark.anyio


def event(n: int, *, delta: dict[str, Any] | None = None, role: str = "user",
          partial: bool | None = None) -> Event:
    return Event(id=f"e-{n}", invocation_id=f"inv-{n // 2}", author=role if role == "user"
                 else "agent", timestamp=1000.0 + n, partial=partial,
                 content=types.Content(role=role, parts=[types.Part(text=f"turn {n}")]),
                 actions=EventActions(state_delta=delta or {}))


def view(session: Any) -> Any:
    """A session as comparable across services (times are each service's own)."""
    if session is None:
        return None
    return (session.app_name, session.user_id, session.id, session.state,
            [e.model_dump(mode="json", exclude_none=True) for e in session.events])


async def outcome(call: Any) -> Any:
    try:
        result = await call
    except (AlreadyExistsError, SessionNotFoundError) as exc:
        return type(exc).__name__
    if hasattr(result, "sessions"):
        return [view(s) for s in result.sessions]
    if hasattr(result, "events"):
        return view(result)
    if isinstance(result, Event):
        return result.model_dump(mode="json", exclude_none=True)
    return result


async def scenario(service: Any, app: str) -> list[Any]:
    """create (duplicate), append with every state prefix, partial events, reads with
    num_recent_events / after_timestamp, lists, user state, delete, writes to a deleted
    session."""
    log: list[Any] = []
    user, other = "user/42", "u:7"
    s1 = await service.create_session(app_name=app, user_id=user, session_id=" s1 ",
                                      state={"a": 1, "app:x": 1, "user:y": 2, "temp:t": 3})
    log.append(view(s1))
    log.append(await outcome(service.create_session(app_name=app, user_id=user,
                                                    session_id="s1")))
    s2 = await service.create_session(app_name=app, user_id=other, session_id="s/2",
                                      state={"user:y": "other user"})
    log.append(view(s2))
    deltas = [{"a": 2, "temp:t": 9}, {"app:x": None, "user:y": {"nested": [1, 2]}},
              {"b": {"deep": True}, "a": None}, {}, {"app:z": "zed"}]
    for n, delta in enumerate(deltas):
        log.append(await outcome(service.append_event(
            s1, event(n, delta=delta, role="user" if n % 2 == 0 else "model"))))
        log.append(view(s1))
    log.append(await outcome(service.append_event(s1, event(99, partial=True))))
    log.append(await outcome(service.append_event(s2, event(50, delta={"c": 1}))))
    for config in (None, GetSessionConfig(num_recent_events=0),
                   GetSessionConfig(num_recent_events=2), GetSessionConfig(num_recent_events=50),
                   GetSessionConfig(after_timestamp=1002.0),
                   GetSessionConfig(after_timestamp=5000.0),
                   GetSessionConfig(num_recent_events=3, after_timestamp=1003.0)):
        log.append(await outcome(service.get_session(app_name=app, user_id=user,
                                                     session_id="s1", config=config)))
    log.append(await outcome(service.get_session(app_name=app, user_id=user,
                                                 session_id="nope")))
    log.append(await outcome(service.list_sessions(app_name=app)))
    log.append(await outcome(service.list_sessions(app_name=app, user_id=other)))
    log.append(await outcome(service.list_sessions(app_name=app, user_id="nobody")))
    log.append(await outcome(service.get_user_state(app_name=app, user_id=user)))
    await service.delete_session(app_name=app, user_id=user, session_id="s1")
    await service.delete_session(app_name=app, user_id=user, session_id="s1")
    log.append(await outcome(service.get_session(app_name=app, user_id=user, session_id="s1")))
    log.append(await outcome(service.append_event(s1, event(7))))
    log.append(await outcome(service.list_sessions(app_name=app)))
    again = await service.create_session(app_name=app, user_id=user, session_id="s1")
    log.append(view(again))
    return log


async def test_same_answers_as_adks_in_memory_service(api: AsyncAgentStateClient,
                                                     uid: str) -> None:
    expected = await scenario(InMemorySessionService(), "my app")
    got = await scenario(AgentStateSessionService(client=api), f"my app {uid}")
    app_name = f"my app {uid}"

    def rename(value: Any) -> Any:
        if isinstance(value, str):
            return app_name if value == "my app" else value
        if isinstance(value, (list, tuple)):
            return type(value)(rename(v) for v in value)
        if isinstance(value, dict):
            return {k: rename(v) for k, v in value.items()}
        return value

    assert got == rename(expected)
    assert "AlreadyExistsError" in expected and "SessionNotFoundError" in expected


async def test_stale_sessions_are_refused_and_write_nothing(api: AsyncAgentStateClient,
                                                           uid: str) -> None:
    service = AgentStateSessionService(client=api)
    await service.create_session(app_name=uid, user_id="u", session_id="s")
    first = await service.get_session(app_name=uid, user_id="u", session_id="s")
    second = await service.get_session(app_name=uid, user_id="u", session_id="s")
    await service.append_event(first, event(1, delta={"k": 1}))
    await service.append_event(first, event(2, role="model"))  # the holder of the news goes on
    with pytest.raises(StaleSessionError):
        await service.append_event(second, event(3, delta={"k": 2, "app:k": 2}))
    stored = await service.get_session(app_name=uid, user_id="u", session_id="s")
    assert [e.id for e in stored.events] == ["e-1", "e-2"]
    assert stored.state == {"k": 1}, "neither the session's nor the app's state changed"
    # Retrying the very same event is not a second event.
    await service.append_event(stored, event(2, role="model"))
    again = await service.get_session(app_name=uid, user_id="u", session_id="s")
    assert [e.id for e in again.events] == ["e-1", "e-2"]
    # The session is an ordinary thread: its events are messages with the event as `item`.
    messages = [m async for m in api.iter_messages(session_thread(uid, "u", "s"))]
    assert [m.role for m in messages] == ["user", "model"]
    assert messages[0].item["id"] == "e-1" and messages[0].id == "e-1"


async def test_sessions_of_many_events(api: AsyncAgentStateClient, uid: str) -> None:
    service = AgentStateSessionService(client=api)
    memory = InMemorySessionService()
    ours = await service.create_session(app_name=uid, user_id="u", session_id="long")
    theirs = await memory.create_session(app_name=uid, user_id="u", session_id="long")
    for n in range(1100):
        await service.append_event(ours, event(n, delta={"turn": n} if n % 100 == 0 else None))
        await memory.append_event(theirs, event(n, delta={"turn": n} if n % 100 == 0 else None))
    for config in (None, GetSessionConfig(num_recent_events=1050),
                   GetSessionConfig(after_timestamp=1000.0 + 40)):
        got = await service.get_session(app_name=uid, user_id="u", session_id="long",
                                        config=config)
        want = await memory.get_session(app_name=uid, user_id="u", session_id="long",
                                        config=config)
        assert view(got) == view(want)


async def test_an_event_with_every_field_reads_back_equal(api: AsyncAgentStateClient,
                                                          uid: str) -> None:
    """ADK's contract: the session read back equals the one the event was appended to (its
    events, state, revision marker and last_update_time, which is the event's time)."""
    service = AgentStateSessionService(client=api)
    session = await service.create_session(app_name=uid, user_id="u", state={"k": "v"})
    created_at = session.last_update_time
    rich = Event(
        invocation_id="inv", author="agent", branch="root.sub", timestamp=created_at + 10,
        content=types.Content(role="model", parts=[
            types.Part(text="calling"),
            types.Part(function_call=types.FunctionCall(id="fc1", name="lookup",
                                                        args={"q": "AAPL", "n": [1, 2]}))]),
        actions=EventActions(skip_summarization=True, state_delta={"k": "w", "user:u": 1},
                             artifact_delta={"report.txt": 2}, transfer_to_agent="other",
                             escalate=True),
        long_running_tool_ids={"fc1"}, error_code="E1", error_message="boom",
        interrupted=True, custom_metadata={"z": 1, "a": [None, {"b": 2}]},
        grounding_metadata=types.GroundingMetadata(web_search_queries=["aapl price"]),
        usage_metadata=types.GenerateContentResponseUsageMetadata(
            prompt_token_count=3, candidates_token_count=4, total_token_count=7),
        input_transcription=types.Transcription(text="in", finished=True),
        output_transcription=types.Transcription(text="out", finished=False),
    )
    await service.append_event(session, rich)
    assert session.last_update_time == pytest.approx(created_at + 10)
    again = await service.get_session(app_name=uid, user_id="u", session_id=session.id)
    assert again == session
    assert again.last_update_time == pytest.approx(created_at + 10)
    assert again.state == {"k": "w", "user:u": 1}


class LosesFirstBatchAnswer(httpx.AsyncBaseTransport):
    """Delivers every request; the answer to the first append's batch is lost on the way
    back (after the server committed it)."""

    def __init__(self, app: FastAPI) -> None:
        self.inner = httpx.ASGITransport(app=app)
        self.lost = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if b'"append_messages"' in request.content and not self.lost:
            self.lost += 1
            await response.aread()
            raise httpx.ReadError("connection reset", request=request)
        return response


async def test_an_append_whose_answer_was_lost_is_stored_once(app: FastAPI, uid: str) -> None:
    transport = LosesFirstBatchAnswer(app)
    async with AsyncAgentStateClient("http://agentstate.test", transport=transport,
                                     backoff=0.01) as client:
        service = AgentStateSessionService(client=client)
        session = await service.create_session(app_name=uid, user_id="u", session_id="s")
        await service.append_event(session, event(1, delta={"k": 1}))
        await service.append_event(session, event(2, role="model"))
        assert transport.lost == 1
        stored = await service.get_session(app_name=uid, user_id="u", session_id="s")
    assert [e.id for e in stored.events] == ["e-1", "e-2"] and stored.state == {"k": 1}
    assert stored == session
