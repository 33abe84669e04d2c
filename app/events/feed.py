"""The in-process side of watching: who waits for which tenant, and waking them.

A watcher (a long poll, an SSE stream) reads with a short-lived connection, and when it has
read everything it waits here on its tenant's signal, holding no database connection. The
signal is raised when the tenant's feed may have grown:

- on Postgres, by the process's one `Listener` when the sequencer (run by any process)
  NOTIFYs that it numbered the tenant's events; through a transaction pooler with no direct
  URL to LISTEN on, by a poll of the watched tenants' newest seqs (one statement every
  `events_poll_seconds`, which bounds the delivery latency of other servers' writes);
- on SQLite, by the write dependency after it commits (and by the tick, for other processes).

Writers call `written(tenant)` after they committed events. On Postgres that schedules one
sequencing pass per tenant (coalesced: while a pass runs, more writes only mark it to run
again, and each pass waits `COALESCE_SECONDS` for the writes that follow), which numbers what is
ready and NOTIFYs every server. A tick every
`events_tick_seconds` runs a pass for each tenant this process has watchers of, so an event
whose writer died between its commit and its pass is still delivered within a tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Hashable, Iterator
from typing import Any

from app.core.settings import Settings
from app.db.engine import Database
from app.db.listener import Listener, session_url
from app.events.repository import EventRepository

log = logging.getLogger("agentstate.feed")
COALESCE_SECONDS = 0.02  # how long a write's sequencing pass waits for the writes after it


class Feed:
    def __init__(self, db: Database, settings: Settings) -> None:
        self.db = db
        self.settings = settings
        self.postgres = db.dialect == "postgresql"
        self._signals: dict[str, asyncio.Event] = {}
        self._watchers: dict[str, int] = {}
        self._heads: dict[str, int] = {}
        self._running: dict[str, bool] = {}  # tenant -> another pass requested
        self._tasks: set[asyncio.Task[None]] = set()
        self._reads: dict[Hashable, asyncio.Future[Any]] = {}
        self._tick: asyncio.Task[None] | None = None
        self._poll: asyncio.Task[None] | None = None
        self.listener: Listener | None = None
        # The server is shutting down: streams and long polls end instead of holding the
        # shutdown until its graceful timeout (clients resume elsewhere from their cursor).
        self.closing = False

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        self._tick = asyncio.create_task(self._ticking(), name="agentstate-feed-tick")

    async def stop(self) -> None:
        loops = [task for task in (self._tick, self._poll) if task is not None]
        for task in [*loops, *self._tasks]:
            task.cancel()
        await asyncio.gather(*loops, *self._tasks, return_exceptions=True)
        if self.listener is not None:
            await self.listener.stop()
        self.wake_all()

    # --- waiting --------------------------------------------------------------------------

    def signal(self, tenant: str) -> asyncio.Event:
        """The event the next wake-up of `tenant` sets. Take it *before* reading, then wait
        on it if the read found nothing: a wake-up between the two is not lost."""
        signal = self._signals.get(tenant)
        if signal is None:
            signal = self._signals[tenant] = asyncio.Event()
        return signal

    @contextlib.contextmanager
    def watching(self, tenant: str) -> Iterator[None]:
        """Count a watcher of `tenant` while it is open (the tick serves watched tenants).
        The first watcher of the process opens the listener connection: a server nobody
        watches holds none."""
        if self.postgres and self.listener is None and self._poll is None:
            url = session_url(self.settings)
            if url is None:
                self._poll = asyncio.create_task(self._polling(), name="agentstate-feed-poll")
            else:
                self.listener = Listener(url, self.wake, self.wake_all,
                                         self.settings.connect_timeout)
                self.listener.start()
        self._watchers[tenant] = self._watchers.get(tenant, 0) + 1
        try:
            yield
        finally:
            left = self._watchers[tenant] - 1
            if left:
                self._watchers[tenant] = left
            else:
                del self._watchers[tenant]
                self._heads.pop(tenant, None)
                if tenant not in self._running:
                    self._signals.pop(tenant, None)

    def watchers(self) -> int:
        return sum(self._watchers.values())

    def wake(self, tenant: str) -> None:
        signal = self._signals.pop(tenant, None)
        if signal is not None:
            signal.set()

    def wake_all(self) -> None:
        for tenant in list(self._signals):
            self.wake(tenant)

    def close_watchers(self) -> None:
        """End every stream and long poll now (see `closing`)."""
        self.closing = True
        self.wake_all()

    async def shared(self, key: Hashable, read: Callable[[], Awaitable[Any]]) -> Any:
        """`read()`, or the result of the same read (same `key`) already in flight: a wake-up
        of a thousand watchers at one cursor costs one query, not a thousand."""
        pending = self._reads.get(key)
        if pending is None:
            pending = self._reads[key] = asyncio.ensure_future(read())
            pending.add_done_callback(lambda _f: self._reads.pop(key, None))
        return await asyncio.shield(pending)

    # --- writers --------------------------------------------------------------------------

    @property
    def sequencing(self) -> bool:
        """A sequencing pass of this process is scheduled or running (its statements are
        still to come: a test that counts statements waits for it)."""
        return bool(self._tasks)

    def written(self, tenant: str) -> None:
        """A write transaction of `tenant` committed events in this process."""
        if not self.postgres:
            self.wake(tenant)  # its events were numbered by their insert
            return
        if tenant in self._running:
            self._running[tenant] = True  # run again when the current pass ends
            return
        self._running[tenant] = False
        task = asyncio.get_running_loop().create_task(self._sequence(tenant))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _sequence(self, tenant: str) -> None:
        try:
            while True:
                # Writes of the next moment share this pass (a LangGraph turn is three writes
                # in a row): a watcher hears of them that much later, a writer pays a third.
                # So do the next pass's, under a steady stream of writes: at most one pass per
                # tenant and process every COALESCE_SECONDS, not one per few writes.
                await asyncio.sleep(COALESCE_SECONDS)
                try:
                    await self.pass_for(tenant)
                except Exception as exc:  # noqa: BLE001 - the tick retries; readers sequence too
                    log.warning("feed sequencing pass failed",
                                extra={"error": type(exc).__name__})
                    return
                if not self._running.get(tenant):
                    return
                self._running[tenant] = False
        finally:
            self._running.pop(tenant, None)

    async def pass_for(self, tenant: str) -> int:
        """Number what is ready (Postgres; it NOTIFYs every server if it numbered anything)
        or read the newest seq (SQLite), and wake this process's watchers if it grew."""
        async with self.db.read() as connection:
            head = await EventRepository(connection, tenant).sequence()
        if head > self._heads.get(tenant, 0):
            self._heads[tenant] = head
            self.wake(tenant)
        return head

    async def _polling(self) -> None:
        """Wake the watched tenants whose newest seq grew, read for all of them at once."""
        while True:
            await asyncio.sleep(self.settings.events_poll_seconds)
            tenants = list(self._watchers)
            if not tenants:
                continue
            try:
                async with self.db.read() as connection:
                    heads = await EventRepository(connection, "").heads(tenants)
            except Exception as exc:  # noqa: BLE001 - the next poll tries again
                log.warning("feed poll failed", extra={"error": type(exc).__name__})
                continue
            for tenant, head in heads.items():
                if head > self._heads.get(tenant, 0):
                    self._heads[tenant] = head
                    self.wake(tenant)

    async def _ticking(self) -> None:
        while True:
            await asyncio.sleep(self.settings.events_tick_seconds)
            for tenant in list(self._watchers):
                try:
                    await self.pass_for(tenant)
                except Exception as exc:  # noqa: BLE001 - the next tick tries again
                    log.warning("feed tick failed", extra={"error": type(exc).__name__})
                    break
