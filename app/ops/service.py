"""Readiness: can we reach the database, and is its schema at the newest migration?"""

from __future__ import annotations

import asyncio

from app.core.errors import NotReady
from app.db import migrate
from app.db.diagnosis import diagnose
from app.db.engine import Database


class ReadinessCheck:
    """/readyz's check, answered within `AGENTSTATE_DATABASE_TIMEOUT` whatever the database
    does (docs/operations.md).

    The probe (pool checkout, connect, ping, the schema query) runs in a task of its own, and
    the answer waits for it at most the timeout. Cancelling the probe is not enough: a probe
    cancelled on a stalled connection still waits for that connection's rollback on the way
    out, which took as long again. A probe that overruns is left to end in the background,
    and probes that arrive meanwhile wait for that one instead of stalling connections of
    their own, so a load balancer polling a stalled database costs one connection.
    """

    def __init__(self, db: Database, head: str | None, retry_after: int) -> None:
        self.db = db
        self.head = head
        self.retry = {"Retry-After": str(retry_after)}
        self._probe: asyncio.Task[str | None] | None = None

    async def check(self) -> str | None:
        """The schema revision, or NotReady (503 with Retry-After) whose `cause` names why."""
        settings = self.db.settings
        if self._probe is None or self._probe.done():
            self._probe = asyncio.create_task(self._revision(settings.database_timeout))
        probe = self._probe
        done, _ = await asyncio.wait({probe}, timeout=settings.database_timeout)
        if not done:
            probe.add_done_callback(_retrieve)  # nobody waits for it any more
            raise self._timeout()
        try:
            current = probe.result()
        except Exception as exc:  # noqa: BLE001 - any failure to reach the database: not ready
            found = diagnose(exc, settings.database_url)
            if found is None and isinstance(exc, TimeoutError):
                raise self._timeout() from None
            if found is None:
                raise NotReady("The database is unreachable.", headers=self.retry,
                               cause="database_unavailable") from None
            raise NotReady(found.message[:1].upper() + found.message[1:] + ".",
                           headers=self.retry, cause=found.code) from None
        if self.db.storage_problem is not None:
            found = self.db.storage_problem
            raise NotReady(found.message[:1].upper() + found.message[1:] + ".",
                           headers=self.retry, cause=found.code)
        if current != self.head:
            raise NotReady(
                f"The database schema is at {current or 'nothing'}, not {self.head}; "
                "run `agentstate migrate`.",
                headers=self.retry, cause="schema_not_current",
            )
        return current

    async def _revision(self, timeout: float) -> str | None:
        async with asyncio.timeout(timeout):
            return await migrate.current_revision(self.db.engine)

    def _timeout(self) -> NotReady:
        seconds = f"{self.db.settings.database_timeout:g}"
        return NotReady(f"The database did not answer within {seconds} s.", headers=self.retry,
                        cause="database_timeout")


def _retrieve(task: asyncio.Task[str | None]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved, so a probe that failed late is not logged as unawaited
