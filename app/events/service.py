"""Recording audit events: buffered during the request, written just before commit.

Writing every event of a request as the last statements of its transaction, under a
per-tenant transaction lock on Postgres, makes events commit in `seq` order: a poller that
reads "everything after seq N" can never miss an event that commits later with a smaller seq.
(SQLite serialises writers anyway.) The lock is held only from these inserts to the commit.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import bindparam, func, insert, select, union_all
from sqlalchemy.ext.asyncio import AsyncConnection

from app.auth.dependencies import Principal
from app.core.errors import InvalidCursor
from app.core.pagination import decode_cursor, encode_cursor
from app.db.base import utcnow
from app.db.engine import PENDING_EVENTS
from app.events.models import Event
from app.events.repository import EventRepository
from app.events.schemas import EventOut, EventPage

_LOCK_NAMESPACE = 0x61677374  # "agst"
CURSOR = "events"
_COLUMNS = ("tenant_id", "actor", "type", "resource", "revision", "thread_id", "at")
_events = Event.__table__


def record(
    session: AsyncConnection,
    principal: Principal,
    type: str,
    resource: str,
    *,
    revision: int | None,
    thread_id: str | None = None,
) -> None:
    """Queue one event; it is written in this request's transaction, or not at all."""
    session.info.setdefault(PENDING_EVENTS, []).append(
        {
            "tenant_id": principal.tenant_id,
            "actor": principal.actor,
            "type": type,
            "resource": resource,
            "revision": revision,
            "thread_id": thread_id,
        }
    )


async def flush_events(session: AsyncConnection) -> None:
    pending = session.info.pop(PENDING_EVENTS, None)
    if not pending:
        return
    at = utcnow()
    rows = [{**event, "at": at} for event in pending]
    if session.dialect.name != "postgresql":
        # Core, not the ORM bulk path: nothing here needs the identity map.
        await session.execute(insert(_events), rows)
        return
    for tenant_id in sorted({row["tenant_id"] for row in rows}):
        mine = [row for row in rows if row["tenant_id"] == tenant_id]
        params = {f"{name}_{i}": row[name] for i, row in enumerate(mine) for name in _COLUMNS}
        await session.execute(_locked_insert(len(mine)), {"lock_tenant": tenant_id, **params})


@cache
def _locked_insert(count: int) -> Any:
    """One statement that takes the tenant's event lock and then inserts `count` rows in order.

    The lock is a MATERIALIZED CTE the inserted rows are selected from, so it is held before
    any `seq` is drawn, and the request pays no round trip of its own for it.
    """
    tenant = bindparam("lock_tenant", type_=_events.c.tenant_id.type)
    lock = (
        select(func.pg_advisory_xact_lock(_LOCK_NAMESPACE, func.hashtext(tenant)).label("held"))
        .cte("event_lock")
        .prefix_with("MATERIALIZED")
    )
    selects = [
        # asyncpg binds carry their type ($1::VARCHAR), so no branch has an unknown NULL.
        select(*(bindparam(f"{name}_{i}", type_=_events.c[name].type) for name in _COLUMNS))
        .select_from(lock)
        for i in range(count)
    ]
    source = selects[0] if count == 1 else union_all(*selects)
    return insert(_events).from_select(_COLUMNS, source)


class EventService:
    def __init__(self, session: AsyncConnection, principal: Principal) -> None:
        self.repo = EventRepository(session, principal.tenant_id)

    async def list(self, *, limit: int, cursor: str | None, after: int | None,
                   thread_id: str | None, types: list[str] | None) -> EventPage:
        """A page of the log after `cursor` (or `after`, a seq). The next cursor is never null:
        on an empty page it stays where the caller was, so polling with it misses nothing."""
        if cursor is not None:
            (after,) = decode_cursor(CURSOR, cursor, 1) or (None,)
            if not isinstance(after, int) or isinstance(after, bool) or after < 0:
                raise InvalidCursor("The cursor is not one this list handed out.")
        start = after or 0
        rows = await self.repo.list(after_seq=start, limit=limit + 1, thread_id=thread_id,
                                    types=types)
        page, more = rows[:limit], len(rows) > limit
        last = page[-1].seq if page else start
        return EventPage(
            data=[EventOut.model_validate(row, from_attributes=True) for row in page],
            next_cursor=encode_cursor(CURSOR, [last]), has_more=more,
        )
