"""aisuite drop-in: `AgentStateStore` implements aisuite's `StateStore` protocol on agentstate.

    from agentstate_client.aisuite import AgentStateStore

    store = AgentStateStore(base_url="http://127.0.0.1:8080")
    Runner.run_sync(agent, "Hi", state_store=store, thread_id="t-1")

How a `StoredRunState` is kept:
- the thread `thread_id`; `StoredRunState.metadata` is the thread's `metadata`;
- `RunState` without its messages is the thread's `state`;
- `RunState.messages` is the thread's message log (its live view). A save appends only the
  messages beyond those the thread already holds, in the same request and revision as the
  state, so the cost of a save does not grow with the conversation. Message members that
  agentstate has no field for travel in the message's `metadata["aisuite"]`, so every
  message loads back exactly as it was saved.

Revisions are the thread's revisions. A thread saved only through this store reads exactly
like aisuite's stores: revision 1 after the first save, +1 per save; `revision=None`
overwrites and a first save needs none; a `revision` that is not current raises
`StateConflictError`. Writes that others make to the thread (appends, patches) advance the
revision too, so a save from an older revision conflicts instead of losing them. One
deliberate difference: after `delete_state`, the next save continues after the deleted
thread's revision instead of restarting at 1, so a revision read before the delete can never
match the new thread.

The history is append-only: a save whose `messages` has fewer messages than the thread, or
(with `revision=None`) whose messages no longer end like the stored ones (another writer
appended or compacted), is refused instead of losing or duplicating messages. Shorten a
conversation with a compaction (`AgentStateClient.create_compaction`): the next load shows the
summary in place of the compacted run. A save with more than 100 new messages (an imported
conversation) sends the leading ones as conditional appends first, so its revision goes up by
more than one.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from agentstate_client._sync import AgentStateClient
from agentstate_client.errors import AgentStateError, NotFound, PreconditionFailed, ThreadDeleted
from agentstate_client.models import Message, Thread

if TYPE_CHECKING:
    from aisuite.agents.state_store import StoredRunState  # type: ignore[import-untyped]
    from aisuite.agents.types import RunState  # type: ignore[import-untyped]

try:
    from aisuite.agents.state_store import StateConflictError as _AisuiteConflict
except ImportError:  # aisuite is optional; the store itself needs it, the error class not
    class _AisuiteConflict(RuntimeError):  # type: ignore[no-redef]
        """Stands in for aisuite's `StateConflictError` when aisuite is not installed."""

__all__ = ["AgentStateStore", "StateConflictError"]

META_KEY = "aisuite"
# Message members with a field of their own in agentstate (besides role and content).
FIELDS = ("name", "tool_calls", "tool_call_id")
PAGE = 1000
BATCH = 100  # messages per request, the server's default limit


class StateConflictError(_AisuiteConflict, AgentStateError):  # type: ignore[misc]
    """A save lost an optimistic concurrency check; aisuite's `StateConflictError` too."""

    def __init__(self, thread_id: str, expected: int | None, current: int | None,
                 detail: str | None = None) -> None:
        self.thread_id = thread_id
        self.expected_revision = expected
        self.current_revision = current
        super().__init__(detail or f"State revision conflict for {thread_id!r}: "
                                   f"expected {expected}, found {current}.")


def to_log_message(message: dict[str, Any]) -> dict[str, Any]:
    """An aisuite message as an agentstate message; what has no field goes in metadata."""
    stored: dict[str, Any] = {"role": message.get("role"), "content": message.get("content")}
    extra: dict[str, Any] = {}
    for key, value in message.items():
        if key in FIELDS and value is not None:
            stored[key] = value
        elif key not in ("role", "content"):
            extra[key] = value
    kept: dict[str, Any] = {}
    if extra:
        kept["fields"] = extra
    if "content" not in message:
        kept["no_content"] = True
    if kept:
        stored["metadata"] = {META_KEY: kept}
    return stored


