"""The thread as the aggregate root of everything in it.

Messages, compactions and agent states (and whatever hangs off a thread next) never touch the
thread row themselves: they ask this module for the thread they may write to or read from.
It owns the row's lock, its revision advance, the reasons a write is refused (404, 410, 412,
428), tombstones, and the `thread.*` audit events.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any, NoReturn

from app.core.errors import NotFound, RevisionMismatch
from app.core.revisions import Preconditions, check_preconditions
from app.db.base import AnyRow, utcnow
from app.db.dialect import dialect_name
from app.db.unit import UnitOfWork
from app.messages.errors import refuse_referenced
from app.messages.repository import MessageRepository
from app.threads.errors import ThreadDeleted
from app.threads.repository import Returning, ThreadRepository


def thread_path(thread_id: str) -> str:
    return f"/v1/threads/{thread_id}"


def _missing(thread_id: str) -> NotFound:
    return NotFound(f"Thread {thread_id!r} does not exist.")


def _deleted(thread_id: str, hint: str = "") -> ThreadDeleted:
    return ThreadDeleted(f"Thread {thread_id!r} was deleted{hint}.")


class ThreadAggregate:
    def __init__(self, uow: UnitOfWork) -> None:
        self.uow = uow
        self.settings = uow.settings
        self.repo = ThreadRepository(uow.connection, uow.tenant_id)

    def record(self, change: str, thread_id: str, revision: int) -> None:
        self.uow.record(f"thread.{change}", thread_path(thread_id), revision=revision,
                        thread_id=thread_id)

    def history_window(self, row: AnyRow) -> int:
        """How many revisions of state history the thread keeps."""
        limit: int | None = row.history_limit
        return self.settings.thread_history if limit is None else limit

    async def _keep(self, row: AnyRow, values: dict[str, Any] | None = None) -> AnyRow:
        """Every write that sets the state or metadata keeps them in the thread's history.

        `values`, for a write to an existing thread, are the columns it set. A thread whose
        own `history_limit` is 0, written without setting it, has no history to prune: the
        write that set 0 pruned it, and no entry is kept while it is 0 (nor imported for such
        a thread, app/portability/importer.py), so its writes skip the DELETE. A limit of
        None follows the server's setting, which may have been higher before a restart:
        those threads are pruned as always."""
        window = self.history_window(row)
        if (window == 0 and row.history_limit == 0 and values is not None
                and "history_limit" not in values):
            return row
        await self.repo.keep_history(row.id, row.revision, window)
        return row

    # --- reads -------------------------------------------------------------------------

    async def live(self, thread_id: str, returning: Returning = "all") -> AnyRow:
        """The row of a thread readers may see; a tombstone reads as 404."""
        row = await self.repo.get(thread_id, returning=returning)
        if row is None or row.deleted_at is not None:
            raise _missing(thread_id)
        return row

    async def live_pk(self, thread_id: str) -> int:
        """The key of a thread readers may see, for reading its children; 404 otherwise."""
        pk = await self.repo.live_pk(thread_id)
        if pk is None:
            raise _missing(thread_id)
        return pk

    # --- writes ------------------------------------------------------------------------

    async def write_target(self, thread_id: str, pre: Preconditions) -> int:
        """The key of the live thread a write is aimed at, read before the write takes its
        revision with `advance`; a thread that is gone is refused as `advance` refuses."""
        pk = await self.repo.live_pk(thread_id)
        if pk is None:
            await self.refuse(thread_id, if_match_sent=pre.if_match is not None)
        return pk

    async def create(self, thread_id: str, values: dict[str, Any], now: datetime,
                     messages: int = 0) -> AnyRow | None:
        """Explicit create with `values` (state, metadata, history_limit): a new id, or a
        tombstoned one started afresh (holding seqs 1..`messages`). None if the thread is
        live."""
        row = await self.repo.insert(thread_id, values, now, messages)
        if row is None:
            row = await self.repo.revive(thread_id, values, now, messages)
        if row is not None:
            self.record("created", thread_id, row.revision)
            await self._keep(row)
        return row

    async def insert(self, thread_id: str, values: dict[str, Any], now: datetime,
                     messages: int = 0) -> AnyRow | None:
        """Create a new id only, never revive a tombstone; None if the id exists."""
        row = await self.repo.insert(thread_id, values, now, messages)
        if row is not None:
            self.record("created", thread_id, row.revision)
            await self._keep(row)
        return row

    async def advance(self, thread_id: str, pre: Preconditions, *, seqs: int = 0,
                      live_delta: int = 0, values: dict[str, Any] | None = None,
                      returning: Returning = "keys", create: bool = False) -> AnyRow:
        """One new revision of a live thread, if `pre`'s If-Match names the current one.

        `values` replace the state or metadata; `seqs` message seqs are handed out (the last
        in `last_seq`) and `live_delta` is added to the live-message count. With `create`, a
        thread that does not exist (and no If-Match) is created first, as appends do. A
        refused write raises why: 404, 410 or 412.
        """
        expected = pre.expected_revisions()
        row = await self.repo.advance(thread_id, values=values, expected=expected, seqs=seqs,
                                      live_delta=live_delta, returning=returning)
        if row is not None:
            return await self._keep(row, values) if values else row
        if create and pre.if_match is None:
            # Also the path of a thread another request created since our UPDATE.
            await self.for_child_write(thread_id)
            row = await self.repo.advance(thread_id, values=values, seqs=seqs,
                                          live_delta=live_delta, returning=returning)
            if row is None:  # deleted between the create and here
                raise _deleted(thread_id)
            return await self._keep(row, values) if values else row
        await self.refuse(thread_id, if_match_sent=pre.if_match is not None)

    async def replace_at_once(self, thread_id: str, pre: Preconditions,
                              values: dict[str, Any]) -> AnyRow | None:
        """Postgres: `advance` with `values`, its history and its `thread.updated` event in
        one statement (`ThreadRepository.advance_keeping`), alone in autocommit where the
        unit allows it (`UnitOfWork.autocommit`): one round trip where the transaction takes
        five. The event goes in the statement only when none is pending before it (events
        keep the order of their changes); else it is recorded as usual. Refuses as `advance`
        does (404, 410, 412). None on SQLite: the caller takes `advance`."""
        if dialect_name(self.uow.connection) != "postgresql":
            return None
        alone = await self.uow.autocommit()
        together = all(event.stored for event in self.uow.events)
        resource = thread_path(thread_id)
        row = await self.repo.advance_keeping(
            thread_id, values=values, expected=pre.expected_revisions(),
            window=self.settings.thread_history,
            event=(self.uow.principal.actor, resource) if together else None)
        if row is None:  # nothing was written
            if alone:
                await self.uow.transactional()
            await self.refuse(thread_id, if_match_sent=pre.if_match is not None)
        if together:
            self.uow.recorded("thread.updated", resource, revision=row.revision,
                              thread_id=thread_id)
        else:
            self.record("updated", thread_id, row.revision)
        return row

    async def add_live(self, row: AnyRow, delta: int) -> None:
        """Correct the live-message count of a thread `advance` just gave `row` (whose lock
        this transaction holds) by `delta`."""
        if delta:
            await self.repo.add_live(row.id, delta)

    async def refuse(self, thread_id: str, *, if_match_sent: bool = True) -> NoReturn:
        """Explain why a conditional write to the thread touched no row: gone (410), missing
        (404, when no If-Match named a revision) or a lost race (412)."""
        row = await self.repo.get(thread_id, returning="keys")
        if row is not None and row.deleted_at is not None:
            raise _deleted(thread_id)
        if row is None and not if_match_sent:
            raise _missing(thread_id)
        raise RevisionMismatch(row.revision if row is not None else None)

    async def lock_all(self, thread_ids: Collection[str]) -> dict[str, AnyRow | None]:
        """Each thread's row (None: no such thread), locked as `locked` locks one, all in one
        statement that takes them in `thread_id` order: for `locked(..., held=)`."""
        rows = {row.thread_id: row for row in await self.repo.get_many(list(thread_ids))}
        return {thread_id: rows.get(thread_id) for thread_id in thread_ids}

    async def locked(self, thread_id: str, pre: Preconditions, method: str,
                     held: dict[str, AnyRow | None] | None = None) -> AnyRow:
        """The live row, locked against other writers, after section 2's checks
        (404/410/412/428): for writes that read the row before they change it. A row in
        `held` (from `lock_all`, and not changed since by this transaction) is taken from
        there, once, instead of read again."""
        if held is not None and thread_id in held:
            row = held.pop(thread_id)
        else:
            row = await self.repo.get(thread_id, lock="update")
        if row is not None and row.deleted_at is not None:
            raise _deleted(thread_id)
        check_preconditions(pre, row.revision if row is not None else None, method=method,
                            noun="thread", required=self.settings.require_preconditions)
        if row is None:
            raise _missing(thread_id)
        return row

    async def change(self, row: AnyRow, values: dict[str, Any], seqs: int = 0) -> AnyRow:
        """The next revision of a row this transaction holds locked (see `locked`), guarded
        by the revision it was judged at, handing out `seqs` message seqs for messages
        appended under it; records `thread.updated`."""
        updated = await self.repo.advance(row.thread_id, values=values, expected=[row.revision],
                                          seqs=seqs, live_delta=seqs, returning="stored")
        if updated is None:  # only if the lock was not held (cannot happen on either backend)
            await self.refuse(row.thread_id)
        self.record("updated", row.thread_id, updated.revision)
        return await self._keep(updated, values)

    async def for_child_write(self, thread_id: str, *, create: bool = True) -> AnyRow:
        """For writes to a thread's children that do not change its revision (agent states):
        the live thread's keys, the thread created with empty state if it does not exist (and
        `create`), 410 if tombstoned, 404 if missing.

        On Postgres the row is held FOR KEY SHARE, so a concurrent DELETE waits for this
        transaction instead of leaving orphans or failing a foreign key.
        """
        row = await self.repo.get(thread_id, lock="share", returning="keys")
        if row is None and create:
            # Insert only, never revive: a tombstone committed since our read (a DELETE that
            # won the race) must answer 410, not be resurrected by a late writer.
            row = await self.insert(thread_id, {"state": {}, "metadata": {}}, utcnow())
            if row is None:  # lost a race; the winner's row (live or tombstone) is there now
                row = await self.repo.get(thread_id, lock="share", returning="keys")
        if row is None:
            raise _missing(thread_id)
        if row.deleted_at is not None:
            raise _deleted(thread_id)
        return row

    async def expire(self, thread_id: str, now: datetime) -> int | None:
        """The retention sweeper's delete: if the thread's time to live has passed (counted
        from its last write), delete it like DELETE does (tombstone, `thread.deleted`) and
        return the tombstone's revision; None if it was written (or deleted) since."""
        row = await self.repo.get(thread_id, lock="update")
        if (row is None or row.deleted_at is not None or row.ttl_seconds is None
                or row.updated_at + timedelta(seconds=row.ttl_seconds) > now):
            return None
        if await self._referrer(row) is not None:
            return None  # kept while other threads' messages continue its messages
        revision = await self.repo.delete(thread_id, row.revision, now)
        if revision is not None:
            self.record("deleted", thread_id, revision)
        return revision

    async def _referrer(self, row: AnyRow) -> tuple[str, str] | None:
        """A message of another thread that continues one of this thread's (`parent_id`)."""
        return await MessageRepository(self.uow.connection, self.uow.tenant_id).referrer(
            row.thread_id, row.id)

    async def delete(self, thread_id: str, pre: Preconditions) -> int:
        """Delete the thread and everything in it, leaving a tombstone; its revision."""
        row = await self.locked(thread_id, pre, "DELETE")
        # Under the row's lock: an append that links into the thread holds the row FOR SHARE
        # until it commits, so its link is either seen here or never written.
        refuse_referenced(await self._referrer(row), "deleting the thread")
        revision = await self.repo.delete(thread_id, row.revision, utcnow())
        if revision is None:  # only if the lock was not held (cannot happen on either backend)
            await self.refuse(thread_id)
        self.record("deleted", thread_id, revision)
        return revision
