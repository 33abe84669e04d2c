"""The unit of work of one request: its connection, who is calling, the settings it runs
under, and the audit events its changes produced.

Built by the request dependencies (`app/http/dependencies.py`) and passed to every service. A
write's events are written by `app.events.repository.EventRepository.append` as the last
statements of its transaction, just before the commit, so a failed request writes none (on
Postgres a store item's PUT writes its own in its statement, `recorded`, and a checkpoint
write in the statement of its rows, `hand_over`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.principal import Principal
from app.core.revisions import NONE, Preconditions
from app.core.settings import Settings
from app.db import direct


@dataclass(frozen=True)
class PendingEvent:
    type: str
    resource: str
    revision: int | None
    thread_id: str | None
    # Written already, by the statement of the change itself (a store item's PUT on
    # Postgres): `append` skips it; it still tells the feed the tenant has news.
    stored: bool = False


@dataclass(eq=False)
class UnitOfWork:
    connection: AsyncConnection
    principal: Principal
    # The application's settings, carried here so a route needs no dependency of its own
    # for them (a level of dependencies, about 80 Python calls a request).
    settings: Settings
    # The precondition headers the route reads (If-Match, If-None-Match), parsed.
    preconditions: Preconditions = NONE
    events: list[PendingEvent] = field(default_factory=list)
    # Several changes that commit together (a batch of operations): none of them may
    # commit alone (`autocommit` says no).
    together: bool = False

    @property
    def tenant_id(self) -> str:
        return self.principal.tenant_id

    def record(self, type: str, resource: str, *, revision: int | None,
               thread_id: str | None = None) -> None:
        """Queue one audit event: it is written in this unit's transaction, or not at all."""
        self.events.append(PendingEvent(type, resource, revision, thread_id))

    async def autocommit(self) -> bool:
        """Before the unit's first statement and event: let its one statement, which
        writes its own events (`hand_over`), commit by itself, with no BEGIN and COMMIT (a
        round trip each; `app.db.direct.alone`). Postgres only, and not through a
        transaction pooler (there the statement timeout is set per transaction). False
        where it cannot be. The unit runs no other statement after that one, unless it
        calls `transactional` first."""
        return (self.connection.dialect.name == "postgresql" and not self.settings.pooled
                and not self.together and not self.events and direct.alone(self.connection))

    async def transactional(self) -> None:
        """Back from `autocommit`, after a statement that stored nothing: the next statement
        begins the unit's transaction."""
        direct.together(self.connection)

    def settled(self) -> bool:
        """Its one statement ran alone and committed by itself with every event it
        recorded (`autocommit`): nothing is left to send or to commit."""
        return (direct.running_alone(self.connection)
                and direct.idle(self.connection) is not None
                and all(event.stored for event in self.events))

    def hand_over(self, since: int) -> list[PendingEvent]:
        """The events queued from index `since` on, for the change's own statement to write
        (marked `stored`, so `append` does not write them again); none if an event queued
        before them is still pending (events keep the order of their changes)."""
        if any(not event.stored for event in self.events[:since]):
            return []
        taken = [event for event in self.events[since:] if not event.stored]
        self.events[since:] = [replace(event, stored=True) for event in self.events[since:]]
        return taken

    def recorded(self, type: str, resource: str, *, revision: int | None,
                 thread_id: str | None = None) -> None:
        """Note an audit event the change's own statement wrote (in this transaction). Only
        when no event is pending: events keep the order of their changes."""
        assert not any(not event.stored for event in self.events)
        self.events.append(PendingEvent(type, resource, revision, thread_id, stored=True))


