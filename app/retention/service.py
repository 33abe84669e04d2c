"""Retention (docs/events.md, docs/operations.md): events, tombstones and idempotency records
kept for a configured time, threads with a `ttl_seconds` deleted once it has passed, and
store items past their `expires_at` blanked into tombstones.

`sweep()` removes what is due a batch (`AGENTSTATE_SWEEP_BATCH` rows) per transaction, so no
lock is held for long and writers interleave; a sweep takes at most `MAX_BATCHES` batches of
each kind and the next sweep continues. `serve` runs one every `AGENTSTATE_SWEEP_INTERVAL_SECONDS`
(`Sweeper`), `agentstate gc` runs one on demand, `--dry-run` only counts. Several servers may
sweep at once: deleting what another sweep deleted deletes nothing, and a thread is expired
under its row lock, after checking again that its time to live has passed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from app.core.principal import Principal
from app.core.settings import Settings
from app.db.base import utcnow
from app.db.engine import Database
from app.db.unit import PendingEvent, UnitOfWork
from app.events.feed import Feed
from app.events.repository import EventRepository
from app.retention.repository import RetentionRepository
from app.store.addressing import item_path
from app.threads.aggregate import ThreadAggregate

log = logging.getLogger("agentstate.retention")
ACTOR = "retention"  # the `actor` of the events an expiry writes
MAX_BATCHES = 100


@dataclass
class SweepReport:
    expired_threads: int = 0
    events: int = 0
    tombstones: int = 0
    idempotency_keys: int = 0
    expired_store_items: int = 0
    store_tombstones: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class Retention:
    def __init__(self, db: Database, settings: Settings, feed: Feed | None = None) -> None:
        self.db = db
        self.settings = settings
        self.feed = feed
        self.batch = settings.sweep_batch

    def _cutoff(self, hours: float | None, now: datetime) -> datetime | None:
        return now - timedelta(hours=hours) if hours is not None else None

    async def count(self, now: datetime | None = None) -> SweepReport:
        """What a sweep would remove now (`agentstate gc --dry-run`)."""
        now = now or utcnow()
        report = SweepReport()
        async with self.db.read() as connection:
            repo = RetentionRepository(connection)
            report.expired_threads = await repo.count_expired_threads(now)
            if (cut := self._cutoff(self.settings.event_retention_hours, now)) is not None:
                report.events = await repo.count_events(cut)
            if (cut := self._cutoff(self.settings.tombstone_retention_hours, now)) is not None:
                report.tombstones = await repo.count_tombstones(cut)
            report.idempotency_keys = await repo.count_idempotency_keys(
                now - timedelta(hours=self.settings.idempotency_ttl_hours))
            report.expired_store_items = await repo.count_expired_store_items(now)
            if (cut := self._cutoff(self.settings.tombstone_retention_hours, now)) is not None:
                report.store_tombstones = await repo.count_store_tombstones(cut)
        return report

    async def sweep(self, now: datetime | None = None) -> SweepReport:
        """Remove what is due at `now` (default: the clock)."""
        now = now or utcnow()
        report = SweepReport()
        report.expired_threads = await self._expire_threads(now)
        if (events_cut := self._cutoff(self.settings.event_retention_hours, now)) is not None:
            report.events = await self._batches(
                lambda repo: repo.old_event_ids(events_cut, self.batch),
                lambda repo, ids: repo.delete_events(ids))
        tombstones_cut = self._cutoff(self.settings.tombstone_retention_hours, now)
        if tombstones_cut is not None:
            report.tombstones = await self._batches(
                lambda repo: repo.old_tombstones(tombstones_cut, self.batch),
                lambda repo, ids: repo.delete_threads(ids))
        keys_cut = now - timedelta(hours=self.settings.idempotency_ttl_hours)
        report.idempotency_keys = await self._batches(
            lambda repo: repo.old_idempotency_keys(keys_cut, self.batch),
            lambda repo, ids: repo.delete_idempotency_keys(ids))
        report.idempotency_keys += await self._batches(
            lambda repo: repo.old_idempotency_keys(keys_cut, self.batch, of_tenants=True),
            lambda repo, ids: repo.delete_idempotency_keys(ids, of_tenants=True))
        report.expired_store_items = await self._expire_store_items(now)
        if tombstones_cut is not None:
            report.store_tombstones = await self._batches(
                lambda repo: repo.old_store_tombstones(tombstones_cut, self.batch),
                lambda repo, ids: repo.delete_store_items(ids))
        return report

    async def _expire_store_items(self, now: datetime) -> int:
        """Expired store items become tombstones, a batch per transaction, each with a
        `store.item.expired` event (actor "retention"). Reads stopped returning them at
        their expiry already; this frees their content."""
        expired = 0
        for _ in range(MAX_BATCHES):
            async with self.db.write() as connection, connection.begin():
                repo = RetentionRepository(connection)
                due = await repo.expired_store_items(now, self.batch)
                done = await repo.expire_store_items(due, now)
                by_tenant: dict[str, list[PendingEvent]] = {}
                for row in done:
                    by_tenant.setdefault(row.tenant_id, []).append(PendingEvent(
                        "store.item.expired", item_path(row.namespace, row.key), row.revision,
                        None))
                for tenant_id, events in by_tenant.items():
                    await EventRepository(connection, tenant_id).append(ACTOR, events)
            expired += len(done)
            if self.feed is not None:
                for tenant_id in by_tenant:
                    self.feed.written(tenant_id)
            if len(due) < self.batch:
                break
        return expired

    async def _batches(self, find: Callable[[RetentionRepository], Awaitable[list[int]]],
                       remove: Callable[[RetentionRepository, list[int]], Awaitable[int]]
                       ) -> int:
        removed = 0
        for _ in range(MAX_BATCHES):
            async with self.db.write() as connection, connection.begin():
                repo = RetentionRepository(connection)
                ids = await find(repo)
                if ids:
                    removed += await remove(repo, ids)
            if len(ids) < self.batch:
                break
        return removed

    async def _expire_threads(self, now: datetime) -> int:
        async with self.db.read() as connection:
            due = await RetentionRepository(connection).expired_threads(
                now, self.batch * MAX_BATCHES)
        expired = 0
        for tenant_id, thread_id in due:
            # One transaction per thread, exactly as a DELETE request: tombstone and event.
            principal = Principal(tenant_id, ACTOR, frozenset())
            async with self.db.write() as connection, connection.begin():
                uow = UnitOfWork(connection, principal, self.settings)
                if await ThreadAggregate(uow).expire(thread_id, now) is not None:
                    expired += 1
                await EventRepository(connection, tenant_id).append(ACTOR, uow.events)
            if self.feed is not None:
                self.feed.written(tenant_id)
        return expired


class Sweeper:
    """The background sweep of `serve`: one `Retention.sweep()` per interval."""

    def __init__(self, retention: Retention, interval: float) -> None:
        self.retention = retention
        self.interval = interval
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="agentstate-sweeper")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                report = await self.retention.sweep()
            except Exception as exc:  # noqa: BLE001 - a failed sweep is retried next interval
                log.warning("retention sweep failed", extra={"error": type(exc).__name__})
                continue
            if any(report.as_dict().values()):
                log.info("retention sweep", extra=report.as_dict())
