"""Thread use cases: section 2 (revisions, preconditions) and section 3 of the contract."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from app.agent_states.repository import AgentStateRepository
from app.compactions.repository import CompactionRepository
from app.core.errors import AlreadyExists, NotFound, Unprocessable
from app.core.ids import new_id
from app.core.limits import check_metadata
from app.core.mergepatch import merge_patch
from app.core.pagination import (
    Page,
    RenderedPage,
    bad_cursor,
    decode_cursor,
    split_page,
    split_rendered,
)
from app.core.revisions import Preconditions, check_preconditions
from app.core.schemas import parse_timestamp
from app.db.base import AnyRow, utcnow
from app.db.unit import UnitOfWork
from app.messages.errors import refuse_taken
from app.messages.parents import resolve_parents
from app.messages.repository import MessageRepository, checks_ids_on_insert
from app.messages.schemas import (
    MessageIn,
    check_batch,
    columns_of,
    message_page,
    messages_path,
    renderer,
)
from app.threads.aggregate import ThreadAggregate, thread_path
from app.threads.errors import ThreadDeleted, ThreadExists
from app.threads.repository import ThreadRepository
from app.threads.schemas import (
    RenderedThread,
    ThreadCreate,
    ThreadFork,
    ThreadPatch,
    ThreadReplace,
    ThreadRevisionOut,
    render_thread,
    with_messages_json,
)

CURSOR = "threads"
HISTORY_CURSOR = "revisions"


def _values(body: ThreadCreate | ThreadReplace, *, create: bool = False) -> dict[str, Any]:
    """The thread columns a create or replace sets: what it omits is kept (or, on create,
    defaulted)."""
    values: dict[str, Any] = {"state": body.state}
    if body.metadata is not None or create:
        values["metadata"] = body.metadata or {}
    for name in ("history_limit", "ttl_seconds"):
        if name in body.model_fields_set:
            values[name] = getattr(body, name)
    return values


class ThreadService:
    def __init__(self, uow: UnitOfWork) -> None:
        self.uow = uow
        self.settings = uow.settings
        self.threads = ThreadAggregate(uow)
        self.repo = ThreadRepository(uow.connection, uow.tenant_id)

    async def create(self, body: ThreadCreate) -> RenderedThread:
        check_metadata(body.metadata, self.settings)
        thread_id = body.thread_id or new_id("thr")
        row = await self.threads.create(thread_id, _values(body, create=True), utcnow())
        if row is None:
            raise ThreadExists(f"Thread {thread_id!r} already exists.")
        return RenderedThread.of(row)

    async def get(self, thread_id: str) -> RenderedThread:
        return RenderedThread.of(await self.threads.live(thread_id, returning="stored"))

    async def get_with_messages(self, thread_id: str, limit: int,
                                fields: frozenset[str] | None = None) -> RenderedThread:
        """The thread with the first page of its live view (`ThreadWithMessages`), read in
        one transaction; with `fields`, only those members of each message."""
        row = await self.threads.live(thread_id, returning="stored")
        rows = await MessageRepository(self.uow.connection, self.uow.tenant_id).page(
            row.id, live=True, descending=False, lower=None, upper=None, role=None,
            agent_name=None, limit=limit + 1, as_stored=True, columns=columns_of(fields))
        page = message_page(rows, limit, self.settings.max_page_bytes, renderer(fields))
        return RenderedThread(row.thread_id, row.revision,
                              with_messages_json(render_thread(row), page))

    async def replace(self, thread_id: str, body: ThreadReplace,
                      pre: Preconditions) -> tuple[RenderedThread, bool]:
        """PUT: returns the thread and whether it was created. `append_messages` are stored
        under the same revision, taking the next seqs (a create holds seqs 1..n)."""
        check_metadata(body.metadata, self.settings)
        appended = body.append_messages or []
        check_batch(appended, self.settings, "/append_messages")
        if pre.if_match is not None and pre.if_none_match is not None:
            # Both: RFC 9110 section 13.2.2 judges If-Match, then If-None-Match, on the
            # current thread (a deleted one counts as absent); `advance` then guards the race.
            current = await self.repo.get(thread_id, returning="keys")
            live = current.revision if current is not None and current.deleted_at is None else None
            check_preconditions(pre, live, method="PUT", noun="thread",
                                required=self.settings.require_preconditions)
            row, created = await self._update(thread_id, body, pre, len(appended)), False
        elif pre.create_only:
            row, created = await self._create_only(thread_id, body, len(appended)), True
        elif pre.if_match is not None:
            row, created = await self._update(thread_id, body, pre, len(appended)), False
        else:
            row, created = await self._upsert(thread_id, body, pre, len(appended))
        await self._append(row, appended)
        return RenderedThread.of(row), created

    async def _create_only(self, thread_id: str, body: ThreadReplace, count: int) -> AnyRow:
        """If-None-Match: *: a new id, or a tombstoned one started afresh; 412 if live."""
        row = await self.threads.create(thread_id, _values(body, create=True), utcnow(), count)
        if row is None:
            current = await self.repo.get(thread_id, returning="keys")
            raise AlreadyExists(current.revision if current is not None else None)
        return row

    async def _update(self, thread_id: str, body: ThreadReplace, pre: Preconditions,
                      count: int) -> AnyRow:
        """A replace of the live thread at one of the revisions If-Match names (any, with `*`)."""
        if not count:
            row = await self.threads.replace_at_once(thread_id, pre, _values(body))
            if row is not None:
                return row
        row = await self.threads.advance(thread_id, pre, values=_values(body), seqs=count,
                                         live_delta=count, returning="stored")
        self.threads.record("updated", thread_id, row.revision)
        return row

    async def _upsert(self, thread_id: str, body: ThreadReplace, pre: Preconditions,
                      count: int) -> tuple[AnyRow, bool]:
        """No If-Match: create a new id; an existing thread is judged by section 2 (428
        unless last-writer-wins is configured), a tombstone is 410."""
        created = await self.threads.insert(thread_id, _values(body, create=True), utcnow(),
                                            count)
        if created is not None:
            return created, True
        current = await self.repo.get(thread_id, returning="keys")
        assert current is not None  # the insert found the id taken
        if current.deleted_at is not None:
            raise ThreadDeleted(
                f"Thread {thread_id!r} was deleted; send If-None-Match: * to start it afresh."
            )
        check_preconditions(pre, current.revision, method="PUT", noun="thread",
                            required=self.settings.require_preconditions)
        return await self._update(thread_id, body, pre, count), False

    async def _append(self, row: AnyRow, messages: list[MessageIn]) -> None:
        """Store the messages of a PUT or PATCH in the revision `row` was just given."""
        if not messages:
            return
        repo = MessageRepository(self.uow.connection, self.uow.tenant_id)
        if not checks_ids_on_insert(messages):
            refuse_taken(await repo.taken_id(row.id, [msg.id for msg in messages if msg.id]))
        parents = await resolve_parents(repo, row, messages, "/append_messages")
        _, taken = await repo.append(row, messages, utcnow(), parents)
        refuse_taken(taken)
        self.uow.record("message.appended", messages_path(row.thread_id),
                        revision=row.revision, thread_id=row.thread_id)

    async def patch(self, thread_id: str, body: ThreadPatch, pre: Preconditions,
                    held: dict[str, AnyRow | None] | None = None) -> RenderedThread:
        """`held`: rows locked ahead by a batch (`ThreadAggregate.lock_all`)."""
        appended = body.append_messages or []
        check_batch(appended, self.settings, "/append_messages")
        row = await self.threads.locked(thread_id, pre, "PATCH", held)
        values: dict[str, Any] = {}
        # A member set to null is removed (RFC 7396); for these two that means "empty".
        if "state" in body.model_fields_set:
            values["state"] = merge_patch(row.state, body.state) if body.state is not None else {}
        if "metadata" in body.model_fields_set:
            values["metadata"] = (
                merge_patch(row.metadata, body.metadata) if body.metadata is not None else {}
            )
            check_metadata(values["metadata"], self.settings)
        for name in ("history_limit", "ttl_seconds"):
            if name in body.model_fields_set:
                values[name] = getattr(body, name)
        row = await self.threads.change(row, values, seqs=len(appended))
        await self._append(row, appended)
        return RenderedThread.of(row)

    async def delete(self, thread_id: str, pre: Preconditions) -> None:
        await self.threads.delete(thread_id, pre)

    async def _page(self, *, limit: int, cursor: str | None,
                    metadata: dict[str, Any] | None, updated_after: datetime | None,
                    order_by: Literal["created_at", "updated_at"] = "created_at",
                    thread_ids: list[str] | None = None,
                    forked_from: str | None = None) -> tuple[list[AnyRow], RenderedPage]:
        """The page of threads, rendered (`render_thread`), and the rows of its items."""
        # Each order has its own cursor kind: a cursor of one is refused by the other.
        kind = CURSOR if order_by == "created_at" else f"{CURSOR}_by_{order_by}"
        after = decode_cursor(kind, cursor, 2)
        try:
            key = (parse_timestamp(after[0]), str(after[1])) if after else None
        except (TypeError, ValueError):
            raise bad_cursor() from None
        rows = await self.repo.page(limit=limit + 1, after=key, metadata=metadata,
                                    updated_after=updated_after, order_by=order_by,
                                    thread_ids=thread_ids, forked_from=forked_from)
        page = split_rendered(kind, rows, limit,
                              lambda row: [getattr(row, order_by).isoformat(), row.thread_id],
                              render_thread, max_bytes=self.settings.max_page_bytes)
        return rows[:len(page.items)], page

    async def list(self, **filters: Any) -> RenderedPage:
        """Live threads, newest first by `order_by` (see `_page` for the filters)."""
        return (await self._page(**filters))[1]

    async def list_with_messages(self, *, messages_limit: int,
                                 messages_fields: frozenset[str] | None = None,
                                 **filters: Any) -> RenderedPage:
        """The page `list(**filters)` makes, each thread with the first page of its live view
        (as `GET` with `include=messages`; with `messages_fields`, only those members of each
        message), read in one transaction. The messages of the whole page share one
        `max_page_bytes` budget, spent in page order; a thread's page cut short by it has its
        `messages_next_cursor` (and at least one message)."""
        rows, threads = await self._page(**filters)
        messages = MessageRepository(self.uow.connection, self.uow.tenant_id)
        budget = self.settings.max_page_bytes
        columns, render = columns_of(messages_fields), renderer(messages_fields)
        items = []
        for thread, rendered in zip(rows, threads.items, strict=True):
            # Once the budget is spent, a thread gets one message and its cursor.
            size = messages_limit if budget > 0 else 1
            found = await messages.page(
                thread.id, live=True, descending=False, lower=None, upper=None, role=None,
                agent_name=None, limit=size + 1, as_stored=True,
                columns=columns) if thread.message_count else []
            page = message_page(found, size, max(budget, 0), render)
            budget -= sum(map(len, page.items))
            items.append(with_messages_json(rendered, page))
        return RenderedPage(items, threads.next_cursor)

    async def revisions(self, thread_id: str, *, limit: int,
                        cursor: str | None) -> Page[ThreadRevisionOut]:
        """The kept history entries, newest first: one per write that set the state."""
        after = decode_cursor(HISTORY_CURSOR, cursor, 1)
        if after is not None and type(after[0]) is not int:
            raise bad_cursor()
        pk = await self.threads.live_pk(thread_id)
        rows = await self.repo.history(pk, before=after[0] if after else None, limit=limit + 1)
        return split_page(HISTORY_CURSOR, rows, limit, lambda row: [row.revision],
                          ThreadRevisionOut.from_row, max_bytes=self.settings.max_page_bytes)

    async def revision(self, thread_id: str, revision: int) -> ThreadRevisionOut:
        """The state and metadata as they were at `revision`: 404 beyond the current one or
        before the kept history."""
        thread = await self.threads.live(thread_id)
        entry = (await self.repo.history_at(thread.id, revision)
                 if revision <= thread.revision else None)
        if entry is None:
            raise NotFound(
                f"Revision {revision} of thread {thread_id!r} is not kept: the thread is at "
                f"revision {thread.revision} and keeps "
                f"{self.threads.history_window(thread)} revisions of history.")
        return ThreadRevisionOut.from_row(entry, revision)

    async def fork(self, thread_id: str, body: ThreadFork) -> RenderedThread:
        """A new thread from a revision of this one: its state and metadata then, its
        messages and compactions as they were then, and its agent states (as they are: agent
        states keep no history). The new thread starts its own revisions and history, and
        records its source (`forked_from`: the source's id and the revision forked)."""
        source = await self.threads.live(thread_id)
        at = body.revision or source.revision
        entry = await self.repo.history_at(source.id, at) if at <= source.revision else None
        if entry is None:
            raise Unprocessable(
                f"Thread {thread_id!r} is at revision {source.revision} and keeps "
                f"{self.threads.history_window(source)} revisions of history; revision {at} "
                "cannot be forked.",
                errors=[{"pointer": "/revision", "code": "revision_not_kept",
                         "message": "not within the thread's kept history"}])
        now = utcnow()
        fork = await self.threads.create(
            body.thread_id, {"state": entry.state, "metadata": entry.metadata,
                             "history_limit": source.history_limit,
                             "forked_from_thread_id": thread_id, "forked_from_revision": at},
            now)
        if fork is None:
            current = await self.repo.get(body.thread_id, returning="keys")
            raise AlreadyExists(current.revision if current is not None else None)
        messages = MessageRepository(self.uow.connection, self.uow.tenant_id)
        last_seq = await messages.copy(source.id, fork.id, up_to_revision=at,
                                       revision=fork.revision, source_id=thread_id,
                                       target_id=body.thread_id)
        compactions = CompactionRepository(self.uow.connection, self.uow.tenant_id)
        records = await compactions.made_by(source.id, at)
        await compactions.copy(source.id, fork.id, up_to_revision=at, revision=fork.revision)
        for record in records:  # the statuses the messages had at that revision
            if record.reverted_revision is not None and record.reverted_revision <= at:
                await messages.set_status(fork.id, [record.summary_message_id], "reverted",
                                          None)
            else:
                await messages.set_status(fork.id, record.source_message_ids, "compacted",
                                          record.compaction_id)
        await self.repo.set_log(fork.id, last_seq=last_seq,
                                message_count=await messages.live_count(fork.id))
        states = AgentStateRepository(self.uow.connection, self.uow.tenant_id)
        for agent_name in await states.copy(source.id, fork.id, body.thread_id, now):
            self.uow.record("agent_state.created",
                            f"{thread_path(body.thread_id)}/agents/{agent_name}/state",
                            revision=1, thread_id=body.thread_id)
        self.uow.record("thread.forked", thread_path(body.thread_id), revision=fork.revision,
                        thread_id=body.thread_id)
        return RenderedThread.of(await self.threads.live(body.thread_id, returning="stored"))

