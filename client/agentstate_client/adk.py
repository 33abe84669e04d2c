"""Google ADK drop-ins: `AgentStateSessionService` is an ADK `BaseSessionService` on
agentstate, `AgentStateMemoryService` an ADK `BaseMemoryService` on its store.

    from agentstate_client.adk import AgentStateSessionService

    runner = Runner(agent=agent, app_name="desk",
                    session_service=AgentStateSessionService(base_url="http://127.0.0.1:8080"))

How ADK's data is kept (ids through `agentstate_client.ids.join_ids`, like every adapter):
- a session is the thread `join_ids("adk", app_name, user_id, session_id)`; its events are
  its messages, each event stored verbatim as the message's `item` (as ADK's own database
  service serialises it: `model_dump(mode="json", exclude_none=True)`), under the message id
  `encode_id(event.id)` (a different event reusing a stored event's id, which ADK keeps as
  well, under `encode_id(f"{event.id}#{digest}")`, the digest that of its item); its
  session-scoped state is the thread's `state`, its `metadata` says whose session it is and
  its `last_update_time` (the last event's timestamp, as ADK's services keep it);
- `app:` state is the state of the thread `join_ids("adk-app", app_name)`, `user:` state
  that of `join_ids("adk-user", app_name, user_id)`; `temp:` state is never stored.
- State values are stored one-element arrays (`{"step": [3]}`): a merge-patch then replaces
  a value whole and stores `None` as `[null]`, which is ADK's `dict.update` exactly, so a
  state delta is applied in the database without reading the state first.

Every write is one `POST /v1/batch`, all or nothing: `append_event` patches the session's
thread conditionally on its revision (`If-Match`) with the event appended, its state delta
and `last_update_time`, all one revision, then the app's and user's state, in that order
(every batch takes its threads in the same order, so concurrent ones cannot deadlock). The revision travels in the session object
(`Session._storage_update_marker`, where ADK's database service keeps its own), so a write
from a session object that another writer has overtaken raises ADK's `StaleSessionError`
and writes nothing.

Memories (`AgentStateMemoryService`) are store items (API.md 7b), one per event that has text,
under the namespace `("adk-memory", app_name, user_id, "session", session_id)` and the
event's id as key (events added without a session: `(..., user_id, "events")`; entries of
`add_memory`: `(..., user_id, "entries")`), so adding a session again writes the same items
(nothing is duplicated) and a search of `("adk-memory", app_name, user_id)` sees that user's
memories only. The item's `content` is the event's text parts (thoughts left out), which
lexical search reads; with an `embed` function, the embedding of their text (joined by
spaces) is the item's vector `text` in the index `adk-memory-{dims}`. `delete_memory` deletes an id's memories and keeps the id under
`("adk-memory-forgotten", app_name, user_id)`, which every add that has something to write
reads first, so a deleted memory is not added again.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import hashlib
import inspect
import json
import time
import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from agentstate_client._adapters import ITEM_ONLY, OwnsClient, send_once
from agentstate_client._api import OVERWRITE, store_item_body
from agentstate_client._async import AsyncAgentStateClient
from agentstate_client.errors import (
    AlreadyExists,
    MessageExists,
    NotFound,
    PreconditionFailed,
    ThreadDeleted,
)
from agentstate_client.ids import encode_id, join_ids
from agentstate_client.models import Thread

try:
    from google.adk.errors._stale_session_error import StaleSessionError
    from google.adk.errors.already_exists_error import AlreadyExistsError
    from google.adk.errors.session_not_found_error import SessionNotFoundError
    from google.adk.events.event import Event
    from google.adk.memory import _utils as _memory_utils
    from google.adk.memory.base_memory_service import BaseMemoryService, SearchMemoryResponse
    from google.adk.memory.memory_entry import MemoryEntry
    from google.adk.sessions import _session_util
    from google.adk.sessions.base_session_service import (
        BaseSessionService,
        GetSessionConfig,
        ListSessionsResponse,
    )
    from google.adk.sessions.session import Session
    from google.adk.sessions.state import State
    from google.genai import types
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError("agentstate_client.adk needs google-adk: "
                      "pip install 'agentstate-client[adk]'") from exc

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence

    # texts -> one embedding each, in order (a plain or an async function)
    Vectors = dict[str, dict[str, list[float]]]
    Embed = Callable[[list[str]], Sequence[Sequence[float]] | Awaitable[Sequence[Sequence[float]]]]

__all__ = ["AgentStateMemoryService", "AgentStateSessionService"]

PAGE = 1000  # messages per read, the server's maximum


# Cached: every append names its session's, app's and user's threads again.
@functools.lru_cache(maxsize=4096)
def session_thread(app_name: str, user_id: str, session_id: str) -> str:
    return join_ids("adk", app_name, user_id, session_id)


@functools.lru_cache(maxsize=4096)
def app_thread(app_name: str) -> str:
    return join_ids("adk-app", app_name)


@functools.lru_cache(maxsize=4096)
def user_thread(app_name: str, user_id: str) -> str:
    return join_ids("adk-user", app_name, user_id)


class _Stored(BaseModel):
    """A message as this service reads it back: its item, an ADK event."""

    item: Event


class _StoredSession(BaseModel):
    """A thread as `GET /v1/threads?include=messages` lists it, the members a session (or
    an app's or user's state) is built from."""

    thread_id: str
    revision: int
    state: dict[str, Any]
    metadata: dict[str, Any]
    created_at: datetime
    messages: list[_Stored]
    messages_next_cursor: str | None = None


class _EventPage(BaseModel):
    data: list[_Stored]
    next_cursor: str | None = None


class _SessionPage(BaseModel):
    data: list[_StoredSession]


def wrap(state: Mapping[str, Any]) -> dict[str, Any]:
    """ADK state as stored: each value a one-element array (see the module docstring)."""
    return {key: [value] for key, value in state.items()}


def unwrap(stored: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value[0] if isinstance(value, list) and value else None
            for key, value in stored.items()}


def _digest(item: Mapping[str, Any]) -> str:
    """A short digest of a stored event, which names it apart from another with its id."""
    canonical = json.dumps(item, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _message_ids(event_id: str, item: Mapping[str, Any]) -> Iterator[str]:
    """The ids to store an event under, in turn: its own; for a different event that reuses
    an id already taken (ADK keeps both), that id and a digest of the event (computed only
    then)."""
    yield encode_id(event_id)
    yield encode_id(f"{event_id}#{_digest(item)}")


def _revision(result: Mapping[str, Any]) -> int:
    return int(str(result["etag"]).strip('"'))


class AgentStateSessionService(OwnsClient, BaseSessionService):
    """ADK's `BaseSessionService` on an agentstate server (see the module docstring).

    Pass an `AsyncAgentStateClient`, or `base_url`/`api_key` (default: `$AGENTSTATE_URL`,
    `$AGENTSTATE_API_KEY`) for a client the service owns and closes in `close()`.
    """

    def __init__(self, *, base_url: str | None = None, api_key: str | None = None,
                 client: AsyncAgentStateClient | None = None) -> None:
        self._use_client(base_url, api_key, client)
        # App and user threads known to exist, so a create needs no read to make sure.
        self._scopes: set[str] = set()

    # --- scoped state --------------------------------------------------------------------

    async def _ensure(self, thread_id: str) -> None:
        """The app or user thread exists (created empty if not)."""
        if thread_id in self._scopes:
            return
        try:
            await self.client.batch([{
                "op": "thread.put", "thread_id": thread_id, "if_none_match": "*",
                "body": {"state": {}, "metadata": {"adk": "scope"}, "history_limit": 0}}])
        except AlreadyExists:
            pass
        self._scopes.add(thread_id)

    async def _states(self, thread_ids: list[str]) -> list[dict[str, Any]]:
        """The ADK state kept in each of these app or user threads ({} for one that does not
        exist), read 100 threads a request."""
        found: dict[str, dict[str, Any]] = {}
        for start in range(0, len(thread_ids), 100):
            chunk = thread_ids[start:start + 100]
            page = await self.client.list_threads(thread_ids=chunk, limit=len(chunk))
            found.update((thread.thread_id, unwrap(thread.state)) for thread in page.data)
        return [found.get(thread_id, {}) for thread_id in thread_ids]

    def _scope_ops(self, app_name: str, user_id: str,
                   deltas: Mapping[str, dict[str, Any]]) -> list[dict[str, Any]]:
        ops = []
        for scope, thread_id in (("app", app_thread(app_name)),
                                 ("user", user_thread(app_name, user_id))):
            if deltas[scope]:
                ops.append({"op": "thread.patch", "thread_id": thread_id, "if_match": "*",
                            "body": {"state": wrap(deltas[scope])}})
        return ops

    async def _merge(self, app_name: str, user_id: str, session: Session,
                     scopes: tuple[dict[str, Any], dict[str, Any]] | None = None) -> Session:
        """The session with its app's and user's state (read now, unless `scopes` holds them
        read already)."""
        app, user = scopes or await self._states([app_thread(app_name),
                                                  user_thread(app_name, user_id)])
        for key, value in app.items():
            session.state[State.APP_PREFIX + key] = value
        for key, value in user.items():
            session.state[State.USER_PREFIX + key] = value
        return session

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        return (await self._states([user_thread(app_name, user_id)]))[0]

    # --- sessions ------------------------------------------------------------------------

    def _session(self, thread: Thread | _StoredSession, events: list[Event]) -> Session:
        meta = thread.metadata
        session = Session(app_name=meta["app_name"], user_id=meta["user_id"],
                          id=meta["session_id"], state=unwrap(thread.state), events=events,
                          last_update_time=meta.get("last_update_time",
                                                   thread.created_at.timestamp()))
        session._storage_update_marker = str(thread.revision)
        return session

    async def create_session(self, *, app_name: str, user_id: str,
                             state: dict[str, Any] | None = None,
                             session_id: str | None = None) -> Session:
        session_id = (session_id.strip() if session_id else None) or str(uuid.uuid4())
        deltas = _session_util.extract_json_safe_state_delta(state or {})
        await self._ensure(app_thread(app_name))
        await self._ensure(user_thread(app_name, user_id))
        metadata = {"adk": "session", "app_name": app_name, "user_id": user_id,
                    "session_id": session_id, "last_update_time": time.time()}
        try:
            results = await self.client.batch([
                {"op": "thread.put", "thread_id": session_thread(app_name, user_id, session_id),
                 "if_none_match": "*",
                 # The session's state needs no history in agentstate: ADK keeps none.
                 "body": {"state": wrap(deltas["session"]), "metadata": metadata,
                          "history_limit": 0}},
                *self._scope_ops(app_name, user_id, deltas),
            ])
        except AlreadyExists:
            raise AlreadyExistsError(f"Session with id {session_id} already exists.") from None
        thread = Thread.from_json(results[0]["body"])
        return await self._merge(app_name, user_id, self._session(thread, []))

    async def get_session(self, *, app_name: str, user_id: str, session_id: str,
                          config: GetSessionConfig | None = None) -> Session | None:
        thread_id = session_thread(app_name, user_id, session_id.strip())
        recent = config.num_recent_events if config else None
        after = config.after_timestamp if config else None
        if recent is None and after is None:
            return await self._whole_session(app_name, user_id, thread_id)
        # The app's and user's state are read (in one request) alongside the session, not
        # after it: one round trip of latency instead of two (a session that turns out
        # missing wastes a small read).
        scopes = asyncio.ensure_future(self._states([app_thread(app_name),
                                                     user_thread(app_name, user_id)]))
        try:
            thread = await self.client.get_thread(thread_id)
            events = await self._recent(thread_id, recent, after)
        except NotFound:
            await scopes
            return None
        except BaseException:
            scopes.cancel()
            raise
        app, user = await scopes
        return await self._merge(app_name, user_id, self._session(thread, events), (app, user))

    async def _whole_session(self, app_name: str, user_id: str,
                             thread_id: str) -> Session | None:
        """The session with all its events, and its app's and user's state, in one request
        (the three threads, each with its first page of messages) while the session has no
        more than a page of events; each body parsed straight into ADK's events."""
        scopes = app_thread(app_name), user_thread(app_name, user_id)
        listed = _SessionPage.model_validate_json(await self.client.list_threads_json(
            [thread_id, *scopes], include_messages=True, messages_limit=PAGE,
            messages_fields=ITEM_ONLY))
        found = {thread.thread_id: thread for thread in listed.data}
        stored = found.get(thread_id)
        if stored is None:
            return None
        events = [message.item for message in stored.messages]
        cursor = stored.messages_next_cursor
        while cursor is not None:
            page = _EventPage.model_validate_json(await self.client.list_messages_json(
                thread_id, limit=PAGE, cursor=cursor, fields=ITEM_ONLY))
            events.extend(message.item for message in page.data)
            cursor = page.next_cursor
        app, user = (unwrap(found[scope].state) if scope in found else {} for scope in scopes)
        return await self._merge(app_name, user_id, self._session(stored, events), (app, user))

    async def _recent(self, thread_id: str, recent: int | None,
                      after: float | None) -> list[Event]:
        """The newest `recent` events, then those from the last one older than `after` on,
        as ADK's in-memory service filters; read newest first, so the cost is the answer.
        (Event timestamps are the agent's, so this filters on them, not on the server's
        `created_after`.)"""
        if recent == 0:
            return []
        events: list[Event] = []
        async for message in self.client.iter_messages(
                thread_id, order="desc", limit=min(recent or PAGE, PAGE)):
            event = Event.model_validate(message.item)
            if after is not None and event.timestamp < after:
                break
            events.append(event)
            if recent is not None and len(events) == recent:
                break
        return events[::-1]

    async def list_sessions(self, *, app_name: str,
                            user_id: str | None = None) -> ListSessionsResponse:
        metadata: dict[str, Any] = {"adk": "session", "app_name": app_name}
        if user_id is not None:
            metadata["user_id"] = user_id
        threads = [thread async for thread in self.client.iter_threads(
            metadata=metadata, order_by="updated_at", limit=100)]
        users = sorted({t.metadata["user_id"] for t in threads})
        app, *states = await self._states([app_thread(app_name),
                                           *(user_thread(app_name, user) for user in users)])
        by_user = dict(zip(users, states))
        sessions = []
        for thread in threads:
            session = self._session(thread, [])
            session.state.update({State.APP_PREFIX + k: v for k, v in app.items()})
            session.state.update({State.USER_PREFIX + k: v
                                  for k, v in by_user[session.user_id].items()})
            sessions.append(session)
        sessions.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=sessions)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Deletes the session; nothing happens if there is none (as in ADK's services)."""
        try:
            await self.client.delete_thread(
                session_thread(app_name, user_id, session_id.strip()), if_match="*")
        except (NotFound, ThreadDeleted):
            pass
        except PreconditionFailed as exc:
            # `If-Match: *` fails only on a thread that does not exist (never created).
            if exc.current_revision is not None:
                raise

    async def append_event(self, session: Session, event: Event) -> Event:
        if event.partial:
            return event
        # As ADK's own services: temp state reaches the session object, never storage.
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        thread_id = session_thread(session.app_name, session.user_id, session.id)
        delta = event.actions.state_delta if event.actions and event.actions.state_delta else {}
        deltas = _session_util.extract_json_safe_state_delta(delta)
        marker = session._storage_update_marker
        if marker is None:  # a session object this service did not make: take it as current
            try:
                marker = str((await self.client.get_thread(thread_id)).revision)
            except NotFound:
                raise SessionNotFoundError(f"Session {session.id} not found.") from None
        revision = int(marker)
        item = event.model_dump(mode="json", exclude_none=True)
        for message_id in _message_ids(event.id, item):
            try:
                results = await self._send(session, thread_id, message_id, item, revision,
                                           deltas, self._role(event))
            except MessageExists:
                stored = await self.client.get_message(thread_id, message_id)
                if stored.item != item:
                    continue
                # This very event is stored already (a repeated append, or a retry whose
                # first answer was lost): nothing more to write; the session is at the
                # stored revision.
                thread = await self.client.get_thread(thread_id)
                session._storage_update_marker = str(thread.revision)
                return event
            break
        else:  # pragma: no cover - the second name is the event's own digest
            raise AssertionError("two different events with one digest")
        if results is None:  # stored by an attempt whose answer was lost
            marker = str((await self.client.get_thread(thread_id)).revision)
        else:
            marker = str(_revision(results[0]))
        session._storage_update_marker = marker
        session.last_update_time = event.timestamp
        return self._commit_event_to_session(session, event)

    async def _send(self, session: Session, thread_id: str, message_id: str,
                    item: dict[str, Any], revision: int, deltas: Mapping[str, dict[str, Any]],
                    role: str) -> list[dict[str, Any]] | None:
        """The append's one batch (see `append_event`): the results, or None when an attempt
        whose answer was lost stored it. Raises `MessageExists` if `message_id` is taken."""
        # The event, the session's state delta and its `last_update_time` (the event's time,
        # as in ADK's services) are one revision of the session's thread.
        ops = [{"op": "thread.patch", "thread_id": thread_id, "if_match": f'"{revision}"',
                "body": {"state": wrap(deltas["session"]),
                         "metadata": {"last_update_time": item["timestamp"]},
                         "append_messages": [{"id": message_id, "role": role,
                                              "content": None, "item": item}]}},
               *self._scope_ops(session.app_name, session.user_id, deltas)]
        try:
            return await send_once(self.client, ops, thread_id, message_id)
        except (PreconditionFailed, ThreadDeleted, NotFound) as exc:
            current = getattr(exc, "current_revision", None)
            operation = exc.problem.get("operation") if hasattr(exc, "problem") else None
            if operation == 0 and (isinstance(exc, ThreadDeleted | NotFound) or current is None):
                raise SessionNotFoundError(f"Session {session.id} not found.") from None
            if operation == 0:
                raise StaleSessionError(
                    "The session has been modified in storage since it was loaded; reload "
                    "it with get_session and apply the change again.") from None
            if isinstance(exc, PreconditionFailed):
                raise
            # An app or user thread went missing (or was deleted): make them, send again.
            self._scopes.clear()
            await self._ensure(app_thread(session.app_name))
            await self._ensure(user_thread(session.app_name, session.user_id))
            return await send_once(self.client, ops, thread_id, message_id)

    @staticmethod
    def _role(event: Event) -> str:
        """The message role an event is stored under: its content's role, else `event`."""
        role = event.content.role if event.content is not None else None
        return role[:64] if isinstance(role, str) and role and role.isprintable() else "event"


# --- memory ------------------------------------------------------------------------------

MEMORY = "adk-memory"  # the first label of every memory's namespace
FORGOTTEN = "adk-memory-forgotten"  # ... and of the ids delete_memory took away
MEMORY_BATCH = 100  # store operations of one POST /v1/batch
TEXT = ["content.parts[*].text"]  # what lexical search reads of a memory
MAX_QUERY = 4096  # characters of a search's query (the server's limit)
WRITTEN = 65536  # items this service remembers having written (and skips writing again)


def memory_namespace(app_name: str, user_id: str, *rest: str) -> tuple[str, ...]:
    """The namespace of a user's memories in an app (`rest`: where under it)."""
    return (MEMORY, app_name, user_id, *rest)


def forgotten_namespace(app_name: str, user_id: str) -> tuple[str, ...]:
    """Where the ids of a user's deleted memories are kept (each an item, key the id), so
    adding their session again does not bring them back."""
    return (FORGOTTEN, app_name, user_id)


def _memory_content(content: types.Content | None) -> types.Content | None:
    """What of an event's content is remembered: its text parts, thoughts left out (None
    when that leaves no text, as nothing could be found by it)."""
    if content is None or not content.parts:
        return None
    parts = [types.Part(text=part.text) for part in content.parts
             if part.text and not part.thought]
    if not parts or not any(part.text and part.text.strip() for part in parts):
        return None
    return types.Content(role=content.role, parts=parts)


class AgentStateMemoryService(OwnsClient, BaseMemoryService):
    """ADK's `BaseMemoryService` on agentstate's store (see the module docstring).

    `search_memory` ranks a user's memories by full text (the server's; no embeddings at
    all) unless the service has an `embed` function (`texts -> vectors`, plain or async):
    then by similarity (`metric`) of the embedding of the query to each memory's, in the
    vector index `index_name` (default `adk-memory-{dims}`), or both fused with
    `hybrid=True`. At most `max_results` memories (10, as ADK's in-memory service).

    Pass an `AsyncAgentStateClient`, or `base_url`/`api_key` (default: `$AGENTSTATE_URL`,
    `$AGENTSTATE_API_KEY`) for a client the service owns and closes in `close()`.
    """

    def __init__(self, *, base_url: str | None = None, api_key: str | None = None,
                 client: AsyncAgentStateClient | None = None, embed: Embed | None = None,
                 index_name: str | None = None,
                 metric: Literal["cosine", "inner_product", "l2"] = "cosine",
                 hybrid: bool = False, max_results: int = 10) -> None:
        if hybrid and embed is None:
            raise ValueError("hybrid search needs an embed function")
        if max_results < 1:
            raise ValueError("max_results must be positive")
        self._use_client(base_url, api_key, client)
        self._embed, self._index_name, self._metric = embed, index_name, metric
        self._hybrid, self._max_results = hybrid, max_results
        # (namespace, key) -> digest of the body last written there: a session added again
        # sends only what changed.
        self._written: collections.OrderedDict[tuple[tuple[str, ...], str], str] = \
            collections.OrderedDict()

    async def _embeddings(self, texts: list[str]) -> list[list[float]]:
        assert self._embed is not None
        found = self._embed(texts)
        if inspect.isawaitable(found):
            found = await found
        vectors = [[float(x) for x in vector] for vector in found]
        if len(vectors) != len(texts):
            raise ValueError(f"embed returned {len(vectors)} vectors for {len(texts)} texts")
        return vectors

    def _index(self, dims: int) -> str:
        return self._index_name or f"{MEMORY}-{dims}"

    async def _forgotten(self, app_name: str, user_id: str) -> set[str]:
        found: set[str] = set()
        offset = 0
        while True:
            page = await self.client.search_store(forgotten_namespace(app_name, user_id),
                                                  limit=1000, offset=offset)
            found.update(item.key for item in page.data)
            if not page.has_more:
                return found
            offset += len(page.data)

    async def _write(self, app_name: str, user_id: str,
                     items: list[tuple[tuple[str, ...], str, dict[str, Any]]]) -> None:
        """Put each (namespace, key, value) whatever is there (so a repeat is the same item),
        with its text's embedding; items this service wrote already, equal, are skipped, and
        so are deleted memories (read first, when there is anything to write)."""
        pending = []
        for namespace, key, value in items:
            digest = _digest(store_item_body(value, TEXT))
            if self._written.get((namespace, key)) != digest:
                pending.append(((namespace, key), value, digest))
        if pending:
            forgotten = await self._forgotten(app_name, user_id)
            pending = [one for one in pending if one[0][1] not in forgotten]
        if not pending:
            return
        vectors: list[Vectors | None] = [None] * len(pending)
        if self._embed is not None:
            embedded = await self._embeddings([" ".join(part["text"] for part in
                                                         value["content"]["parts"])
                                                for _, value, _ in pending])
            vectors = [{self._index(len(vector)): {"text": vector}} for vector in embedded]
        ops: list[dict[str, Any]] = [
            {"op": "store.put", "namespace": list(namespace), "key": key,
             "if_none_match": OVERWRITE["If-None-Match"],
             "body": store_item_body(value, TEXT, vectors=vector)}
            for ((namespace, key), value, _), vector in zip(pending, vectors, strict=True)]
        digests = [(where, digest) for where, _, digest in pending]
        for start in range(0, len(ops), MEMORY_BATCH):
            await self.client.batch(ops[start:start + MEMORY_BATCH])
            for where, digest in digests[start:start + MEMORY_BATCH]:
                self._written.pop(where, None)
                self._written[where] = digest
                if len(self._written) > WRITTEN:
                    self._written.popitem(last=False)

    @staticmethod
    def _event_items(namespace: tuple[str, ...], events: Sequence[Event],
                     session_id: str | None) -> list[tuple[tuple[str, ...], str,
                                                           dict[str, Any]]]:
        items = []
        for event in events:
            content = _memory_content(event.content)
            if content is None:
                continue
            items.append((namespace, event.id, {
                "content": content.model_dump(mode="json", exclude_none=True),
                "author": event.author, "time": event.timestamp, "memory_id": event.id,
                "event_id": event.id, "session_id": session_id}))
        return items

    async def add_session_to_memory(self, session: Session) -> None:
        """Remember the session's events that have text (again: the same memories)."""
        await self._write(session.app_name, session.user_id, self._event_items(
            memory_namespace(session.app_name, session.user_id, "session", session.id),
            session.events, session.id))

    async def add_events_to_memory(self, *, app_name: str, user_id: str,
                                   events: Sequence[Event], session_id: str | None = None,
                                   custom_metadata: Mapping[str, object] | None = None) -> None:
        """Remember these events (those with text), as part of their session's memories
        when `session_id` is given. `custom_metadata` is not used."""
        rest = ("session", session_id) if session_id else ("events",)
        await self._write(app_name, user_id, self._event_items(
            memory_namespace(app_name, user_id, *rest), events, session_id))

    async def add_memory(self, *, app_name: str, user_id: str,
                         memories: Sequence[MemoryEntry],
                         custom_metadata: Mapping[str, object] | None = None) -> None:
        """Remember these entries, each under its `id` (or, without one, a digest of it: the
        same entry added again is the same memory). `custom_metadata` is not used."""
        items = []
        for entry in memories:
            content = _memory_content(entry.content)
            if content is None:
                continue
            stored = entry.model_copy(update={"content": content}).model_dump(
                mode="json", exclude_none=True)
            key = entry.id or _digest(stored)
            items.append((memory_namespace(app_name, user_id, "entries"), key, {
                "content": stored["content"],
                "author": entry.author, "timestamp": entry.timestamp,
                "custom_metadata": entry.custom_metadata, "memory_id": key}))
        await self._write(app_name, user_id, items)

    async def search_memory(self, *, app_name: str, user_id: str,
                            query: str) -> SearchMemoryResponse:
        """The user's memories best matching `query` (none for a query without words)."""
        if not query or not query.strip():
            return SearchMemoryResponse()
        query = query[:MAX_QUERY]  # preload_memory's query is the user's whole message
        vector = (await self._embeddings([query]))[0] if self._embed is not None else None
        page = await self.client.search_store(
            memory_namespace(app_name, user_id),
            query=query if vector is None or self._hybrid else None, vector=vector,
            vector_index=self._index(len(vector)) if vector is not None else None,
            metric=self._metric, limit=self._max_results)
        return SearchMemoryResponse(memories=[self._entry(item.value) for item in page.data])

    @staticmethod
    def _entry(value: Mapping[str, Any]) -> MemoryEntry:
        if "event_id" not in value:  # an entry of add_memory
            metadata = dict(value.get("custom_metadata") or {})
            timestamp = value.get("timestamp")
        else:  # an event
            metadata = {"event_id": value["event_id"]}
            if value.get("session_id") is not None:
                metadata["session_id"] = value["session_id"]
            when = value.get("time")
            timestamp = _memory_utils.format_timestamp(when) if when is not None else None
        return MemoryEntry(id=value["memory_id"],
                           content=types.Content.model_validate(value["content"]),
                           author=value.get("author"), timestamp=timestamp,
                           custom_metadata=metadata)

    async def delete_memory(self, *, app_name: str, user_id: str,
                            memory_id: str | None = None) -> None:
        """Delete the user's memories of this id (an event's, in every session it was
        added with), and keep the id, so adding the session again does not bring it back
        (as ADK's in-memory service); nothing happens for an id the user has no memory of."""
        if not memory_id:
            return
        while True:  # a batch: the id kept, and up to 99 of its memories deleted
            found = await self.client.search_store(
                memory_namespace(app_name, user_id), filter={"memory_id": memory_id},
                limit=MEMORY_BATCH - 1)
            if not found.data:
                return
            await self.client.batch([
                {"op": "store.put", "namespace": list(forgotten_namespace(app_name, user_id)),
                 "key": memory_id, "if_none_match": OVERWRITE["If-None-Match"],
                 "body": store_item_body({"memory_id": memory_id}, False)},
                *({"op": "store.delete", "namespace": list(item.namespace), "key": item.key,
                   "if_match": "*", "missing_ok": True} for item in found.data)])
            if not found.has_more:
                return
