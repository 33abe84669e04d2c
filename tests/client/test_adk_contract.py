"""The behaviours ADK's shared session-service contract holds every `BaseSessionService` to,
checked on `AgentStateSessionService` against ADK's own `InMemorySessionService`.

Each test runs one sequence of calls on both services (`on_both`) and requires the same
observations from each, then checks the observations themselves, so a test cannot pass by
both services being wrong the same way. What only a persistent service has (stale sessions,
lost answers) is in `test_adk.py`.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from agentstate_client import AsyncAgentStateClient
from agentstate_client.adk import AgentStateSessionService
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions import InMemorySessionService
from google.adk.sessions.base_session_service import BaseSessionService, GetSessionConfig
from google.adk.sessions.session import Session
from google.adk.tools.tool_confirmation import ToolConfirmation
from google.genai import types

from tests.client.test_adk import outcome, view

pytestmark = pytest.mark.anyio

T = TypeVar("T")
Steps = Callable[[BaseSessionService, str], Awaitable[T]]


async def on_both(api: AsyncAgentStateClient, uid: str, steps: Steps[T]) -> T:
    """`steps` on ADK's in-memory service and on ours (same app name, each its own store);
    both must observe the same. Returns what they observed."""
    app = f"app-{uid}"
    theirs = await steps(InMemorySessionService(), app)
    ours = await steps(AgentStateSessionService(client=api), app)
    assert ours == theirs
    return ours


def must(value: T | None) -> T:
    assert value is not None
    return value


def ev(name: str, at: float, delta: dict[str, Any] | None = None, **fields: Any) -> Event:
    """An event with a fixed id and time, so both services store the very same one."""
    return Event(id=name, invocation_id=f"inv-{name}", author=fields.pop("author", "user"),
                 timestamp=at, actions=EventActions(state_delta=delta or {}), **fields)


async def get(service: BaseSessionService, app: str, user: str, session_id: str,
              config: GetSessionConfig | None = None) -> Session | None:
    return await service.get_session(app_name=app, user_id=user, session_id=session_id,
                                     config=config)


# --- create, get, delete -------------------------------------------------------------------


async def test_a_session_nobody_created_reads_as_none(api: AsyncAgentStateClient,
                                                      uid: str) -> None:
    async def steps(service: BaseSessionService, app: str) -> list[Any]:
        await service.create_session(app_name=app, user_id="u", session_id="real")
        return [await get(service, app, "u", "other"), await get(service, app, "nobody", "real"),
                await get(service, f"{app}-unknown", "u", "real"),
                await get(service, app, "u", "other", GetSessionConfig(num_recent_events=1))]

    assert await on_both(api, uid, steps) == [None, None, None, None]


async def test_a_created_session_reads_back_equal_until_deleted(api: AsyncAgentStateClient,
                                                                uid: str) -> None:
    async def steps(service: BaseSessionService, app: str) -> list[Any]:
        before = time.time()
        made = await service.create_session(app_name=app, user_id="u", state={"k": "v"})
        assert made.id and before <= made.last_update_time <= time.time()
        got = must(await get(service, app, "u", made.id))
        assert got == made  # every field, the storage marker and last_update_time included
        await service.delete_session(app_name=app, user_id="u", session_id=made.id)
        return [made.app_name, made.user_id, made.state, made.events,
                await get(service, app, "u", made.id)]

    assert await on_both(api, uid, steps) == [f"app-{uid}", "u", {"k": "v"}, [], None]


async def test_a_session_id_is_unique_per_user_and_trimmed(api: AsyncAgentStateClient,
                                                           uid: str) -> None:
    """A taken id is refused (padded or not, and the first session is left as it was); a
    blank one is a generated one; a padded id reads and deletes the trimmed one."""
    async def steps(service: BaseSessionService, app: str) -> list[Any]:
        log: list[Any] = []
        await service.create_session(app_name=app, user_id="u", session_id="taken",
                                     state={"keep": "first"})
        for again in ("taken", "  taken  "):
            log.append(await outcome(service.create_session(
                app_name=app, user_id="u", session_id=again, state={"keep": "second"})))
        log.append(must(await get(service, app, "u", "taken")).state)
        blank = await service.create_session(app_name=app, user_id="u", session_id="   ")
        log.append(bool(blank.id.strip()) and blank.id == blank.id.strip())
        log.append(view(await get(service, app, "u", " taken ")))
        await service.delete_session(app_name=app, user_id="u", session_id="\ttaken ")
        log.append(await get(service, app, "u", "taken"))
        return log

    log = await on_both(api, uid, steps)
    assert log[:3] == ["AlreadyExistsError", "AlreadyExistsError", {"keep": "first"}]
    assert log[3] is True and log[4][2] == "taken" and log[5] is None


async def test_the_same_session_id_under_two_users_is_two_sessions(
        api: AsyncAgentStateClient, uid: str) -> None:
    async def steps(service: BaseSessionService, app: str) -> list[Any]:
        first = await service.create_session(app_name=app, user_id="u1", session_id="s",
                                             state={"who": 1})
        await service.append_event(first, ev("e1", 10.0))
        await service.create_session(app_name=app, user_id="u2", session_id="s",
                                     state={"who": 2})
        log = [view(await get(service, app, "u2", "s")), view(await get(service, app, "u1", "s"))]
        await service.delete_session(app_name=app, user_id="u1", session_id="s")
        log += [await get(service, app, "u1", "s"), view(await get(service, app, "u2", "s"))]
        return log

    u2, u1, gone, u2_after = await on_both(api, uid, steps)
    assert u2[1] == "u2" and u2[3] == {"who": 2} and u2[4] == []
    assert u1[1] == "u1" and len(u1[4]) == 1 and gone is None and u2_after == u2


async def test_deleting_what_is_not_there_changes_nothing(api: AsyncAgentStateClient,
                                                          uid: str) -> None:
    async def steps(service: BaseSessionService, app: str) -> list[Any]:
        await service.create_session(app_name=app, user_id="u", session_id="s")
        for app_name, user, session_id in ((app, "u", "missing"), (app, "other", "s"),
                                           (f"{app}-other", "u", "s")):
            await service.delete_session(app_name=app_name, user_id=user, session_id=session_id)
        return [view(await get(service, app, "u", "s"))]

    assert (await on_both(api, uid, steps))[0][2] == "s"


# --- listing --------------------------------------------------------------------------------


async def test_listing_gives_each_session_its_own_state_and_no_events(
        api: AsyncAgentStateClient, uid: str) -> None:
    async def steps(service: BaseSessionService, app: str) -> list[Any]:
        for n in range(5):
            made = await service.create_session(app_name=app, user_id="u", session_id=f"s{n}",
                                                state={"key": f"value{n}"})
            await service.append_event(made, ev(f"e{n}", 100.0 + n))
        listed = (await service.list_sessions(app_name=app, user_id="u")).sessions
        return [(s.id, s.state, s.events) for s in listed]

    listed = await on_both(api, uid, steps)
    assert listed == [(f"s{n}", {"key": f"value{n}"}, []) for n in range(5)]


async def test_listing_without_a_user_spans_every_user(api: AsyncAgentStateClient,
                                                       uid: str) -> None:
    async def steps(service: BaseSessionService, app: str) -> list[Any]:
        for user, session_id in (("u1", "a"), ("u1", "b"), ("u2", "c")):
            await service.create_session(app_name=app, user_id=user, session_id=session_id,
                                         state={"key": session_id, f"user:of-{user}": True,
                                                "app:shared": 1, "temp:gone": 0})
        log: list[Any] = []
        for whose in ("u1", "u2", None, "nobody"):
            listed = (await service.list_sessions(app_name=app, user_id=whose)).sessions
            log.append(sorted((s.user_id, s.id, sorted(s.state.items())) for s in listed))
        log.append((await service.list_sessions(app_name=f"{app}-unknown")).sessions)
        return log

    u1, u2, everyone, nobody, unknown_app = await on_both(api, uid, steps)
    assert [s[1] for s in u1] == ["a", "b"] and [s[1] for s in u2] == ["c"]
    assert everyone == sorted(u1 + u2) and nobody == [] and unknown_app == []
    assert dict(u2[0][2]) == {"key": "c", "user:of-u2": True, "app:shared": 1}


async def test_listing_puts_the_most_recently_active_session_last(
        api: AsyncAgentStateClient, uid: str) -> None:
    async def steps(service: BaseSessionService, app: str) -> list[str]:
        made = [await service.create_session(app_name=app, user_id="u", session_id=name)
                for name in ("a", "b", "c")]
        await service.append_event(made[0], ev("late", time.time() + 60))
        return [s.id for s in (await service.list_sessions(app_name=app, user_id="u")).sessions]

    assert await on_both(api, uid, steps) == ["b", "c", "a"]


# --- state scopes ---------------------------------------------------------------------------


async def test_app_user_and_session_state_reach_whom_they_should(api: AsyncAgentStateClient,
                                                                 uid: str) -> None:
    """app: state reaches every user's sessions, user: state that user's sessions, plain
    state its own session only; whether set at creation or by an event."""
    async def steps(service: BaseSessionService, app: str) -> list[Any]:
        first = await service.create_session(
            app_name=app, user_id="u1", session_id="s1",
            state={"app:a1": "x", "user:u1": "y", "own1": "z"})
        await service.append_event(first, ev("e", 50.0, {"app:a2": 2, "user:u2": 3, "own2": 4}))
        sibling = await service.create_session(app_name=app, user_id="u1", session_id="s2")
        stranger = await service.create_session(app_name=app, user_id="u2", session_id="s3")
        again = must(await get(service, app, "u1", "s1"))
        return [first.state, sibling.state, stranger.state, again.state]

    first, sibling, stranger, again = await on_both(api, uid, steps)
    assert stranger == {"app:a1": "x", "app:a2": 2}
    assert sibling == {**stranger, "user:u1": "y", "user:u2": 3}
    assert again == first == {**sibling, "own1": "z", "own2": 4}


async def test_a_state_delta_replaces_values_whole(api: AsyncAgentStateClient,
                                                   uid: str) -> None:
    """A dict replaces the stored dict (no deep merge), None is stored (the key stays), and
    values a delta does not name keep their type; in every scope, in the session object
    appended to and in what is read afterwards."""
    async def steps(service: BaseSessionService, app: str) -> list[Any]:
        start = {"profile": {"name": "ada", "role": "admin"}, "flag": True, "off": False}
        scoped = {f"{scope}{key}": value for scope in ("", "app:", "user:")
                  for key, value in start.items()}
        session = await service.create_session(app_name=app, user_id="u", session_id="s",
                                               state=scoped)
        delta = {f"{scope}{key}": value for scope in ("", "app:", "user:")
                 for key, value in {"profile": {"name": "bob"}, "flag": None,
                                    "new": True}.items()}
        await service.append_event(session, ev("e", 60.0, delta))
        reread = must(await get(service, app, "u", "s"))
        sibling = await service.create_session(app_name=app, user_id="u", session_id="s2")
        return [session.state, reread.state, sibling.state]

    held, reread, sibling = await on_both(api, uid, steps)
    for scope in ("", "app:", "user:"):
        assert reread[f"{scope}profile"] == {"name": "bob"}
        assert f"{scope}flag" in reread and reread[f"{scope}flag"] is None
        assert reread[f"{scope}off"] is False and reread[f"{scope}new"] is True
    assert held == reread
    assert sibling == {k: v for k, v in reread.items() if k.startswith(("app:", "user:"))}


async def test_temp_state_lives_in_the_session_object_only(api: AsyncAgentStateClient,
                                                           uid: str) -> None:
    """A later step of the same invocation reads the temp: value from the session object;
    the event appended (the caller's own object) loses the key; nothing stores it."""
    async def steps(service: BaseSessionService, app: str) -> list[Any]:
        session = await service.create_session(app_name=app, user_id="u", session_id="s")
        first = ev("e1", 70.0, {"temp:out": "from step 1", "kept": 1})
        await service.append_event(session, first)
        seen = session.state.get("temp:out")
        await service.append_event(session, ev("e2", 71.0, {"kept": 2}))
        reread = must(await get(service, app, "u", "s"))
        return [seen, dict(first.actions.state_delta), session.state,
                reread.state, [e.actions.state_delta for e in reread.events]]

    seen, first_delta, held, reread, deltas = await on_both(api, uid, steps)
    assert seen == "from step 1" and first_delta == {"kept": 1}
    assert held == {"temp:out": "from step 1", "kept": 2}
    assert reread == {"kept": 2} and deltas == [{"kept": 1}, {"kept": 2}]


# --- user state without a session -----------------------------------------------------------


async def test_user_state_reads_without_a_session(api: AsyncAgentStateClient, uid: str) -> None:
    async def steps(service: BaseSessionService, app: str) -> list[Any]:
        log = [await service.get_user_state(app_name=app, user_id="u1")]
        session = await service.create_session(app_name=app, user_id="u1", session_id="s",
                                               state={"user:from_create": 0})
        await service.append_event(session, ev("e1", 80.0, {"user:profile": {"name": "Alice"},
                                                            "user:counter": 1, "plain": 1}))
        await service.append_event(session, ev("e2", 81.0, {"user:counter": 2}))
        for app_name, user in ((app, "u1"), (app, "u2"), (f"{app}-other", "u1")):
            log.append(await service.get_user_state(app_name=app_name, user_id=user))
        return log

    before, mine, other_user, other_app = await on_both(api, uid, steps)
    assert before == {} and other_user == {} and other_app == {}
    assert mine == {"from_create": 0, "profile": {"name": "Alice"}, "counter": 2}


# --- appending ------------------------------------------------------------------------------


async def test_binary_data_in_an_event_reads_back_as_bytes(api: AsyncAgentStateClient,
                                                          uid: str) -> None:
    """Inline bytes and a grounding blob come back as the same bytes, whichever way the
    session is read."""
    content = types.Content(role="user", parts=[
        types.Part.from_bytes(data=b"\x89PNG\x00\xffpixels", mime_type="image/png")])
    grounding = types.GroundingMetadata(
        search_entry_point=types.SearchEntryPoint(sdk_blob=b"\x00blob\xfe"))

    async def steps(service: BaseSessionService, app: str) -> list[Any]:
        session = await service.create_session(app_name=app, user_id="u", session_id="s")
        await service.append_event(session, ev("bin", 90.0, content=content,
                                               grounding_metadata=grounding))
        log: list[Any] = [session.events[0].content == content]
        for config in (None, GetSessionConfig(num_recent_events=1),
                       GetSessionConfig(after_timestamp=89.0)):
            events = must(await get(service, app, "u", "s", config)).events
            log.append([(e.content, e.grounding_metadata) for e in events])
        return log

    log = await on_both(api, uid, steps)
    assert log[0] is True
    assert log[1:] == [[(content, grounding)]] * 3


async def test_an_event_with_every_field_reads_back_equal(api: AsyncAgentStateClient,
                                                          uid: str) -> None:
    """The session read back equals the one appended to, for an event that sets every kind
    of field (some to empty or false values, a time before the session's creation)."""
    async def steps(service: BaseSessionService, app: str) -> list[Any]:
        session = await service.create_session(app_name=app, user_id="u", session_id="s")
        full = Event(
            id="full", invocation_id="inv", author="agent", timestamp=1_600_000_000.25,
            content=types.Content(role="model", parts=[types.Part(text="hello")]),
            turn_complete=True, partial=False, interrupted=True,
            actions=EventActions(
                artifact_delta={"file": 0}, transfer_to_agent="other", escalate=True,
                requested_tool_confirmations={"call-1": ToolConfirmation(
                    hint="sure?", confirmed=False,
                    payload={"collection": "photos", "id": "album-1"})}),
            long_running_tool_ids={"call-1"}, error_code="E", error_message="broke",
            grounding_metadata=types.GroundingMetadata(web_search_queries=["q"]),
            usage_metadata=types.GenerateContentResponseUsageMetadata(
                prompt_token_count=1, candidates_token_count=2, total_token_count=3),
            citation_metadata=types.CitationMetadata(), custom_metadata={"k": ["v", None]},
            input_transcription=types.Transcription(text="heard", finished=True),
            output_transcription=types.Transcription(text="said", finished=False))
        await service.append_event(session, full)
        reread = must(await get(service, app, "u", "s"))
        assert reread == session
        confirmation = reread.events[0].actions.requested_tool_confirmations["call-1"]
        return [view(reread), reread.last_update_time, confirmation]

    _, updated, confirmation = await on_both(api, uid, steps)
    assert updated == 1_600_000_000.25
    assert confirmation == ToolConfirmation(hint="sure?", confirmed=False,
                                            payload={"collection": "photos", "id": "album-1"})


async def test_last_update_time_is_the_last_events_time(api: AsyncAgentStateClient,
                                                        uid: str) -> None:
    async def steps(service: BaseSessionService, app: str) -> list[Any]:
        session = await service.create_session(app_name=app, user_id="u", session_id="s")
        created = session.last_update_time
        await service.append_event(session, ev("e", created + 10))
        reread = must(await get(service, app, "u", "s"))
        listed = (await service.list_sessions(app_name=app, user_id="u")).sessions
        return [session.last_update_time - created, reread.last_update_time - created,
                listed[0].last_update_time - created]

    assert await on_both(api, uid, steps) == [pytest.approx(10, abs=1e-6)] * 3


async def test_event_times_read_back_exactly(api: AsyncAgentStateClient, uid: str) -> None:
    """Times in an hour some zones repeat, and ones with many digits, come back to the bit."""
    times = [1730613600.0, 1730615400.0, 1730615400.123456, 1.5, 1e-3, 4102444800.999999]

    async def steps(service: BaseSessionService, app: str) -> list[Any]:
        session = await service.create_session(app_name=app, user_id="u", session_id="s")
        for n, at in enumerate(times):
            await service.append_event(session, ev(f"t{n}", at))
        whole = must(await get(service, app, "u", "s")).events
        recent = must(await get(service, app, "u", "s",
                                GetSessionConfig(num_recent_events=len(times)))).events
        return [[e.timestamp for e in whole], [e.timestamp for e in recent]]

    assert await on_both(api, uid, steps) == [times, times]


async def test_events_sharing_a_time_keep_their_order(api: AsyncAgentStateClient,
                                                      uid: str) -> None:
    async def steps(service: BaseSessionService, app: str) -> list[Any]:
        session = await service.create_session(app_name=app, user_id="u", session_id="s")
        for name in ("z", "m", "a"):
            await service.append_event(session, ev(name, 100.0))
        log = []
        for config in (None, GetSessionConfig(num_recent_events=2),
                       GetSessionConfig(after_timestamp=100.0)):
            log.append([e.id for e in must(await get(service, app, "u", "s", config)).events])
        return log

    assert await on_both(api, uid, steps) == [["z", "m", "a"], ["m", "a"], ["z", "m", "a"]]


async def test_recent_and_after_filters(api: AsyncAgentStateClient, uid: str) -> None:
    base = float(int(time.time()))

    async def steps(service: BaseSessionService, app: str) -> list[Any]:
        session = await service.create_session(app_name=app, user_id="u", session_id="s")
        for n in range(1, 6):
            await service.append_event(session, ev(f"e{n}", base + n))
        log = []
        for recent, after in ((None, None), (0, None), (3, None), (9, None), (None, base + 4),
                              (None, base + 50), (None, base - 50), (3, base + 4),
                              (2, base + 1), (0, base + 1)):
            config = GetSessionConfig(num_recent_events=recent, after_timestamp=after)
            events = must(await get(service, app, "u", "s", config)).events
            log.append([e.timestamp - base for e in events])
        return log

    assert await on_both(api, uid, steps) == [
        [1, 2, 3, 4, 5], [], [3, 4, 5], [1, 2, 3, 4, 5], [4, 5], [], [1, 2, 3, 4, 5], [4, 5],
        [4, 5], []]


async def test_partial_events_are_neither_kept_nor_stored(api: AsyncAgentStateClient,
                                                          uid: str) -> None:
    async def steps(service: BaseSessionService, app: str) -> list[Any]:
        session = await service.create_session(app_name=app, user_id="u", session_id="s")
        streamed = ev("chunk", 5.0, {"k": 1}, partial=True)
        returned = await service.append_event(session, streamed)
        reread = must(await get(service, app, "u", "s"))
        return [returned is streamed, session.events, session.state, reread.events,
                reread.state]

    assert await on_both(api, uid, steps) == [True, [], {}, [], {}]


async def test_appending_to_a_session_not_stored_raises(api: AsyncAgentStateClient,
                                                        uid: str) -> None:
    async def steps(service: BaseSessionService, app: str) -> list[Any]:
        never = Session(app_name=app, user_id="u", id="never-created")
        deleted = await service.create_session(app_name=app, user_id="u", session_id="s")
        await service.delete_session(app_name=app, user_id="u", session_id="s")
        return [await outcome(service.append_event(never, ev("e1", 1.0, {"app:k": 1}))),
                await outcome(service.append_event(deleted, ev("e2", 2.0, {"user:k": 1}))),
                await service.get_user_state(app_name=app, user_id="u"),
                (await service.list_sessions(app_name=app)).sessions]

    assert await on_both(api, uid, steps) == ["SessionNotFoundError", "SessionNotFoundError",
                                              {}, []]


async def test_an_event_delivered_again_is_stored_once(api: AsyncAgentStateClient,
                                                       uid: str) -> None:
    """The same event appended again (the same object, or an equal copy) is neither a second
    event nor a second application of its state delta."""
    async def steps(service: BaseSessionService, app: str) -> list[Any]:
        session = await service.create_session(app_name=app, user_id="u", session_id="s",
                                               state={"n": 0})
        once = ev("once", 10.0, {"n": 1, "user:seen": 1})
        await service.append_event(session, once)
        await service.append_event(session, once)
        await service.append_event(session, once.model_copy(deep=True))
        reread = must(await get(service, app, "u", "s"))
        return [[e.id for e in session.events], view(reread)]

    held, reread = await on_both(api, uid, steps)
    assert held == ["once"] and [e["id"] for e in reread[4]] == ["once"]
    assert reread[3] == {"n": 1, "user:seen": 1}



async def test_different_events_that_share_an_id_are_both_kept(api: AsyncAgentStateClient,
                                                               uid: str) -> None:
    """An id is not what makes an event a repeat: a different event that reuses one (as a
    fixed id in a test would) is stored and applied like any other, and delivering either
    of the two again is still no new event."""
    async def steps(service: BaseSessionService, app: str) -> list[Any]:
        session = await service.create_session(app_name=app, user_id="u", session_id="s")
        first = ev("shared", 1.0, {"a": 1})
        second = ev("shared", 2.0, {"b": 2}, author="agent")
        for event in (first, second, second, first.model_copy(deep=True)):
            await service.append_event(session, event)
        reread = must(await get(service, app, "u", "s"))
        recent = must(await get(service, app, "u", "s", GetSessionConfig(num_recent_events=1)))
        return [[e.author for e in session.events], session.state, view(reread),
                view(recent)]

    held, held_state, reread, recent = await on_both(api, uid, steps)
    assert held == ["user", "agent"] and held_state == {"a": 1, "b": 2}
    assert [(e["id"], e["author"]) for e in reread[4]] == [("shared", "user"),
                                                           ("shared", "agent")]
    assert reread[3] == held_state and [e["author"] for e in recent[4]] == ["agent"]
