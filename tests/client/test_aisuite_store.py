"""The aisuite drop-in, with aisuite's own RunState, StoredRunState and StateConflictError,
side by side with aisuite's InMemoryStateStore."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from agentstate_client import AgentStateClient
from agentstate_client import aisuite as adapter
from agentstate_client.aisuite import AgentStateStore
from aisuite.agents import (
    Agent,
    InMemoryStateStore,
    Runner,
    RunState,
    StateConflictError,
    StoredRunState,
    ThreadAlreadyExistsError,
)

from tests.support import ServerProcess

TOOL_CALL = {"id": "call_1", "type": "function",
             "function": {"name": "lookup", "arguments": "{\"q\": \"AAPL\"}"}}
MESSAGES_SO_FAR: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": [{"type": "text", "text": "Price of AAPL?"}]},
    # As aisuite stores a model's message: no content member, extra provider members.
    {"role": "assistant", "tool_calls": [TOOL_CALL], "refusal": None, "annotations": []},
    {"role": "tool", "tool_call_id": "call_1", "name": "lookup", "content": "189.1"},
    {"role": "assistant", "content": "189.1", "artifact_refs": [{"artifact_id": "a1"}]},
]


def run_state(messages: list[dict[str, Any]], **changes: Any) -> RunState:
    fields = {"status": "requires_input", "run_name": "r", "trace_id": "trace_1",
              "tags": ["desk"], "metadata": {"k": 1}, "max_turns": 7, **changes}
    return RunState(agent_name="analyst", messages=[dict(m) for m in messages], **fields)


class Recorder:
    """An httpx client for the store that records what each PUT appended."""

    def __init__(self) -> None:
        self.appended: list[int] = []
        self.requests: list[str] = []
        self.http = httpx.Client(event_hooks={"request": [self.record]})

    def record(self, request: httpx.Request) -> None:
        self.requests.append(request.method)
        if request.method == "PUT":
            self.appended.append(len(json.loads(request.content).get("append_messages", [])))


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    rec = Recorder()
    yield rec
    rec.http.close()


@pytest.fixture
def store(server: ServerProcess, recorder: Recorder) -> Iterator[AgentStateStore]:
    client = AgentStateClient(server.base_url, http_client=recorder.http)
    yield AgentStateStore(client)
    client.close()


def outcome(action: Any) -> Any:
    """What a store call gave, comparable across stores: revision, state, metadata, or the
    exception type."""
    try:
        result = action()
    except StateConflictError:
        return "conflict"
    if isinstance(result, StoredRunState):
        return result.revision, result.state.to_dict(), result.metadata
    return result


def scenario(store: Any, thread_id: str) -> list[Any]:
    first = run_state(MESSAGES_SO_FAR[:2])
    more = run_state(MESSAGES_SO_FAR[:4], status="completed")
    most = run_state(MESSAGES_SO_FAR)
    return [
        outcome(lambda: store.load_state(thread_id)),
        outcome(lambda: store.delete_state(thread_id)),  # never saved
        outcome(lambda: store.save_state(thread_id, first, metadata={"user": "u1"})),
        outcome(lambda: store.load_state(thread_id)),
        outcome(lambda: store.save_state(thread_id, more, revision=1)),
        outcome(lambda: store.save_state(thread_id, most, revision=1)),
        outcome(lambda: store.save_state(thread_id, most, revision=9)),
        outcome(lambda: store.save_state(thread_id, most)),
        outcome(lambda: store.load_state(thread_id)),
        outcome(lambda: store.save_state(thread_id, most, revision=3, metadata={"user": "u2"})),
        outcome(lambda: store.load_state(thread_id)),
        outcome(lambda: store.delete_state(thread_id)),
        outcome(lambda: store.load_state(thread_id)),
        outcome(lambda: store.delete_state(thread_id)),
        outcome(lambda: store.save_state(thread_id, first, revision=4)),
    ]


@pytest.mark.slow
def test_same_answers_as_aisuite_in_memory_store(store: AgentStateStore, uid: str) -> None:
    expected = scenario(InMemoryStateStore(), "t")
    got = scenario(store, f"ai-{uid}")
    assert got == expected
    assert [r[0] for r in got if isinstance(r, tuple)] == [1, 1, 2, 3, 3, 4, 4]
    # The documented difference: after a delete, revisions continue (the delete took 5)
    # where aisuite restarts at 1, so no revision from before the delete can match.
    assert store.save_state(f"ai-{uid}", run_state([])).revision == 6


@pytest.mark.slow
def test_saves_send_only_new_messages_into_the_log(server: ServerProcess, store: AgentStateStore,
                                                  recorder: Recorder, uid: str) -> None:
    thread_id = f"log-{uid}"
    stored = store.save_state(thread_id, run_state(MESSAGES_SO_FAR[:2]))
    for count in (3, 4, 5):
        stored = store.save_state(thread_id, run_state(MESSAGES_SO_FAR[:count]),
                                  revision=stored.revision)
    assert recorder.appended == [2, 1, 1, 1], "each save appends only what is new"
    assert recorder.requests == ["PUT"] * 4, "known revisions need no read before a save"
    assert stored.revision == 4

    with AgentStateClient(server.base_url) as client:
        thread = client.get_thread(thread_id)
        assert "messages" not in thread.state or thread.state["messages"] == []
        assert thread.state["agent_name"] == "analyst" and thread.message_count == 5
        logged = list(client.iter_messages(thread_id))
        assert [m.role for m in logged] == [m["role"] for m in MESSAGES_SO_FAR]
        assert logged[2].tool_calls == [TOOL_CALL] and logged[3].tool_call_id == "call_1"

    fresh = AgentStateStore(base_url=server.base_url)
    loaded = fresh.load_state(thread_id)
    assert loaded is not None and loaded.state.messages == MESSAGES_SO_FAR
    assert loaded.state.to_dict() == run_state(MESSAGES_SO_FAR).to_dict()
    fresh.close()


@pytest.mark.slow
def test_overwrite_and_trim_are_accepted_as_aisuite_accepts_them(server: ServerProcess,
                                                                 store: AgentStateStore,
                                                                 uid: str) -> None:
    """`revision=None` overwrites (as aisuite's stores do), messages another writer
    appended included; a shorter history is stored as it is."""
    thread_id = f"ow-{uid}"
    store.save_state(thread_id, run_state(MESSAGES_SO_FAR[:2]))
    with AgentStateClient(server.base_url) as other:
        other.append_message(thread_id, "user", "from another agent")
    saved = store.save_state(thread_id, run_state(MESSAGES_SO_FAR[:3]))
    assert store.load_state(thread_id).state.messages == MESSAGES_SO_FAR[:3]
    trimmed = store.save_state(thread_id, run_state(MESSAGES_SO_FAR[:1]), revision=saved.revision)
    fresh = AgentStateStore(base_url=server.base_url)
    assert fresh.load_state(thread_id).state.messages == MESSAGES_SO_FAR[:1]
    fresh.close()
    with pytest.raises(StateConflictError):
        store.save_state(thread_id, run_state([]), revision=saved.revision)
    with AgentStateClient(server.base_url) as client:
        full = list(client.iter_messages(thread_id, view="full"))
    assert [m.content for m in full] == ["You are terse."], "removed, not hidden"
    assert store.save_state(thread_id, run_state([]), revision=trimmed.revision).revision > 0


def edits(store: Any, thread_id: str) -> list[Any]:
    """Saves that edit, trim and rewrite earlier messages; each answer as the messages that
    load back (revisions differ: an editing save takes one per request here)."""
    answers: list[Any] = []

    def save(messages: list[dict[str, Any]], revision: int | None) -> int:
        stored = store.save_state(thread_id, run_state(messages), revision=revision)
        loaded = store.load_state(thread_id)
        answers.append(loaded.state.messages)
        assert loaded.revision == stored.revision
        return int(stored.revision)

    revision = save(MESSAGES_SO_FAR, None)
    loaded = store.load_state(thread_id).state.messages
    loaded[1]["content"] = "[redacted]"                       # redact an earlier message
    revision = save(loaded, revision)
    loaded = store.load_state(thread_id).state.messages
    loaded[4]["artifact_refs"] = []                            # an extra member changes
    del loaded[0]["content"]                                   # content becomes absent
    revision = save(loaded, revision)
    revision = save(loaded[:3], revision)                      # trim the end
    changed = [dict(loaded[0]), {"role": "user", "content": "rephrased"}, loaded[2]]
    revision = save(changed, revision)                         # a role changes mid-way
    revision = save([changed[2], *changed], revision)          # insert at the front
    save([{"role": "user", "content": "start over"}], None)    # overwrite
    save([], None)
    try:
        store.save_state(thread_id, run_state([]), revision=1)
    except StateConflictError:
        answers.append("conflict")
    return answers


@pytest.mark.slow
def test_edits_and_trims_load_back_as_in_aisuites_memory_store(server: ServerProcess,
                                                               store: AgentStateStore,
                                                               uid: str) -> None:
    expected = edits(InMemoryStateStore(), "t")
    assert edits(store, f"ed-{uid}") == expected
    assert expected[1][1]["content"] == "[redacted]" and expected[-1] == "conflict"


@pytest.mark.slow
def test_a_redaction_leaves_no_trace_of_the_old_text(server: ServerProcess,
                                                     store: AgentStateStore, uid: str) -> None:
    thread_id = f"red-{uid}"
    secret = f"my card is 4111-{uid}"
    saved = store.save_state(thread_id, run_state([{"role": "user", "content": secret},
                                                   {"role": "assistant", "content": "ok"}]))
    loaded = store.load_state(thread_id)
    loaded.state.messages[0]["content"] = "my card is [redacted]"
    store.save_state(thread_id, loaded.state, revision=saved.revision)
    with AgentStateClient(server.base_url) as client:
        full = list(client.iter_messages(thread_id, view="full"))
        assert [m.content for m in full] == ["my card is [redacted]", "ok"]
        assert [m.seq for m in full] == [1, 2], "edited in place, not re-appended"
        events = client.list_events(thread_id=thread_id).data
    assert "message.redacted" in [e.type for e in events]
    assert secret not in json.dumps([e.resource for e in events])


@pytest.mark.slow
def test_load_pages_through_long_threads_and_shows_compactions(
        server: ServerProcess, store: AgentStateStore, uid: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adapter, "PAGE", 2)
    thread_id = f"long-{uid}"
    saved = store.save_state(thread_id, run_state(MESSAGES_SO_FAR))
    assert store.load_state(thread_id).state.messages == MESSAGES_SO_FAR

    with AgentStateClient(server.base_url) as client:
        ids = [m.id for m in client.iter_messages(thread_id)]
        client.create_compaction(thread_id, ids[1:4], {"role": "assistant", "content": "sum"})
    loaded = store.load_state(thread_id)
    assert loaded.revision == saved.revision + 1
    assert loaded.state.messages == [MESSAGES_SO_FAR[0], {"role": "assistant", "content": "sum"},
                                     MESSAGES_SO_FAR[4]]
    loaded.state.messages.append({"role": "user", "content": "next"})
    after = store.save_state(thread_id, loaded.state, revision=loaded.revision)
    assert store.load_state(thread_id).state.messages == loaded.state.messages
    assert after.revision == loaded.revision + 1


def test_error_is_aisuites_and_ours() -> None:
    from agentstate_client import AgentStateError

    assert issubclass(adapter.StateConflictError, StateConflictError)
    assert issubclass(adapter.StateConflictError, AgentStateError)


class FakeModel:
    """Stands in for aisuite's `Client`: answers every chat completion with one message."""

    def __init__(self) -> None:
        self.calls: list[list[dict[str, Any]]] = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    def create(self, model: str, messages: list[dict[str, Any]], **_: Any) -> SimpleNamespace:
        self.calls.append(messages)
        reply = SimpleNamespace(role="assistant", content=f"reply {len(self.calls)}")
        return SimpleNamespace(choices=[SimpleNamespace(message=reply)])


@pytest.mark.slow
def test_aisuite_runner_persists_and_continues_through_the_store(store: AgentStateStore,
                                                                 recorder: Recorder,
                                                                 uid: str) -> None:
    agent = Agent(name="analyst", model="fake:model", instructions="Be terse.")
    model = FakeModel()
    thread_id = f"runner-{uid}"
    Runner.run_sync(agent, "Hi", client=model, state_store=store, thread_id=thread_id,
                    tracing_disabled=True)
    with pytest.raises(ThreadAlreadyExistsError):
        Runner.run_sync(agent, "Hi", client=model, state_store=store, thread_id=thread_id)

    Runner.continue_sync(agent, "And then?", client=model, state_store=store,
                         thread_id=thread_id, tracing_disabled=True)
    assert model.calls[1] == [
        {"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "reply 1"}, {"role": "user", "content": "And then?"}]
    stored = AgentStateStore(store.client).load_state(thread_id)
    assert stored.revision == 2 and stored.state.agent_name == "analyst"
    assert [m["content"] for m in stored.state.messages] == [
        "Be terse.", "Hi", "reply 1", "And then?", "reply 2"]
    assert recorder.appended == [3, 2], "the continuation sent only its two new messages"


@pytest.mark.slow
def test_saves_larger_than_a_request_go_in_batches(store: AgentStateStore, recorder: Recorder,
                                                   uid: str) -> None:
    thread_id = f"big-{uid}"
    conversation = [{"role": "user" if i % 2 else "assistant", "content": f"m{i}"}
                    for i in range(380)]
    first = store.save_state(thread_id, run_state(conversation[:250]))
    assert first.revision == 3, "100 with the create, 100 appended, 50 with the state"
    second = store.save_state(thread_id, run_state(conversation), revision=first.revision)
    assert second.revision == 5
    assert recorder.appended == [100, 50, 30]
    loaded = AgentStateStore(store.client).load_state(thread_id)
    assert loaded.state.messages == conversation and loaded.revision == 5


@pytest.mark.slow
def test_concurrent_saves_from_one_revision_one_wins(server: ServerProcess, uid: str) -> None:
    thread_id = f"race-{uid}"
    stores = [AgentStateStore(base_url=server.base_url) for _ in range(8)]
    try:
        stores[0].save_state(thread_id, run_state(MESSAGES_SO_FAR[:2]))
        loaded = [store.load_state(thread_id) for store in stores]

        def save(i: int) -> str:
            state = loaded[i].state
            state.messages.append({"role": "user", "content": f"from store {i}"})
            try:
                stores[i].save_state(thread_id, state, revision=loaded[i].revision)
            except StateConflictError:
                return "conflict"
            return "saved"

        with ThreadPoolExecutor(max_workers=8) as pool:
            results = list(pool.map(save, range(8)))
        assert sorted(results) == ["conflict"] * 7 + ["saved"]
        final = stores[0].load_state(thread_id)
        winner = results.index("saved")
        assert final.revision == 2
        assert final.state.messages == [*MESSAGES_SO_FAR[:2],
                                        {"role": "user", "content": f"from store {winner}"}]
    finally:
        for store in stores:
            store.close()


@pytest.mark.slow
def test_an_editing_save_is_all_or_nothing(server: ServerProcess, store: AgentStateStore,
                                           uid: str) -> None:
    """The edit of m0 and the removal of a compaction's summary go in one batch: the refused
    removal takes the edit back with it."""
    from agentstate_client.errors import MessageCompacted

    thread_id = f"atom-{uid}"
    store.save_state(thread_id, run_state([{"role": "user", "content": f"m{i}"}
                                           for i in range(4)]))
    with AgentStateClient(server.base_url) as client:
        ids = [m.id for m in client.iter_messages(thread_id)]
        client.create_compaction(thread_id, ids[2:4], {"role": "assistant", "content": "sum"})
    loaded = store.load_state(thread_id)
    assert [m["content"] for m in loaded.state.messages] == ["m0", "m1", "sum"]
    edited = [{**loaded.state.messages[0], "content": "edited"}]
    with pytest.raises(MessageCompacted):
        store.save_state(thread_id, run_state(edited), revision=loaded.revision)
    fresh = AgentStateStore(base_url=server.base_url)
    again = fresh.load_state(thread_id)
    fresh.close()
    assert [m["content"] for m in again.state.messages] == ["m0", "m1", "sum"]
    assert again.revision == loaded.revision
