"""The unit of work of one request: its connection, who is calling, and the audit events its
changes produced.

Built by the request dependencies (`app/http/dependencies.py`) and passed to every service. A
write's events are written by `app.events.repository.EventRepository.append` as the last
statements of its transaction, just before the commit, so a failed request writes none.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.principal import Principal


@dataclass(frozen=True)
class PendingEvent:
    type: str
    resource: str
    revision: int | None
    thread_id: str | None


@dataclass(eq=False)
class UnitOfWork:
    connection: AsyncConnection
    principal: Principal
    events: list[PendingEvent] = field(default_factory=list)

    @property
    def tenant_id(self) -> str:
        return self.principal.tenant_id

    def record(self, type: str, resource: str, *, revision: int | None,
               thread_id: str | None = None) -> None:
        """Queue one audit event: it is written in this unit's transaction, or not at all."""
        self.events.append(PendingEvent(type, resource, revision, thread_id))
