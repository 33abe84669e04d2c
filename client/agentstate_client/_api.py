"""Every API call, written once; `AgentStateClient` runs them blocking and
`AsyncAgentStateClient` awaits them (see `_core.operation`)."""

from __future__ import annotations

import copy
import json
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, TypeVar

import httpx

from agentstate_client._core import (
    Core,
    Op,
    Request,
    RetryPolicy,
    Sleep,
    drop_none,
    if_match_header,
    operation,
    paginated,
    segment,
)
from agentstate_client.errors import NotFound, PreconditionFailed
from agentstate_client.ids import encode_id
from agentstate_client.models import (
    AgentState,
    AppendResult,
    Compaction,
    Event,
    JsonObject,
    M,
    McpServer,
    Message,
    Page,
    RemoveResult,
    StoreItem,
    Thread,
    ThreadRevision,
)

DEFAULT_URL = "http://127.0.0.1:8080"
MERGE_PATCH = "application/merge-patch+json"
R = TypeVar("R")
StateFn = Callable[[JsonObject], JsonObject | None]
ETagValue = int | str


def _conditions(if_match: ETagValue | None, create_only: bool = False) -> dict[str, str]:
    if if_match is not None and create_only:
        raise ValueError("if_match and create_only exclude each other")
    if create_only:
        return {"If-None-Match": "*"}
    return {} if if_match is None else {"If-Match": if_match_header(if_match)}


def _idempotency(key: str | None) -> dict[str, str]:
    # Generated once per call, so every retry of this call carries the same key.
    return {"Idempotency-Key": key or str(uuid.uuid4())}


def _page(model: type[M], body: dict[str, Any]) -> Page[M]:
    return Page(data=[model.from_json(item) for item in body["data"]],
                next_cursor=body.get("next_cursor"), has_more=bool(body.get("has_more")))


def _timestamp(value: datetime | str | None) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else value


def _thread_path(thread_id: str) -> str:
    return f"/v1/threads/{segment(thread_id)}"


def _agent_state_path(thread_id: str, agent_name: str) -> str:
    return f"{_thread_path(thread_id)}/agents/{segment(agent_name)}/state"


# If-None-Match naming an ETag no revision has (revisions start at 1): a write that holds
# whether or not the item exists, for upserts (API.md 7b).
OVERWRITE = {"If-None-Match": '"0"'}


def store_path(namespace: Sequence[str], key: str) -> str:
    """`/v1/store/items/{labels}/{key}`, each label and the key encoded as `encode_id`
    writes them (ValueError for an empty one, as the server would refuse it)."""
    if isinstance(namespace, str):
        raise TypeError("namespace is a sequence of labels, not a string")
    return "/v1/store/items/" + "/".join(map(encode_id, [*namespace, key]))


def store_item_body(value: JsonObject, index: Sequence[str] | Literal[False] | None = None,
                    ttl_seconds: float | None = None,
                    vectors: Mapping[str, Mapping[str, Sequence[float]]] | None = None
                    ) -> JsonObject:
    """The body of a store item's PUT (and of a batch's `store.put`)."""
    return drop_none(value=value, index=index if index is False or index is None
                     else list(index), ttl_seconds=ttl_seconds,
                     vectors={name: {field: list(v) for field, v in fields.items()}
                              for name, fields in vectors.items()} if vectors else None)


def store_search_body(namespace_prefix: Sequence[str], *, filter: JsonObject | None = None,
                      query: str | None = None, vector: Sequence[float] | None = None,
                      vector_index: str | None = None, metric: str = "cosine",
                      limit: int = 10, offset: int = 0, refresh_ttl: bool = False) -> JsonObject:
    if (vector is None) != (vector_index is None):
        raise ValueError("vector and vector_index go together")
    return drop_none(
        namespace_prefix=list(namespace_prefix), filter=filter, query=query,
        vector={"index": vector_index, "embedding": list(vector), "metric": metric}
        if vector is not None else None,
        limit=limit, offset=offset, refresh_ttl=refresh_ttl or None)


def store_namespaces_body(*, prefix: Sequence[str] | None = None,
                          suffix: Sequence[str] | None = None, max_depth: int | None = None,
                          limit: int = 100, offset: int = 0) -> JsonObject:
    return drop_none(prefix=list(prefix) if prefix is not None else None,
                     suffix=list(suffix) if suffix is not None else None,
                     max_depth=max_depth, limit=limit, offset=offset)


def _apply(fn: StateFn, state: JsonObject) -> JsonObject:
    working = copy.deepcopy(state)
    result = fn(working)
    return working if result is None else result