def from_log_message(message: Message) -> dict[str, Any]:
    """The aisuite message `to_log_message` stored."""
    kept = message.metadata.get(META_KEY, {})
    restored: dict[str, Any] = {"role": message.role}
    if not kept.get("no_content"):
        restored["content"] = message.content
    for key in FIELDS:
        if getattr(message, key) is not None:
            restored[key] = getattr(message, key)
    restored.update(kept.get("fields", {}))
    return restored


def _aisuite() -> tuple[type[RunState], type[StoredRunState]]:
    try:
        from aisuite.agents.state_store import StoredRunState
        from aisuite.agents.types import RunState
    except ImportError as exc:
        raise ImportError("AgentStateStore needs aisuite: pip install aisuite") from exc
    return RunState, StoredRunState


class AgentStateStore:
    """aisuite `StateStore` on an agentstate server (see the module docstring).

    Pass an `AgentStateClient`, or `base_url`/`api_key` (default: `$AGENTSTATE_URL`,
    `$AGENTSTATE_API_KEY`) for a client the store owns and closes in `close()`.
    `max_attempts` bounds how often a `revision=None` save re-reads a thread that changed
    under it.
    """

    def __init__(self, client: AgentStateClient | None = None, *, base_url: str | None = None,
                 api_key: str | None = None, max_attempts: int = 5) -> None:
        self._run_state, self._stored_run_state = _aisuite()
        self._owns_client = client is None
        self.client = client or AgentStateClient(base_url, api_key=api_key)
        self.max_attempts = max_attempts
        # thread_id -> (revision, live message count) as this store last saw them. The count
        # is only trusted under If-Match on that revision, which proves nobody changed it.
        self._known: dict[str, tuple[int, int]] = {}

    def close(self) -> None:
        """Close the client if the store created it."""
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> AgentStateStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def save_state(self, thread_id: str, state: RunState, *, revision: int | None = None,
                   metadata: dict[str, Any] | None = None) -> StoredRunState:
        """Save `state` as the thread's new revision.

        `revision=None` overwrites whatever is there (a first save needs no revision); an int
        must be the current revision, else `StateConflictError`. `metadata=None` keeps the
        stored metadata. Only messages the thread does not hold yet are sent.
        """
        # RunState.to_dict() deep-copies every message; a save must cost the same at turn
        # 400 as at turn 1, so only the state without its messages is copied.
        payload = dataclasses.replace(state, messages=[]).to_dict()
        del payload["messages"]
        messages = state.messages
        for attempt in range(self.max_attempts):
            known = self._known.get(thread_id)
            if revision is not None and (known is None or known[0] != revision):
                known = self._refresh(thread_id, messages, verify=False)
                if known is None or known[0] != revision:
                    raise StateConflictError(thread_id, revision, known[0] if known else None)
            elif known is None and attempt > 0:
                # An overwrite of a thread this store has not seen starts as a create (one
                # request for a first save); only when that finds a thread is it read.
                known = self._refresh(thread_id, messages, verify=True)
            try:
                thread = self._put(thread_id, payload, messages, metadata, known)
            except (PreconditionFailed, ThreadDeleted) as exc:
                self._known.pop(thread_id, None)
                if revision is not None:
                    current = getattr(exc, "current_revision", None)
                    raise StateConflictError(thread_id, revision, current) from exc
                continue
            self._known[thread_id] = (thread.revision, thread.message_count)
            # A copy of the state, except that its messages are the caller's message objects
            # (copying every message on every save is what made saves grow with the thread).
            saved = self._run_state.from_dict(payload)
            saved.messages = list(messages)
            return self._stored(thread, saved)
        raise StateConflictError(
            thread_id, revision, None,
            f"Thread {thread_id!r} kept changing; gave up after {self.max_attempts} attempts.")

    def load_state(self, thread_id: str) -> StoredRunState | None:
        """The thread's state with its live messages, or None if there is no such thread."""
        for _ in range(self.max_attempts):
            try:
                thread = self.client.get_thread(thread_id, include_messages=True,
                                                messages_limit=PAGE)
            except NotFound:
                self._known.pop(thread_id, None)
                return None
            messages = list(thread.messages or [])
            cursor = thread.messages_next_cursor
            while cursor is not None and len(messages) < thread.message_count:
                page = self.client.list_messages(thread_id, limit=PAGE, cursor=cursor)
                messages.extend(page.data)
                cursor = page.next_cursor
            # Later pages are separate reads: keep them only if the thread did not change.
            if thread.messages_next_cursor is not None and (
                    self.client.get_thread(thread_id).revision != thread.revision):
                continue
            self._known[thread_id] = (thread.revision, thread.message_count)
            run_state = self._run_state.from_dict({
                **thread.state,
                "messages": [from_log_message(m) for m in messages],
            })
            return self._stored(thread, run_state)
        raise StateConflictError(
            thread_id, None, None,
            f"Thread {thread_id!r} kept changing while loading; gave up.")

    def delete_state(self, thread_id: str) -> None:
        """Delete the thread with its messages; nothing happens if it does not exist."""
        self._known.pop(thread_id, None)
        try:
            self.client.delete_thread(thread_id, if_match="*")
        except (NotFound, ThreadDeleted):
            pass

    def _refresh(self, thread_id: str, messages: list[dict[str, Any]],
                 verify: bool) -> tuple[int, int] | None:
        """(revision, live message count) from the server; None if there is no thread.

        With `verify`, the last stored message must be the one at the same place in
        `messages`: an overwrite then appends exactly the messages after it.
        """
        try:
            thread = self.client.get_thread(thread_id)
        except NotFound:
            return None
        count = thread.message_count
        if verify and count:
            last = self.client.list_messages(thread_id, order="desc", limit=1).data
            if count > len(messages) or not last or (
                    from_log_message(last[0]) != messages[count - 1]):
                raise StateConflictError(
                    thread_id, None, thread.revision,
                    f"Thread {thread_id!r} holds {count} messages that state.messages does "
                    "not continue (another writer appended or compacted); load_state and "
                    "apply your change to what it returns.")
        return thread.revision, count

    def _put(self, thread_id: str, payload: dict[str, Any], messages: list[dict[str, Any]],
             metadata: dict[str, Any] | None, known: tuple[int, int] | None) -> Thread:
        """One PUT: the state and the new messages in one revision. More new messages than
        a request may carry go ahead as conditional appends (a revision each)."""
        count = known[1] if known is not None else 0
        if count > len(messages):
            raise ValueError(
                f"state.messages has {len(messages)} messages but thread {thread_id!r} holds "
                f"{count}: agentstate keeps the history append-only. To shorten it, compact "
                "(AgentStateClient.create_compaction) and load_state again.")
        new = [to_log_message(m) for m in messages[count:]]
        chunks = [new[i:i + BATCH] for i in range(0, len(new), BATCH)] or [[]]
        if known is None:
            thread = self.client.put_thread(thread_id, payload, metadata=metadata,
                                            create_only=True, append_messages=chunks.pop(0))
            if not chunks:
                return thread
            revision = thread.revision
        else:
            revision = known[0]
        for chunk in chunks[:-1]:
            revision = self.client.append_messages(thread_id, chunk,
                                                   if_match=revision).thread_revision
        return self.client.put_thread(thread_id, payload, metadata=metadata, if_match=revision,
                                      append_messages=chunks[-1])

    def _stored(self, thread: Thread, state: RunState) -> StoredRunState:
        return self._stored_run_state(
            thread_id=thread.thread_id, state=state, revision=thread.revision,
            created_at=thread.created_at.isoformat(), updated_at=thread.updated_at.isoformat(),
            metadata=thread.metadata,
        )
