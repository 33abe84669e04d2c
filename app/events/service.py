"""Recording audit events: buffered during the request, written just before commit.

Writing every event of a request as the last statements of its transaction, under a
per-tenant transaction lock on Postgres, makes events commit in `seq` order: a poller that
reads "everything after seq N" can never miss an event that commits later with a smaller seq.
(SQLite serialises writers anyway.) The lock is held only from these inserts to the commit.
"""

from __future__ import annotations

from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.auth.dependencies import Principal
from app.db.base import utcnow
from app.events.models import Event

_PENDING = "agentstate_pending_events"
_LOCK_NAMESPACE = 0x61677374  # "agst"


def record(
    session: AsyncSession,
    principal: Principal,
    type: str,
    resource: str,
    *,
    revision: int | None,
    thread_id: str | None = None,
) -> None:
    """Queue one event; it is written in this request's transaction, or not at all."""
    session.info.setdefault(_PENDING, []).append(
        {
            "tenant_id": principal.tenant_id,
            "actor": principal.actor,
            "type": type,
            "resource": resource,
            "revision": revision,
            "thread_id": thread_id,
        }
    )


async def flush_events(session: AsyncSession) -> None:
    pending = session.info.pop(_PENDING, None)
    if not pending:
        return
    if session.get_bind().dialect.name == "postgresql":
        for tenant_id in sorted({event["tenant_id"] for event in pending}):
            await session.execute(
                select(func.pg_advisory_xact_lock(_LOCK_NAMESPACE, func.hashtext(tenant_id)))
            )
    at = utcnow()
    await session.execute(insert(Event), [{**event, "at": at} for event in pending])