class _Api:
    """The API methods shared by both clients."""

    _core: Core

    def _configure(self, base_url: str | None, api_key: str | None,
                   timeout: float | httpx.Timeout, max_retries: int, backoff: float,
                   headers: dict[str, str] | None, own_http: bool, own_transport: bool) -> None:
        if not own_http and own_transport:
            raise ValueError("pass http_client or transport, not both")
        # The environment is read when a client is built, never at import time.
        self._core = Core(
            base_url or os.environ.get("AGENTSTATE_URL") or DEFAULT_URL,
            api_key=api_key if api_key is not None else os.environ.get("AGENTSTATE_API_KEY"),
            timeout=timeout, retry=RetryPolicy(max_retries=max_retries, initial_delay=backoff),
            headers=headers,
        )

    @property
    def base_url(self) -> str:
        """The service's base URL (without `/v1`)."""
        return self._core.base_url

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._core.base_url}>"

    def _read_modify_write(self, read: Callable[[], Op[Any]],
                           write: Callable[[JsonObject, int | None], Op[R]],
                           fn: StateFn, create: bool, max_attempts: int) -> Op[R]:
        """GET, apply `fn`, write with If-Match (or create-only when missing and `create`);
        on 412 read again, up to `max_attempts` times, with backoff between attempts."""
        for attempt in range(max_attempts):
            try:
                current = yield from read()
            except NotFound:
                if not create:
                    raise
                current = None
            state = _apply(fn, current.state if current is not None else {})
            try:
                return (yield from write(state, current.revision if current else None))
            except PreconditionFailed:
                if attempt + 1 == max_attempts:
                    raise
            yield Sleep(self._core.retry.delay(attempt) / 4)
        raise ValueError("max_attempts must be at least 1")

    # Threads -----------------------------------------------------------------------------

    @operation
    def create_thread(self, thread_id: str | None = None, *, state: JsonObject | None = None,
                      metadata: JsonObject | None = None, history_limit: int | None = None,
                      ttl_seconds: int | None = None) -> Op[Thread]:
        """Create a thread (`POST /v1/threads`); omit `thread_id` for a server-made `thr_...` id.
        `history_limit`: revisions of state history kept (default: the server's setting);
        `ttl_seconds`: deleted that long after its last write (default: never).

        Raises `ThreadExists` if a live thread has that id.
        """
        body = drop_none(thread_id=thread_id, state=state, metadata=metadata,
                         history_limit=history_limit, ttl_seconds=ttl_seconds)
        return Thread.from_json((yield from self._core.json(Request("POST", "/v1/threads",
                                                                    json=body))))

    @operation
    def get_thread(self, thread_id: str, *, include_messages: bool = False,
                   messages_limit: int | None = None) -> Op[Thread]:
        """Fetch a thread. With `include_messages`, `thread.messages` holds the first page
        (up to `messages_limit`, default 100, max 1000) of the live view and
        `thread.messages_next_cursor` continues it in `list_messages`.

        Raises `NotFound` (also for deleted threads).
        """
        params = drop_none(include="messages" if include_messages else None,
                           messages_limit=messages_limit)
        return Thread.from_json((yield from self._core.json(
            Request("GET", _thread_path(thread_id), params=params))))

    @operation
    def list_threads(self, *, metadata: JsonObject | None = None,
                     updated_after: datetime | str | None = None, limit: int | None = None,
                     cursor: str | None = None,
                     order_by: Literal["created_at", "updated_at"] | None = None,
                     thread_ids: Sequence[str] | None = None, include_messages: bool = False,
                     messages_limit: int | None = None,
                     forked_from: str | None = None) -> Op[Page[Thread]]:
        """One page of threads, newest first by creation (or by last change, with
        `order_by="updated_at"`); `metadata` filters by JSON containment, `thread_ids` (up
        to 100) reads those threads in one request (the ones that exist), `forked_from`
        lists the forks made from that thread (`Thread.forked_from`). With
        `include_messages`, each thread holds its first messages as `get_thread` gives them."""
        if thread_ids is not None and not thread_ids:
            return Page(data=[], next_cursor=None, has_more=False)
        params = drop_none(metadata=json.dumps(metadata) if metadata is not None else None,
                           updated_after=_timestamp(updated_after), limit=limit, cursor=cursor,
                           order_by=order_by,
                           thread_id=list(thread_ids) if thread_ids is not None else None,
                           include="messages" if include_messages else None,
                           messages_limit=messages_limit, forked_from=forked_from)
        return _page(Thread, (yield from self._core.json(Request("GET", "/v1/threads",
                                                                 params=params))))

    iter_threads = paginated(list_threads)

    @operation
    def list_threads_json(self, thread_ids: Sequence[str], *, include_messages: bool = False,
                          messages_limit: int | None = None,
                          messages_fields: Sequence[str] | None = None) -> Op[bytes]:
        """`list_threads(thread_ids=...)`'s page as the JSON the server sent, for an adapter
        that parses it straight into its framework's models (one pass, no `Thread`); with
        `messages_fields`, the server sends only those members of each message."""
        response = yield from self._core.call(Request("GET", "/v1/threads", params=drop_none(
            thread_id=list(thread_ids), limit=len(thread_ids),
            include="messages" if include_messages else None, messages_limit=messages_limit,
            messages_fields=None if messages_fields is None else ",".join(messages_fields))))
        return response.content

    @operation
    def put_thread(self, thread_id: str, state: JsonObject, *,
                   metadata: JsonObject | None = None,
                   append_messages: Sequence[Mapping[str, Any]] | None = None,
                   if_match: ETagValue | None = None, create_only: bool = False,
                   history_limit: int | None = None,
                   ttl_seconds: int | None = None) -> Op[Thread]:
        """Create or replace a thread's state (`PUT`). Omitted `metadata`, `history_limit` and
        `ttl_seconds` are kept. `append_messages` are appended in the same transaction and
        revision.

        Replacing an existing thread needs `if_match` (a revision, an ETag or `"*"`);
        `create_only=True` sends `If-None-Match: *`. Raises `RevisionMismatch` /
        `AlreadyExists` (412, with `current_revision`), `PreconditionRequired` (428),
        `ThreadDeleted` (410).
        """
        body = drop_none(state=state, metadata=metadata, history_limit=history_limit,
                         ttl_seconds=ttl_seconds,
                         append_messages=list(append_messages) if append_messages else None)
        return Thread.from_json((yield from self._core.json(Request(
            "PUT", _thread_path(thread_id), json=body,
            headers=_conditions(if_match, create_only)))))

    @operation
    def patch_thread(self, thread_id: str, *, state: JsonObject | None = None,
                     metadata: JsonObject | None = None,
                     append_messages: Sequence[Mapping[str, Any]] | None = None,
                     if_match: ETagValue | None = None, history_limit: int | None = None,
                     ttl_seconds: int | None = None) -> Op[Thread]:
        """Merge-patch (RFC 7396) a thread's `state` and/or `metadata`: members set to
        `None` are removed, objects merge. `history_limit` and `ttl_seconds` replace the
        stored ones when given. `append_messages` are appended in the same transaction and
        revision. Precondition rules as `put_thread`."""
        body = drop_none(state=state, metadata=metadata, history_limit=history_limit,
                         ttl_seconds=ttl_seconds,
                         append_messages=list(append_messages) if append_messages else None)
        return Thread.from_json((yield from self._core.json(Request(
            "PATCH", _thread_path(thread_id), json=body, headers=_conditions(if_match),
            content_type=MERGE_PATCH))))

    @operation
    def delete_thread(self, thread_id: str, *, if_match: ETagValue | None = None) -> Op[None]:
        """Delete a thread with its messages, compactions and agent states. The id is
        tombstoned: later writes get `ThreadDeleted` until an explicit create."""
        yield from self._core.call(Request("DELETE", _thread_path(thread_id),
                                           headers=_conditions(if_match)))

    @operation
    def update_thread(self, thread_id: str, fn: StateFn, *, create: bool = False,
                      max_attempts: int = 10) -> Op[Thread]:
        """Optimistic read-modify-write of a thread's state.

        `fn` gets a copy of the current state and returns the new one (or changes it in place
        and returns None). The write carries `If-Match`; when another writer got there first
        (412) the thread is read again and `fn` applied again, up to `max_attempts` times, so
        `fn` must be safe to call more than once. A missing thread raises `NotFound`, unless
        `create`: then `fn` gets `{}` and the thread is created (create-only).
        """
        return (yield from self._read_modify_write(
            lambda: _Api.get_thread.steps(self, thread_id),
            lambda state, revision: _Api.put_thread.steps(
                self, thread_id, state, if_match=revision, create_only=revision is None),
            fn, create, max_attempts))

    # Messages ----------------------------------------------------------------------------

    @operation
    def append_messages(self, thread_id: str, messages: Sequence[Mapping[str, Any]], *,
                        if_match: ETagValue | None = None,
                        idempotency_key: str | None = None) -> Op[AppendResult]:
        """Append messages (`{"role", "content", "item"?, "name"?, "tool_calls"?,
        "tool_call_id"?, "agent_name"?, "metadata"?, "id"?}`) in order, creating the thread if
        needed. `role` is any short name; `item` any JSON value, kept verbatim.

        Always sends an `Idempotency-Key` (yours, or a fresh one kept across retries), so a
        retry after a lost response never stores the messages twice. `if_match` makes the
        append conditional on the thread's revision.
        """
        body = {"messages": [dict(message) for message in messages]}
        return AppendResult.from_json((yield from self._core.json(Request(
            "POST", f"{_thread_path(thread_id)}/messages", json=body,
            headers={**_conditions(if_match), **_idempotency(idempotency_key)}))))

    @operation
    def append_message(self, thread_id: str, role: str, content: str | list[Any] | None, *,
                       agent_name: str | None = None, metadata: JsonObject | None = None,
                       name: str | None = None, tool_calls: list[Any] | None = None,
                       tool_call_id: str | None = None, id: str | None = None,
                       item: Any = None, if_match: ETagValue | None = None,
                       idempotency_key: str | None = None) -> Op[Message]:
        """Append one message and return it as stored (with `id`, `seq`, `created_at`).
        `item` is any JSON value, kept verbatim (a framework's own record).
        Retries and idempotency as `append_messages`."""
        message = {"role": role, "content": content, **drop_none(
            agent_name=agent_name, metadata=metadata, name=name, tool_calls=tool_calls,
            tool_call_id=tool_call_id, id=id, item=item)}
        result = yield from _Api.append_messages.steps(
            self, thread_id, [message], if_match=if_match, idempotency_key=idempotency_key)
        return result.data[0]

    @operation
    def list_messages(self, thread_id: str, *, view: Literal["live", "full"] | None = None,
                      order: Literal["asc", "desc"] | None = None,
                      after_seq: int | None = None, before_seq: int | None = None,
                      agent_name: str | None = None, role: str | None = None,
                      limit: int | None = None, cursor: str | None = None,
                      created_after: datetime | str | None = None) -> Op[Page[Message]]:
        """One page of a thread's messages in order (`limit` up to 1000). `view="full"` also
        shows compacted messages and reverted summaries; `created_after` keeps those stored
        after that time."""
        params = drop_none(view=view, order=order, after_seq=after_seq, before_seq=before_seq,
                           agent_name=agent_name, role=role, limit=limit, cursor=cursor,
                           created_after=_timestamp(created_after))
        return _page(Message, (yield from self._core.json(Request(
            "GET", f"{_thread_path(thread_id)}/messages", params=params))))

    iter_messages = paginated(list_messages)

    @operation
    def list_messages_json(self, thread_id: str, *, order: Literal["asc", "desc"] | None = None,
                           limit: int | None = None, cursor: str | None = None,
                           fields: Sequence[str] | None = None) -> Op[bytes]:
        """`list_messages`' page as the JSON the server sent, for an adapter that keeps only
        some fields of each message (no `Message` per message); with `fields`, the server
        sends only those members of each message (`["item"]`: the items alone)."""
        response = yield from self._core.call(Request(
            "GET", f"{_thread_path(thread_id)}/messages",
            params=drop_none(order=order, limit=limit, cursor=cursor,
                             fields=None if fields is None else ",".join(fields))))
        return response.content

    @operation
    def remove_messages(self, thread_id: str, *, ids: Sequence[str] | None = None,
                        last: int | None = None, after_seq: int | None = None,
                        before_seq: int | None = None,
                        if_match: ETagValue | None = None) -> Op[RemoveResult]:
        """Delete messages, named by exactly one of: `ids`, the `last` n of the live view
        (a pop), or a range of positions (`after_seq` and/or `before_seq`: a trim). Their
        content leaves the server; their seqs are never handed out again. One revision;
        removing nothing takes none. Raises `MessageCompacted` for a message a live
        compaction covers, `NotFound` for an id the thread lacks."""
        body = drop_none(ids=list(ids) if ids is not None else None, last=last,
                         after_seq=after_seq, before_seq=before_seq)
        return RemoveResult.from_json((yield from self._core.json(Request(
            "POST", f"{_thread_path(thread_id)}/messages:remove", json=body,
            headers=_conditions(if_match)))))

    @operation
    def redact_message(self, thread_id: str, message_id: str, *,
                       content: str | list[Any] | None = None, item: Any = None,
                       metadata: JsonObject | None = None,
                       fields: Sequence[str] = ("content",),
                       if_match: ETagValue | None = None) -> Op[Message]:
        """Overwrite `fields` of a message (any of `content`, `item`, `metadata`) in place:
        the old values are gone from the server. One revision of the thread."""
        values = {"content": content, "item": item, "metadata": metadata}
        return Message.from_json((yield from self._core.json(Request(
            "PATCH", f"{_thread_path(thread_id)}/messages/{segment(message_id)}",
            json={name: values[name] for name in fields}, headers=_conditions(if_match)))))

    @operation
    def get_message(self, thread_id: str, message_id: str) -> Op[Message]:
        """One message by id, whatever its status."""
        return Message.from_json((yield from self._core.json(Request(
            "GET", f"{_thread_path(thread_id)}/messages/{segment(message_id)}"))))

    @operation
    def get_lineage(self, message_id: str, *, limit: int | None = None,
                    cursor: str | None = None) -> Op[Page[Message]]:
        """The message with this id, in whichever of the tenant's threads holds it, and the
        messages before it along `parent_id` links, oldest first: the last `limit` (1-1000,
        default 100). `next_cursor` continues with the older ones. Raises `NotFound`, or
        `MessageAmbiguous` if several messages carry the id. Each message names its
        `thread_id`."""
        return _page(Message, (yield from self._core.json(Request(
            "GET", f"/v1/messages/{segment(message_id)}/lineage",
            params=drop_none(limit=limit, cursor=cursor)))))

    # Batches -----------------------------------------------------------------------------

    @operation
    def batch(self, operations: Sequence[Mapping[str, Any]], *,
              idempotency_key: str | None = None,
              keyed: bool = True) -> Op[list[JsonObject]]:
        """Apply up to 100 operations (`{"op": "thread.put" | "thread.patch" |
        "thread.delete" | "messages.append" | "messages.remove" | "agent_state.put" |
        "agent_state.patch" | "agent_state.delete", "thread_id", "agent_name"?, "if_match"?,
        "if_none_match"?, "body"?}`) in one transaction: all or nothing. Returns each
        operation's `{"status", "etag"?, "body"?}`. A refused operation raises its error (as
        its single request would), with its index in `error.problem["operation"]`; nothing of
        the batch is written then. Retried safely under an `Idempotency-Key`; `keyed=False`
        sends none (cheaper, for batches that are safe to repeat by themselves, e.g. appends
        of client-chosen message ids) and then never retries."""
        data = yield from self._core.json(Request(
            "POST", "/v1/batch", json={"operations": [dict(op) for op in operations]},
            headers=_idempotency(idempotency_key) if keyed else {}))
        return list(data["results"])

    # Compactions -------------------------------------------------------------------------

    @operation
    def create_compaction(self, thread_id: str, source_message_ids: Sequence[str],
                          summary: Mapping[str, Any], *, reason: str | None = None,
                          model: str | None = None, input_token_count: int | None = None,
                          output_token_count: int | None = None,
                          metadata: JsonObject | None = None,
                          if_match: ETagValue | None = None,
                          idempotency_key: str | None = None) -> Op[Compaction]:
        """Replace a contiguous run of live messages by a summary message (the sources stay
        readable in the full view). Idempotent and retried like `append_messages`."""
        body = {"source_message_ids": list(source_message_ids), "summary": dict(summary),
                **drop_none(reason=reason, model=model, input_token_count=input_token_count,
                            output_token_count=output_token_count, metadata=metadata)}
        return Compaction.from_json((yield from self._core.json(Request(
            "POST", f"{_thread_path(thread_id)}/compactions", json=body,
            headers={**_conditions(if_match), **_idempotency(idempotency_key)}))))

    @operation
    def list_compactions(self, thread_id: str, *, limit: int | None = None,
                         cursor: str | None = None) -> Op[Page[Compaction]]:
        """One page of a thread's (unreverted) compactions, oldest first."""
        return _page(Compaction, (yield from self._core.json(Request(
            "GET", f"{_thread_path(thread_id)}/compactions",
            params=drop_none(limit=limit, cursor=cursor)))))

    iter_compactions = paginated(list_compactions)

    @operation
    def get_compaction(self, thread_id: str, compaction_id: str) -> Op[Compaction]:
        """A compaction record with its `source_messages`."""
        return Compaction.from_json((yield from self._core.json(Request(
            "GET", f"{_thread_path(thread_id)}/compactions/{segment(compaction_id)}"))))

    @operation
    def revert_compaction(self, thread_id: str, compaction_id: str, *,
                          if_match: ETagValue | None = None) -> Op[None]:
        """Undo a compaction: its sources are live again, its summary becomes `reverted`.
        Raises `CompactionCovered` if a later compaction covers the summary."""
        yield from self._core.call(Request(
            "DELETE", f"{_thread_path(thread_id)}/compactions/{segment(compaction_id)}",
            headers=_conditions(if_match)))

    # Agent states ------------------------------------------------------------------------

    @operation
    def get_agent_state(self, thread_id: str, agent_name: str) -> Op[AgentState]:
        """One agent's state in a thread; raises `NotFound` if it has none."""
        return AgentState.from_json((yield from self._core.json(Request(
            "GET", _agent_state_path(thread_id, agent_name)))))

    @operation
    def put_agent_state(self, thread_id: str, agent_name: str, state: JsonObject, *,
                        if_match: ETagValue | None = None,
                        create_only: bool = False) -> Op[AgentState]:
        """Create or replace an agent's state (the thread is created if needed).
        Precondition rules as `put_thread`."""
        return AgentState.from_json((yield from self._core.json(Request(
            "PUT", _agent_state_path(thread_id, agent_name), json={"state": state},
            headers=_conditions(if_match, create_only)))))

    @operation
    def patch_agent_state(self, thread_id: str, agent_name: str, state: JsonObject, *,
                          if_match: ETagValue | None = None) -> Op[AgentState]:
        """Merge-patch (RFC 7396) an agent's state; members set to `None` are removed."""
        return AgentState.from_json((yield from self._core.json(Request(
            "PATCH", _agent_state_path(thread_id, agent_name), json={"state": state},
            headers=_conditions(if_match), content_type=MERGE_PATCH))))

    @operation
    def delete_agent_state(self, thread_id: str, agent_name: str, *,
                           if_match: ETagValue | None = None) -> Op[None]:
        """Delete an agent's state."""
        yield from self._core.call(Request("DELETE", _agent_state_path(thread_id, agent_name),
                                           headers=_conditions(if_match)))

    @operation
    def update_agent_state(self, thread_id: str, agent_name: str, fn: StateFn, *,
                           create: bool = False, max_attempts: int = 10) -> Op[AgentState]:
        """Optimistic read-modify-write of an agent's state; see `update_thread`."""
        return (yield from self._read_modify_write(
            lambda: _Api.get_agent_state.steps(self, thread_id, agent_name),
            lambda state, revision: _Api.put_agent_state.steps(
                self, thread_id, agent_name, state, if_match=revision,
                create_only=revision is None),
            fn, create, max_attempts))

    @operation
    def list_agent_states(self, thread_id: str, *, limit: int | None = None,
                          cursor: str | None = None) -> Op[Page[AgentState]]:
        """One page of a thread's agent states, by `agent_name`."""
        return _page(AgentState, (yield from self._core.json(Request(
            "GET", f"{_thread_path(thread_id)}/agents",
            params=drop_none(limit=limit, cursor=cursor)))))

    iter_agent_states = paginated(list_agent_states)

    @operation
    def query_agent_states(self, *, agent_name: str | None = None,
                           thread_id: str | None = None,
                           state_contains: JsonObject | None = None, limit: int | None = None,
                           cursor: str | None = None) -> Op[Page[AgentState]]:
        """Agent states across threads, by (`thread_id`, `agent_name`); `state_contains`
        filters by JSON containment inside `state`."""
        params = drop_none(
            agent_name=agent_name, thread_id=thread_id, limit=limit, cursor=cursor,
            state_contains=json.dumps(state_contains) if state_contains is not None else None)
        return _page(AgentState, (yield from self._core.json(Request(
            "GET", "/v1/agent-states", params=params))))

    # MCP servers -------------------------------------------------------------------------

    @operation
    def get_mcp_server(self, server_name: str, *,
                       include_secrets: bool = False) -> Op[McpServer]:
        """An MCP server's cached state. Secrets read `"***"` unless `include_secrets` (and
        the key has the `secrets:read` scope)."""
        params = {"include_secrets": "true"} if include_secrets else {}
        return McpServer.from_json((yield from self._core.json(Request(
            "GET", f"/v1/mcp-servers/{segment(server_name)}", params=params))))

    @operation
    def put_mcp_server(self, server_name: str, server_type: str, *,
                       state: JsonObject | None = None, secrets: dict[str, str] | None = None,
                       last_connected_at: datetime | str | None = None,
                       if_match: ETagValue | None = None,
                       create_only: bool = False) -> Op[McpServer]:
        """Create or replace an MCP server's state. Omitted `secrets` keep the stored ones,
        `{}` clears them, a value of `"***"` keeps that secret. Preconditions as `put_thread`."""
        body = {"server_type": server_type, **drop_none(
            state=state, secrets=secrets, last_connected_at=_timestamp(last_connected_at))}
        return McpServer.from_json((yield from self._core.json(Request(
            "PUT", f"/v1/mcp-servers/{segment(server_name)}", json=body,
            headers=_conditions(if_match, create_only)))))

    @operation
    def patch_mcp_server(self, server_name: str, *, server_type: str | None = None,
                         state: JsonObject | None = None,
                         secrets: dict[str, str | None] | None = None,
                         last_connected_at: datetime | str | None = None,
                         if_match: ETagValue | None = None) -> Op[McpServer]:
        """Merge-patch (RFC 7396) an MCP server; only the members given are sent."""
        body = drop_none(server_type=server_type, state=state, secrets=secrets,
                         last_connected_at=_timestamp(last_connected_at))
        return McpServer.from_json((yield from self._core.json(Request(
            "PATCH", f"/v1/mcp-servers/{segment(server_name)}", json=body,
            headers=_conditions(if_match), content_type=MERGE_PATCH))))

    @operation
    def delete_mcp_server(self, server_name: str, *,
                          if_match: ETagValue | None = None) -> Op[None]:
        """Delete an MCP server's state and secrets."""
        yield from self._core.call(Request("DELETE", f"/v1/mcp-servers/{segment(server_name)}",
                                           headers=_conditions(if_match)))

    @operation
    def list_mcp_servers(self, *, server_type: str | None = None, limit: int | None = None,
                         cursor: str | None = None) -> Op[Page[McpServer]]:
        """One page of MCP servers by `server_name`."""
        return _page(McpServer, (yield from self._core.json(Request(
            "GET", "/v1/mcp-servers",
            params=drop_none(server_type=server_type, limit=limit, cursor=cursor)))))

    iter_mcp_servers = paginated(list_mcp_servers)

    # Thread history and forks ------------------------------------------------------------

    @operation
    def list_revisions(self, thread_id: str, *, limit: int | None = None,
                       cursor: str | None = None) -> Op[Page[ThreadRevision]]:
        """One page of a thread's kept state history, newest first: one entry per write that
        set the state or metadata (create, PUT, PATCH)."""
        return _page(ThreadRevision, (yield from self._core.json(Request(
            "GET", f"{_thread_path(thread_id)}/revisions",
            params=drop_none(limit=limit, cursor=cursor)))))

    iter_revisions = paginated(list_revisions)

    @operation
    def get_revision(self, thread_id: str, revision: int) -> Op[ThreadRevision]:
        """The state and metadata as they were at `revision`. Raises `NotFound` for a
        revision beyond the current one or older than the kept history."""
        return ThreadRevision.from_json((yield from self._core.json(Request(
            "GET", f"{_thread_path(thread_id)}/revisions/{revision}"))))

    @operation
    def fork_thread(self, thread_id: str, new_thread_id: str, *,
                    revision: int | None = None) -> Op[Thread]:
        """A new thread `new_thread_id` from `revision` (default: the current one) of this
        one: its state and metadata then, its messages and compactions as they were then,
        and its agent states. Raises `AlreadyExists` if `new_thread_id` is a live thread,
        `UnprocessableEntity` (`revision_not_kept`) for a revision outside the history."""
        body = drop_none(thread_id=new_thread_id, revision=revision)
        return Thread.from_json((yield from self._core.json(Request(
            "POST", f"{_thread_path(thread_id)}/fork", json=body))))

    # Checkpoints (raw JSON: `agentstate_client.langgraph` is the typed face) ----------------

    @operation
    def create_checkpoint(self, thread_id: str, checkpoint: JsonObject, *,
                          if_match: ETagValue | None = None) -> Op[JsonObject]:
        """Store a checkpoint (`POST /v1/threads/{id}/checkpoints`, body as in API.md 7a).
        A replay of the same content succeeds; other content raises `CheckpointExists`."""
        body: JsonObject = yield from self._core.json(Request(
            "POST", f"{_thread_path(thread_id)}/checkpoints", json=checkpoint,
            headers=_conditions(if_match)))
        return body

    @operation
    def put_checkpoint_writes(self, thread_id: str, checkpoint_id: str,
                              writes: JsonObject) -> Op[JsonObject]:
        """Store a task's pending writes against a checkpoint; repeats are ignored."""
        body: JsonObject = yield from self._core.json(Request(
            "POST", f"{_thread_path(thread_id)}/checkpoints/{segment(checkpoint_id)}/writes",
            json=writes))
        return body

    @operation
    def write_checkpoints(self, thread_id: str, *,
                          checkpoints: Sequence[JsonObject] = (),
                          writes: Sequence[JsonObject] = ()) -> Op[JsonObject]:
        """Store checkpoints (bodies as `create_checkpoint`'s) and then pending writes (as
        `put_checkpoint_writes`' bodies, each with its `checkpoint_id`) in one transaction:
        all, or none (`POST .../checkpoints/batch`)."""
        body: JsonObject = yield from self._core.json(Request(
            "POST", f"{_thread_path(thread_id)}/checkpoints/batch",
            json={"checkpoints": list(checkpoints), "writes": list(writes)}))
        return body

    @operation
    def get_delta_history(self, thread_id: str, channels: Sequence[str],
                          checkpoint_id: str | None = None, *, checkpoint_ns: str = "",
                          items: Literal["data", "digests"] | None = None,
                          known_seeds: Sequence[str] = ()) -> Op[JsonObject]:
        """Per channel, the pending writes on a checkpoint's parent chain (the newest of the
        namespace when `checkpoint_id` is None) since the nearest ancestor that stores a
        value for it, and that value (`{"writes", "seed", "seed_digest"}`): LangGraph's
        delta channel history, in one request. A seed whose `seed_digest` is one of
        `known_seeds` comes as `seed: None` with its digest. Raises `NotFound`."""
        which = "latest" if checkpoint_id is None else segment(checkpoint_id)
        body: JsonObject = yield from self._core.json(Request(
            "GET", f"{_thread_path(thread_id)}/checkpoints/{which}/delta-history",
            params=drop_none(channel=list(channels), checkpoint_ns=checkpoint_ns,
                             items=items, known_seed=list(known_seeds) or None)))
        return body

    @operation
    def get_checkpoint(self, thread_id: str, checkpoint_id: str | None = None, *,
                       checkpoint_ns: str = "",
                       items: Literal["data", "digests"] | None = None,
                       delta_channels: Sequence[str] = (),
                       known_seeds: Sequence[str] = ()) -> Op[JsonObject]:
        """One checkpoint with its values and pending writes; the newest of the namespace
        when `checkpoint_id` is None. `items="digests"`: list values carry their items'
        digests only (see `get_checkpoint_items`). `delta_channels` (the newest only): their
        delta history comes along, in `delta_history` (see `get_delta_history`, as for
        `known_seeds`). Raises `NotFound`."""
        which = "latest" if checkpoint_id is None else segment(checkpoint_id)
        body: JsonObject = yield from self._core.json(Request(
            "GET", f"{_thread_path(thread_id)}/checkpoints/{which}",
            params=drop_none(checkpoint_ns=checkpoint_ns, items=items,
                             delta_channel=list(delta_channels) or None,
                             known_seed=list(known_seeds) or None)))
        return body

    @operation
    def get_checkpoint_items(self, thread_id: str,
                             digests: Sequence[str]) -> Op[list[JsonObject]]:
        """The thread's list items with these digests (`{"digest", "type", "data"}`);
        digests it does not hold are left out."""
        body = yield from self._core.json(Request(
            "POST", f"{_thread_path(thread_id)}/checkpoints/items",
            json={"digests": list(digests)}))
        return list(body["data"])

    @operation
    def list_checkpoints(self, thread_id: str, *, checkpoint_ns: str | None = None,
                         before: str | None = None, metadata: JsonObject | None = None,
                         limit: int | None = None, cursor: str | None = None,
                         items: Literal["data", "digests"] | None = None) -> Op[JsonObject]:
        """One page (`{"data", "next_cursor", "has_more"}`) of checkpoints, newest first."""
        params = drop_none(checkpoint_ns=checkpoint_ns, before=before, limit=limit,
                           cursor=cursor, items=items,
                           metadata=json.dumps(metadata) if metadata is not None else None)
        body: JsonObject = yield from self._core.json(Request(
            "GET", f"{_thread_path(thread_id)}/checkpoints", params=params))
        return body

    @operation
    def delete_checkpoints(self, thread_id: str) -> Op[None]:
        """Delete every checkpoint of a thread (the thread stays)."""
        yield from self._core.call(Request("DELETE", f"{_thread_path(thread_id)}/checkpoints"))

    @operation
    def prune_checkpoints(self, thread_id: str, keep: int) -> Op[int]:
        """Keep the newest `keep` checkpoints of each namespace; how many were deleted."""
        body = yield from self._core.json(Request(
            "POST", f"{_thread_path(thread_id)}/checkpoints/prune", json={"keep": keep}))
        return int(body["count"])

    @operation
    def copy_checkpoints(self, thread_id: str, target_thread_id: str) -> Op[int]:
        """Copy every checkpoint into another thread (created if needed); how many."""
        body = yield from self._core.json(Request(
            "POST", f"{_thread_path(thread_id)}/checkpoints/copy",
            json={"thread_id": target_thread_id}))
        return int(body["count"])

    @operation
    def delete_checkpoint_runs(self, run_ids: Sequence[str]) -> Op[int]:
        """Delete the checkpoints whose `metadata.run_id` is one of `run_ids`, in every
        thread; how many."""
        body = yield from self._core.json(Request(
            "POST", "/v1/checkpoints/delete-runs", json={"run_ids": list(run_ids)}))
        return int(body["count"])

    # Store (API.md 7b) -------------------------------------------------------------------

    @operation
    def get_store_item(self, namespace: Sequence[str], key: str, *,
                       refresh_ttl: bool = False) -> Op[StoreItem]:
        """One store item; `refresh_ttl` restarts its time to live. Raises `NotFound` (also
        for an expired item)."""
        return StoreItem.from_json((yield from self._core.json(Request(
            "GET", store_path(namespace, key),
            params={"refresh_ttl": "true"} if refresh_ttl else {}))))

    @operation
    def put_store_item(self, namespace: Sequence[str], key: str, value: JsonObject, *,
                       index: Sequence[str] | Literal[False] | None = None,
                       ttl_seconds: float | None = None,
                       vectors: Mapping[str, Mapping[str, Sequence[float]]] | None = None,
                       if_match: ETagValue | None = None, create_only: bool = False,
                       overwrite: bool = False,
                       idempotency_key: str | None = None) -> Op[StoreItem]:
        """Create or replace a store item. `index`: the value's fields lexical search reads
        (default: all of it; False: none); `vectors`: `{index_name: {field: embedding}}`,
        computed by the caller. Replacing needs `if_match` (a revision or `"*"`), or
        `overwrite=True` (write whatever is there, present or not: LangGraph's put);
        `create_only=True` only creates. With `idempotency_key` a lost answer is retried."""
        headers = _conditions(if_match, create_only)
        if overwrite:
            if headers:
                raise ValueError("overwrite excludes if_match and create_only")
            headers = dict(OVERWRITE)
        if idempotency_key is not None:
            headers.update(_idempotency(idempotency_key))
        return StoreItem.from_json((yield from self._core.json(Request(
            "PUT", store_path(namespace, key),
            json=store_item_body(value, index, ttl_seconds, vectors), headers=headers))))

    @operation
    def patch_store_item(self, namespace: Sequence[str], key: str, *,
                         value: JsonObject | None = None, ttl_seconds: float | None = None,
                         clear_ttl: bool = False,
                         vectors: Mapping[str, Mapping[str, Sequence[float] | None] | None]
                         | None = None,
                         if_match: ETagValue | None = None) -> Op[StoreItem]:
        """Merge-patch (RFC 7396) a store item's value (and vectors, per index and field;
        None removes); `ttl_seconds` replaces its time to live, `clear_ttl` removes it."""
        body = drop_none(value=value, ttl_seconds=ttl_seconds,
                         vectors=dict(vectors) if vectors is not None else None)
        if clear_ttl:
            body["ttl_seconds"] = None
        return StoreItem.from_json((yield from self._core.json(Request(
            "PATCH", store_path(namespace, key), json=body, headers=_conditions(if_match),
            content_type=MERGE_PATCH))))

    @operation
    def delete_store_item(self, namespace: Sequence[str], key: str, *,
                          if_match: ETagValue | None = None) -> Op[None]:
        """Delete a store item (`if_match="*"`: whatever revision). Raises `NotFound`."""
        yield from self._core.call(Request("DELETE", store_path(namespace, key),
                                           headers=_conditions(if_match)))

    @operation
    def search_store(self, namespace_prefix: Sequence[str] = (), *,
                     filter: JsonObject | None = None, query: str | None = None,
                     vector: Sequence[float] | None = None, vector_index: str | None = None,
                     metric: Literal["cosine", "inner_product", "l2"] = "cosine",
                     limit: int = 10, offset: int = 0,
                     refresh_ttl: bool = False) -> Op[Page[StoreItem]]:
        """Store items under `namespace_prefix`: matching `filter`, ranked by `query` (full
        text), by `vector` (in `vector_index`), or by both fused; most recent first without
        either. `has_more` says whether `offset + limit` continues."""
        body = store_search_body(namespace_prefix, filter=filter, query=query, vector=vector,
                                 vector_index=vector_index, metric=metric, limit=limit,
                                 offset=offset, refresh_ttl=refresh_ttl)
        return _page(StoreItem, (yield from self._core.json(Request(
            "POST", "/v1/store/items/search", json=body))))

    @operation
    def list_store_namespaces(self, *, prefix: Sequence[str] | None = None,
                              suffix: Sequence[str] | None = None,
                              max_depth: int | None = None, limit: int = 100,
                              offset: int = 0) -> Op[list[tuple[str, ...]]]:
        """The namespaces holding items, sorted; `"*"` in `prefix`/`suffix` matches any one
        label; `max_depth` cuts them to that many labels."""
        body = yield from self._core.json(Request(
            "POST", "/v1/store/namespaces", json=store_namespaces_body(
                prefix=prefix, suffix=suffix, max_depth=max_depth, limit=limit,
                offset=offset)))
        return [tuple(namespace) for namespace in body["data"]]

    # Events ------------------------------------------------------------------------------

    @operation
    def list_events(self, *, thread_id: str | None = None, types: Sequence[str] | None = None,
                    after: int | None = None, limit: int | None = None,
                    cursor: str | None = None, resource_prefix: str | None = None,
                    wait: float | None = None) -> Op[Page[Event]]:
        """One page of the tenant's change feed, oldest first. `next_cursor` is never None:
        pass the last one back to get exactly the events committed since, each once.
        `wait` (seconds) long-polls: an empty page is answered only after that long, or as
        soon as an event arrives (the client's timeout must be longer). See `watch()` for a
        stream."""
        params = drop_none(thread_id=thread_id, type=list(types) if types else None,
                           after=after, limit=limit, cursor=cursor,
                           resource_prefix=resource_prefix, wait=wait)
        return _page(Event, (yield from self._core.json(Request("GET", "/v1/events",
                                                                params=params))))

    iter_events = paginated(list_events)
