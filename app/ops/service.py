"""Readiness: can we reach the database, and is its schema at the newest migration?"""

from __future__ import annotations

import asyncio

from app.core.errors import NotReady
from app.db import migrate
from app.db.diagnosis import diagnose
from app.db.engine import Database


async def check_ready(db: Database, head: str | None, retry_after: int) -> str | None:
    """The schema revision, or NotReady (503 with Retry-After) whose `cause` names why."""
    retry = {"Retry-After": str(retry_after)}
    settings = db.settings
    try:
        async with asyncio.timeout(settings.database_timeout):
            current = await migrate.current_revision(db.engine)
    except Exception as exc:  # noqa: BLE001 - any failure to reach the database means not ready
        found = diagnose(exc, settings.database_url)
        if found is None and isinstance(exc, TimeoutError):
            seconds = f"{settings.database_timeout:g}"
            detail, cause = f"The database did not answer within {seconds} s.", "database_timeout"
        elif found is None:
            detail, cause = "The database is unreachable.", "database_unavailable"
        else:
            detail, cause = found.message[:1].upper() + found.message[1:] + ".", found.code
        raise NotReady(detail, headers=retry, cause=cause) from None
    if db.storage_problem is not None:
        found = db.storage_problem
        raise NotReady(found.message[:1].upper() + found.message[1:] + ".", headers=retry,
                       cause=found.code)
    if current != head:
        raise NotReady(
            f"The database schema is at {current or 'nothing'}, not {head}; "
            "run `agentstate migrate`.",
            headers=retry, cause="schema_not_current",
        )
    return current
