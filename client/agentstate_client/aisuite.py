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

The stored log follows `state.messages` as aisuite's own stores do: a save appends what is
new, redacts in place an earlier message whose content or extra members changed (the old
text is gone from the server, not hidden), and removes messages the state no longer has (a
trimmed history), re-appending from the first message whose role or tool fields changed.
`revision=None` overwrites whatever is stored, messages others appended included, as in
aisuite. A save that only appends is one request and one revision; one that edits or trims
is one `POST /v1/batch` (all of it or nothing) that takes a revision per operation, and a first
save with more than 100 messages (an imported conversation) sends the leading ones ahead as
conditional appends. A message
under a live compaction (its summary shows in `load_state`) cannot be edited or dropped:
revert the compaction first (`MessageCompacted`). The store keeps a copy of each thread's
messages as it last saved or loaded them, to see what changed.
"""

from __future__ import annotations

import copy
import dataclasses
import uuid
from dataclasses import dataclass
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
REMOVE = 1000  # messages per removal request, the server's limit
# What a redaction may change; a difference anywhere else re-appends from that message.
REDACTABLE = ("content", "metadata")


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


@dataclass
class _Log:
    """A thread as this store last saw it: its revision, and the ids and (copies of the)
    aisuite messages of its live view."""

    revision: int
    ids: list[str]
    messages: list[dict[str, Any]]


def _new_ids(count: int) -> list[str]:
    # Chosen here, so a save knows the ids of what it stored without reading them back.
    return [f"ais-{uuid.uuid4().hex}" for _ in range(count)]


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
        # thread_id -> the log as this store last saw it. It is only trusted under If-Match
        # on its revision, which proves nobody changed the thread since.
        self._known: dict[str, _Log] = {}

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
        stored metadata. Only the messages that changed are sent.
        """
        # RunState.to_dict() deep-copies every message; only the state without its messages
        # is copied here.
        payload = dataclasses.replace(state, messages=[]).to_dict()
        del payload["messages"]
        messages = state.messages
        for attempt in range(self.max_attempts):
            known = self._known.get(thread_id)
            if revision is not None and (known is None or known.revision != revision):
                known = self._read(thread_id)
                if known is None or known.revision != revision:
                    raise StateConflictError(thread_id, revision,
                                             known.revision if known else None)
            elif known is None and attempt > 0:
                # An overwrite of a thread this store has not seen starts as a create (one
                # request for a first save); only when that finds a thread is it read.
                known = self._read(thread_id)
            try:
                thread, log = self._write(thread_id, payload, messages, metadata, known)
            except (PreconditionFailed, ThreadDeleted) as exc:
                self._known.pop(thread_id, None)
                if revision is not None:
                    current = getattr(exc, "current_revision", None)
                    raise StateConflictError(thread_id, revision, current) from exc
                continue
            self._known[thread_id] = log
            # A copy of the state, except that its messages are the caller's message objects.
            saved = self._run_state.from_dict(payload)
            saved.messages = list(messages)
            return self._stored(thread, saved)
        raise StateConflictError(
            thread_id, revision, None,
            f"Thread {thread_id!r} kept changing; gave up after {self.max_attempts} attempts.")

    def load_state(self, thread_id: str) -> StoredRunState | None:
        """The thread's state with its live messages, or None if there is no such thread."""
        found = self._load(thread_id)
        if found is None:
            return None
        thread, log = found
        run_state = self._run_state.from_dict({**thread.state,
                                               "messages": copy.deepcopy(log.messages)})
        return self._stored(thread, run_state)

    def delete_state(self, thread_id: str) -> None:
        """Delete the thread with its messages; nothing happens if it does not exist."""
        self._known.pop(thread_id, None)
        try:
            self.client.delete_thread(thread_id, if_match="*")
        except (NotFound, ThreadDeleted):
            pass
        except PreconditionFailed as exc:
            # `If-Match: *` fails only on a thread that does not exist (never created).
            if exc.current_revision is not None:
                raise

    def _load(self, thread_id: str) -> tuple[Thread, _Log] | None:
        """The thread and its whole live view, read consistently; None if there is none."""
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
            log = _Log(thread.revision, [m.id for m in messages],
                       [from_log_message(m) for m in messages])
            self._known[thread_id] = _Log(log.revision, log.ids, copy.deepcopy(log.messages))
            return thread, log
        raise StateConflictError(
            thread_id, None, None,
            f"Thread {thread_id!r} kept changing while loading; gave up.")

    def _read(self, thread_id: str) -> _Log | None:
        found = self._load(thread_id)
        return self._known[thread_id] if found is not None else None

    def _write(self, thread_id: str, payload: dict[str, Any], messages: list[dict[str, Any]],
               metadata: dict[str, Any] | None, known: _Log | None) -> tuple[Thread, _Log]:
        """Make the thread's log equal `messages` and store the state. A save that only
        appends is one PUT; one that also edits or removes messages is one `POST /v1/batch`,
        all or nothing, each operation conditional on the revision the one before made."""
        if known is None:
            return self._create(thread_id, payload, messages, metadata)
        tail, redact = self._diff(known.messages, messages)
        ids = _new_ids(len(messages) - tail)
        new = [{**to_log_message(m), "id": i} for m, i in zip(messages[tail:], ids)]
        chunks = [new[i:i + BATCH] for i in range(0, len(new), BATCH)] or [[]]
        gone = known.ids[tail:]
        revision = known.revision
        state: dict[str, Any] = {"state": payload}
        if metadata is not None:
            state["metadata"] = metadata
        if not redact and not gone:
            for chunk in chunks[:-1]:
                revision = self.client.append_messages(thread_id, chunk,
                                                       if_match=revision).thread_revision
            thread = self.client.put_thread(thread_id, payload, metadata=metadata,
                                            if_match=revision, append_messages=chunks[-1])
        else:
            ops: list[dict[str, Any]] = []
            for i, values in redact:
                ops.append({"op": "messages.redact", "thread_id": thread_id,
                            "message_id": known.ids[i], "body": values})
            ops += [{"op": "messages.remove", "thread_id": thread_id,
                     "body": {"ids": gone[start:start + REMOVE]}}
                    for start in range(0, len(gone), REMOVE)]
            ops += [{"op": "messages.append", "thread_id": thread_id,
                     "body": {"messages": chunk}} for chunk in chunks[:-1]]
            ops.append({"op": "thread.put", "thread_id": thread_id,
                        "body": {**state, "append_messages": chunks[-1]} if chunks[-1]
                        else state})
            for offset, op in enumerate(ops):  # each operation makes exactly one revision
                op["if_match"] = f'"{revision + offset}"'
            thread = Thread.from_json(self.client.batch(ops)[-1]["body"])
        kept = list(known.messages[:tail])
        for i, _ in redact:
            kept[i] = copy.deepcopy(messages[i])
        log = _Log(thread.revision, known.ids[:tail] + ids,
                   kept + [copy.deepcopy(m) for m in messages[tail:]])
        return thread, log

    def _create(self, thread_id: str, payload: dict[str, Any], messages: list[dict[str, Any]],
                metadata: dict[str, Any] | None) -> tuple[Thread, _Log]:
        """A first save: create-only, with more than a request's messages as conditional
        appends before the last PUT."""
        ids = _new_ids(len(messages))
        new = [{**to_log_message(m), "id": i} for m, i in zip(messages, ids)]
        chunks = [new[i:i + BATCH] for i in range(0, len(new), BATCH)] or [[]]
        thread = self.client.put_thread(thread_id, payload, metadata=metadata,
                                        create_only=True, append_messages=chunks.pop(0))
        revision = thread.revision
        for chunk in chunks[:-1]:
            revision = self.client.append_messages(thread_id, chunk,
                                                   if_match=revision).thread_revision
        if chunks:
            thread = self.client.put_thread(thread_id, payload, metadata=metadata,
                                            if_match=revision, append_messages=chunks[-1])
        return thread, _Log(thread.revision, ids, [copy.deepcopy(m) for m in messages])

    @staticmethod
    def _diff(stored: list[dict[str, Any]], messages: list[dict[str, Any]]
              ) -> tuple[int, list[tuple[int, dict[str, Any]]]]:
        """How many of `messages` the stored log keeps (from there on it is replaced), and
        the kept ones to redact with the members that changed."""
        common = min(len(stored), len(messages))
        redact: list[tuple[int, dict[str, Any]]] = []
        for i in range(common):
            if stored[i] == messages[i]:
                continue
            old, new = to_log_message(stored[i]), to_log_message(messages[i])
            rest = [{k: v for k, v in m.items() if k not in REDACTABLE} for m in (old, new)]
            if rest[0] != rest[1]:
                return i, redact  # a different role or tool fields: re-append from here
            redact.append((i, {k: new.get(k, {} if k == "metadata" else None)
                               for k in REDACTABLE if old.get(k) != new.get(k)}))
        return common, redact

    def _stored(self, thread: Thread, state: RunState) -> StoredRunState:
        return self._stored_run_state(
            thread_id=thread.thread_id, state=state, revision=thread.revision,
            created_at=thread.created_at.isoformat(), updated_at=thread.updated_at.isoformat(),
            metadata=thread.metadata,
        )
