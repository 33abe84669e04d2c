"""Reading the change feed (API.md section 8, docs/events.md). Events are recorded by every
other slice through `UnitOfWork.record` and written by `EventRepository.append` before the
commit; readers number what is ready (`EventRepository.sequence`) before they read.

`EventService` reads a page in the request's unit of work. `EventWatch` serves the long poll
and the SSE stream: it reads with a short-lived connection each time and waits on the
process's `Feed` in between, so a waiting watcher holds no database connection.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.errors import InvalidCursor
from app.core.pagination import bad_cursor, decode_cursor, encode_cursor
from app.core.principal import Principal
from app.core.settings import Settings
from app.db.engine import Database
from app.db.unit import UnitOfWork
from app.events.feed import Feed
from app.events.repository import EventRepository
from app.events.schemas import EventOut, EventPage

CURSOR = "feed"
# Cursors handed out before the per-tenant feed held the table-wide id of an event; they are
# still understood (docs/events.md, "Migration").
LEGACY_CURSOR = "events"


@dataclass(frozen=True)
class Filters:
    thread_id: str | None = None
    types: list[str] | None = None
    resource_prefix: str | None = None


@dataclass(frozen=True)
class Rendered:
    """A page of the feed, and the same events as Server-Sent Events."""

    page: EventPage
    sse: str


def event_cursor(seq: int) -> str:
    return encode_cursor(CURSOR, [seq])


class EventService:
    def __init__(self, uow: UnitOfWork) -> None:
        self.repo = EventRepository(uow.connection, uow.tenant_id)

    async def start(self, cursor: str | None, after: int | None) -> int:
        """The seq a read starts after: the cursor's, else `after`, else 0."""
        if cursor is None:
            return after or 0
        try:
            (seq,) = decode_cursor(CURSOR, cursor, 1) or (None,)
        except InvalidCursor:  # perhaps the older form
            (legacy,) = decode_cursor(LEGACY_CURSOR, cursor, 1) or (None,)
            if not isinstance(legacy, int) or isinstance(legacy, bool) or legacy < 0:
                raise bad_cursor() from None
            return await self.repo.seq_at_id(legacy)
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
            raise bad_cursor()
        return seq

    async def list(self, *, limit: int, cursor: str | None, after: int | None,
                   filters: Filters) -> EventPage:
        """A page of the feed after `cursor` (or `after`, a seq). The next cursor is never
        null: on an empty page it stays where the caller was, so polling with it misses
        nothing."""
        return await self.page(await self.start(cursor, after), limit, filters)

    async def page(self, start: int, limit: int, filters: Filters) -> EventPage:
        await self.repo.sequence()
        rows = await self.repo.page(after_seq=start, limit=limit + 1,
                                    thread_id=filters.thread_id, types=filters.types,
                                    resource_prefix=filters.resource_prefix)
        page, more = rows[:limit], len(rows) > limit
        return EventPage(
            data=[EventOut.from_row(row) for row in page],
            next_cursor=event_cursor(page[-1].seq if page else start), has_more=more,
        )


class EventWatch:
    """Long polls and streams of one caller's tenant."""

    def __init__(self, db: Database, feed: Feed, principal: Principal,
                 settings: Settings) -> None:
        self.db = db
        self.feed = feed
        self.principal = principal
        self.settings = settings
        self.tenant = principal.tenant_id

    def _unit(self, connection: AsyncConnection) -> UnitOfWork:
        return UnitOfWork(connection, self.principal, self.settings)

    async def start(self, cursor: str | None, after: int | None) -> int:
        """The seq a watch starts after (400 for a cursor this feed did not hand out). Only
        a cursor from before the per-tenant feed needs the database."""
        if cursor is not None:
            try:
                (seq,) = decode_cursor(CURSOR, cursor, 1) or (None,)
            except InvalidCursor:
                seq = None  # perhaps the older form: EventService.start decides
            else:
                if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
                    raise bad_cursor()
                return seq
        else:
            return after or 0
        async with self.db.read() as connection:
            return await EventService(self._unit(connection)).start(cursor, after)

    async def _page(self, start: int, limit: int, filters: Filters,
                    signal: asyncio.Event) -> Rendered:
        async def read() -> Rendered:
            async with self.db.read() as connection:
                page = await EventService(self._unit(connection)).page(
                    start, limit, filters)
            return Rendered(page, "".join(
                f"id: {event_cursor(event.seq)}\ndata: "
                f"{json.dumps(event.model_dump(mode='json'), separators=(',', ':'))}\n\n"
                for event in page.data))

        # Watchers woken together at the same cursor share one read, and its rendering as
        # SSE (both immutable). Only watchers holding the same signal share: a read that began
        # before a watcher's last wake-up may miss what woke it.
        key = (signal, self.tenant, start, limit, filters.thread_id,
               tuple(filters.types) if filters.types else None, filters.resource_prefix)
        rendered: Rendered = await self.feed.shared(key, read)
        return rendered

    async def poll(self, *, wait: float, limit: int, cursor: str | None, after: int | None,
                   filters: Filters) -> EventPage:
        """`list`, but an empty answer waits up to `wait` seconds for an event to commit."""
        if wait <= 0:  # a plain page: one connection, as any read
            async with self.db.read() as connection:
                return await EventService(self._unit(connection)).list(
                    limit=limit, cursor=cursor, after=after, filters=filters)
        start = await self.start(cursor, after)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(wait, self.settings.events_max_wait_seconds)
        with self.feed.watching(self.tenant):
            while True:
                signal = self.feed.signal(self.tenant)  # before the read: no lost wake-up
                page = (await self._page(start, limit, filters, signal)).page
                remaining = deadline - loop.time()
                if page.data or remaining <= 0 or self.feed.closing:
                    return page
                try:
                    await asyncio.wait_for(signal.wait(), remaining)
                except TimeoutError:
                    pass  # read once more, then answer

    async def stream(self, start: int, filters: Filters) -> AsyncIterator[str]:
        """Server-Sent Events: one `id: <cursor>` + `data: <event>` per event, a comment
        every `events_heartbeat_seconds` while idle. Reconnecting with `Last-Event-ID`
        resumes after the last event received."""
        heartbeat = self.settings.events_heartbeat_seconds
        yield "retry: 1000\n\n"
        with self.feed.watching(self.tenant):
            while not self.feed.closing:  # the server stops: the client reconnects elsewhere
                signal = self.feed.signal(self.tenant)
                rendered = await self._page(start, 100, filters, signal)
                page = rendered.page
                if page.data:
                    yield rendered.sse
                    start = page.data[-1].seq
                if page.has_more:
                    continue
                try:
                    await asyncio.wait_for(signal.wait(), heartbeat)
                except TimeoutError:
                    yield ": keep-alive\n\n"
