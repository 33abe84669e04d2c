"""pydantic-ai drop-in: `AgentStateConversationStore` is a pydantic-ai `ConversationStore`.

    from agentstate_client.pydantic_ai import AgentStateConversationStore

    store = AgentStateConversationStore(base_url="http://127.0.0.1:8080")
    conversation = await store.load(cid) or Conversation(conversation_id=cid)
    result = await agent.run("Hi", conversation=conversation)
    await store.save(result)                 # instead of InMemoryConversationStore()

How a conversation is kept (ids through `agentstate_client.ids`, like every adapter):
- one thread per conversation, `join_ids("pydantic-ai", namespace, conversation_id)`; its
  `state` is `{"record": <the ConversationRecord as JSON>}` and its `metadata`
  `{"pydantic_ai": {"namespace", "scope"?}}`, which `list_conversations` filters on (JSON
  containment), newest `updated_at` first;
- each entry is one message of the thread that stored it: message id `encode_id(entry.id)`,
  `parent_id` the entry before it (the server resolves it in whichever thread holds it: a
  fork's entries continue the conversation it came from), `role` the message's `kind`
  (`request`, `response`) and `item` `{"kind", "id", "parent_id", "message"}`, the message
  as `ModelMessagesTypeAdapter` writes it;
- a record whose head is an entry it does not store itself (a fork, a branch) also gets a
  `head` message whose `parent_id` is that entry: the link keeps the entry's thread from
  being deleted under it, and a head that is already gone fails the write, as
  `write_record` must (`ConversationConflict`).

Every `write_record` is one request and one transaction: a `PUT` of the thread that writes
the record and appends the new entries, conditional on the thread revision the record was
read at (`If-Match`; `If-None-Match: *` to create), or a `POST /v1/batch` when there are
more than 100 new entries. A history is one `GET /v1/messages/{head}/lineage` per 1000
entries, whatever threads it runs through.

`delete` deletes the conversation's thread, entries and all. When another conversation's
history runs through its entries (a fork of it), the server refuses that
(`message_referenced`), and the thread is kept instead with the record removed: the
conversation no longer loads or lists, and its entries stay stored for the forks. Deleting a
fork then deletes such kept threads up its `forked_from` chain that nothing reaches any more.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentstate_client._adapters import OwnsClient
from agentstate_client._async import AsyncAgentStateClient
from agentstate_client.errors import (
    MessageAmbiguous,
    MessageExists,
    MessageReferenced,
    NotFound,
    ParentNotFound,
    PreconditionFailed,
    ThreadDeleted,
)
from agentstate_client.ids import encode_id, join_ids
from agentstate_client.models import Message, Thread

try:
    from pydantic import TypeAdapter
    from pydantic_ai.conversation_store import (
        ConversationConflict,
        ConversationEntry,
        ConversationRecord,
        ConversationStore,
    )
    from pydantic_ai.messages import ModelMessagesTypeAdapter
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError("AgentStateConversationStore needs pydantic-ai: "
                      "pip install 'agentstate-client[pydantic-ai]'") from exc

__all__ = ["AgentStateConversationStore"]

PAGE = 1000  # lineage entries per read, the server's maximum
LIST_PAGE = 100  # threads per list page, the server's maximum
BATCH = 100  # messages per append, the server's default limit
MAX_OPERATIONS = 100  # operations per batch, the server's limit
LIVE = "pydantic_ai"  # metadata key of a thread holding a record
KEPT = "pydantic_ai_deleted"  # metadata key of a deleted conversation's kept thread
HEAD_ROLE = "head"
MAX_RELEASE = 16  # kept threads one delete releases up a forked_from chain
# What the store last saw of a conversation's thread: (record revision, thread revision,
# forked_from); a kept thread has no record revision, an absent one is ABSENT.
Seen = tuple[str | None, int, str | None]
ABSENT: Seen = (None, 0, None)
_RECORD = TypeAdapter(ConversationRecord)


def _entry_message(entry: ConversationEntry) -> dict[str, Any]:
    message: dict[str, Any] = ModelMessagesTypeAdapter.dump_python([entry.message],
                                                                   mode="json")[0]
    stored: dict[str, Any] = {
        "id": encode_id(entry.id), "role": entry.message.kind, "content": None,
        "item": {"kind": entry.kind, "id": entry.id, "parent_id": entry.parent_id,
                 "message": message},
    }
    if entry.parent_id is not None:
        stored["parent_id"] = encode_id(entry.parent_id)
    return stored


def _entry(message: Message) -> ConversationEntry:
    item = message.item
    if not isinstance(item, dict) or "message" not in item or "id" not in item:
        raise LookupError(f"message {message.id!r} is not a conversation entry")
    return ConversationEntry(
        id=item["id"], parent_id=item.get("parent_id"), kind=item.get("kind", "message"),
        message=ModelMessagesTypeAdapter.validate_python([item["message"]])[0])


class AgentStateConversationStore(OwnsClient, ConversationStore):
    """pydantic-ai's `ConversationStore` on an agentstate server (see the module docstring).

    Pass an `AsyncAgentStateClient`, or `base_url`/`api_key` (default: `$AGENTSTATE_URL`,
    `$AGENTSTATE_API_KEY`) for a client the store owns and closes in `close()`. `namespace`
    keeps apps that share a tenant apart: each lists and loads only its own conversations
    (entries are found by id tenant-wide, as pydantic-ai's ids are unique).
    """

    def __init__(self, *, base_url: str | None = None, api_key: str | None = None,
                 namespace: str = "default", client: AsyncAgentStateClient | None = None) -> None:
        self.namespace = namespace
        self._use_client(base_url, api_key, client)
        # Per conversation thread, what this store last saw (`Seen`): the record revision and
        # the thread revision it was at, so a write names the thread revision in If-Match
        # without reading the thread again. Record revisions are unique (uuid7), so a stale
        # entry can only make a write fail its If-Match, never pass it wrongly.
        self._seen: dict[str, Seen] = {}

    def thread_id(self, conversation_id: str) -> str:
        """The agentstate thread that holds a conversation."""
        return join_ids("pydantic-ai", self.namespace, conversation_id)

    def _metadata(self, scope: str | None) -> dict[str, Any]:
        mine: dict[str, Any] = {"namespace": self.namespace}
        if scope is not None:
            mine["scope"] = scope
        return {LIVE: mine}

    # --- records -------------------------------------------------------------------------

    def _record_of(self, thread: Thread) -> ConversationRecord | None:
        """The record a thread holds (remembering its revision), or None for a kept one."""
        stored = thread.state.get("record") if LIVE in thread.metadata else None
        if stored is None:
            forked_from = thread.state.get("forked_from")
            self._seen[thread.thread_id] = (
                None, thread.revision, forked_from if isinstance(forked_from, str) else None)
            return None
        record = _RECORD.validate_python(stored)
        self._seen[thread.thread_id] = (record.revision, thread.revision, record.forked_from)
        return record

    async def _thread(self, conversation_id: str) -> Thread | None:
        try:
            return await self.client.get_thread(self.thread_id(conversation_id))
        except NotFound:
            self._seen[self.thread_id(conversation_id)] = ABSENT
            return None

    async def read_record(self, conversation_id: str) -> ConversationRecord | None:
        thread = await self._thread(conversation_id)
        return self._record_of(thread) if thread is not None else None

    async def read_records(self, *, scope: str | None = None,
                           limit: int | None = None) -> Sequence[ConversationRecord]:
        records: list[ConversationRecord] = []
        if limit == 0:
            return records
        wanted = self._metadata(scope)
        cursor: str | None = None
        while True:
            page = await self.client.list_threads(
                metadata=wanted, order_by="updated_at", cursor=cursor,
                limit=LIST_PAGE if limit is None else min(LIST_PAGE, limit - len(records)))
            for thread in page.data:
                record = self._record_of(thread)
                if record is not None:
                    records.append(record)
            if not page.has_more or (limit is not None and len(records) >= limit):
                return records[:limit]
            cursor = page.next_cursor

    async def _thread_revision(self, conversation_id: str, record_revision: str | None
                               ) -> int | None:
        """The thread revision at which the conversation's record had `record_revision`
        (None: no record, the thread kept or absent): from what this store last saw, else
        read. None if the thread is absent."""
        thread_id = self.thread_id(conversation_id)
        seen = self._seen.get(thread_id)
        if seen is None or seen[0] != record_revision:
            thread = await self._thread(conversation_id)
            if thread is not None:
                self._record_of(thread)
            seen = self._seen[thread_id]
            if seen[0] != record_revision:
                raise ConversationConflict(conversation_id)
        return seen[1] or None

    async def write_record(self, record: ConversationRecord, *,
                           new_entries: Sequence[ConversationEntry] = (),
                           expected_revision: str | None) -> None:
        conversation_id = record.conversation_id
        messages = [_entry_message(entry) for entry in new_entries]
        if record.head_id is not None and record.head_id not in {e.id for e in new_entries}:
            # The head is an entry stored before, maybe in another conversation's thread.
            messages.append({"role": HEAD_ROLE, "content": None,
                             "parent_id": encode_id(record.head_id)})
        revision = await self._thread_revision(conversation_id, expected_revision)
        if expected_revision is not None and revision is None:
            raise ConversationConflict(conversation_id)
        try:
            try:
                thread_revision = await self._put(record, messages, revision)
            except PreconditionFailed:
                if expected_revision is not None or revision is not None:
                    raise
                # Created since we looked: a conversation now, or a deleted one's kept thread.
                self._seen.pop(self.thread_id(conversation_id), None)
                revision = await self._thread_revision(conversation_id, None)
                if revision is None:
                    raise
                thread_revision = await self._put(record, messages, revision)
        except (PreconditionFailed, ThreadDeleted, ParentNotFound, MessageAmbiguous,
                MessageExists, NotFound) as exc:
            raise ConversationConflict(conversation_id) from exc
        self._seen[self.thread_id(conversation_id)] = (record.revision, thread_revision,
                                                       record.forked_from)

    async def _put(self, record: ConversationRecord, messages: list[dict[str, Any]],
                   revision: int | None) -> int:
        """Write the record and append `messages` in one transaction, on the thread at
        `revision` (None: create it). The thread's new revision."""
        thread_id = self.thread_id(record.conversation_id)
        state = {"record": _RECORD.dump_python(record, mode="json")}
        metadata = self._metadata(record.scope)
        if len(messages) <= BATCH:
            thread = await self.client.put_thread(
                thread_id, state, metadata=metadata, append_messages=messages or None,
                if_match=revision, create_only=revision is None)
            return thread.revision
        chunks = [messages[start:start + BATCH] for start in range(0, len(messages), BATCH)]
        if len(chunks) > MAX_OPERATIONS:
            raise ValueError(f"a save stores at most {MAX_OPERATIONS * BATCH} new messages")
        put: dict[str, Any] = {"op": "thread.put", "thread_id": thread_id, "body": {
            "state": state, "metadata": metadata, "append_messages": chunks[0]}}
        if revision is None:
            put["if_none_match"] = "*"
        else:
            put["if_match"] = f'"{revision}"'
        results = await self.client.batch([put, *(
            {"op": "messages.append", "thread_id": thread_id, "body": {"messages": chunk}}
            for chunk in chunks[1:])])
        return int(str(results[-1]["etag"]).strip('"'))

    async def delete_record(self, conversation_id: str, *, expected_revision: str) -> None:
        revision = await self._thread_revision(conversation_id, expected_revision)
        if revision is None:
            raise ConversationConflict(conversation_id)
        thread_id = self.thread_id(conversation_id)
        forked_from = self._seen[thread_id][2]
        try:
            try:
                await self.client.delete_thread(thread_id, if_match=revision)
            except MessageReferenced:
                # A fork's history runs through its entries: keep them, drop the record.
                kept = await self.client.put_thread(
                    thread_id, {"forked_from": forked_from},
                    metadata={KEPT: {"namespace": self.namespace}}, if_match=revision)
                self._seen[thread_id] = (None, kept.revision, forked_from)
                return
        except (PreconditionFailed, ThreadDeleted, NotFound) as exc:
            raise ConversationConflict(conversation_id) from exc
        self._seen[thread_id] = ABSENT
        await self._release(forked_from)

    async def _release(self, conversation_id: str | None) -> None:
        """Delete the kept threads up a `forked_from` chain that nothing reaches any more
        (best effort: one that is still reached, or written meanwhile, stays)."""
        for _ in range(MAX_RELEASE):
            if conversation_id is None:
                return
            thread = await self._thread(conversation_id)
            if thread is None or KEPT not in thread.metadata:
                return
            try:
                await self.client.delete_thread(thread.thread_id, if_match=thread.revision)
            except (MessageReferenced, PreconditionFailed, ThreadDeleted, NotFound):
                return
            self._seen[thread.thread_id] = ABSENT
            forked_from = thread.state.get("forked_from")
            conversation_id = forked_from if isinstance(forked_from, str) else None

    # --- entries -------------------------------------------------------------------------

    async def read_entry(self, entry_id: str) -> ConversationEntry:
        history = await self.read_history(entry_id, limit=1)
        return history[0]

    async def read_history(self, head_id: str | None, *,
                           limit: int | None = None) -> list[ConversationEntry]:
        """The entries up to `head_id`, oldest first (the last `limit`): one request per
        1000 entries, whichever threads they are stored in."""
        if head_id is None or limit == 0:
            return []
        chunks: list[list[Message]] = []
        count = 0
        cursor: str | None = None
        while True:
            size = PAGE if limit is None else min(PAGE, limit - count)
            try:
                page = await self.client.get_lineage(encode_id(head_id), limit=size,
                                                     cursor=cursor)
            except (NotFound, MessageAmbiguous) as exc:
                raise KeyError(head_id) from exc
            chunks.append(page.data)
            count += len(page.data)
            if not page.has_more or (limit is not None and count >= limit):
                break
            cursor = page.next_cursor
        return [_entry(message) for chunk in reversed(chunks) for message in chunk]
