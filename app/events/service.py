"""Reading the audit log (API.md section 8). Events are recorded by every other slice through
`UnitOfWork.record` and written by `EventRepository.append` before the commit."""

from __future__ import annotations

from app.core.pagination import bad_cursor, decode_cursor, encode_cursor
from app.db.unit import UnitOfWork
from app.events.repository import EventRepository
from app.events.schemas import EventOut, EventPage

CURSOR = "events"


class EventService:
    def __init__(self, uow: UnitOfWork) -> None:
        self.repo = EventRepository(uow.connection, uow.tenant_id)

    async def list(self, *, limit: int, cursor: str | None, after: int | None,
                   thread_id: str | None, types: list[str] | None) -> EventPage:
        """A page of the log after `cursor` (or `after`, a seq). The next cursor is never null:
        on an empty page it stays where the caller was, so polling with it misses nothing."""
        if cursor is not None:
            (after,) = decode_cursor(CURSOR, cursor, 1) or (None,)
            if not isinstance(after, int) or isinstance(after, bool) or after < 0:
                raise bad_cursor()
        start = after or 0
        rows = await self.repo.page(after_seq=start, limit=limit + 1, thread_id=thread_id,
                                    types=types)
        page, more = rows[:limit], len(rows) > limit
        return EventPage(
            data=[EventOut.from_row(row) for row in page],
            next_cursor=encode_cursor(CURSOR, [page[-1].seq if page else start]), has_more=more,
        )
