"""Readiness: can we reach the database, and is its schema at the newest migration?"""

from __future__ import annotations

from app.core.errors import NotReady
from app.db import migrate
from app.db.engine import Database


async def check_ready(db: Database, head: str | None, retry_after: int) -> str | None:
    """The schema revision, or NotReady (503 with Retry-After)."""
    retry = {"Retry-After": str(retry_after)}
    try:
        current = await migrate.current_revision(db.engine)
    except Exception:  # noqa: BLE001 - any failure to reach the database means not ready
        raise NotReady("The database is unreachable.", headers=retry) from None
    if current != head:
        raise NotReady(
            f"The database schema is at {current or 'nothing'}, not {head}; "
            "run `agentstate migrate`.",
            headers=retry,
        )
    return current
