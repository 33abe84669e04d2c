"""Section 2 of the contract for resources stored by `app.db.revisioned.RevisionedRepository`
(agent states, MCP servers): one place decides 201/200/404/412/428 for PUT, PATCH, DELETE.

Each write locks the row, judges the preconditions against it and bumps the revision in SQL,
guarded by the revision it judged. A create race ends in INSERT ... ON CONFLICT DO NOTHING;
the loser then judges the winner's row like any existing one (412 or 428, never a 500).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

from app.core.conditional import Preconditions, check_preconditions
from app.core.errors import Conflict, NotFound, RevisionMismatch

Key = tuple[str, ...]
# The stored values a write produces, from the live row it replaces (None: it creates).
Values = Callable[[Any | None], dict[str, Any]]


class Rows(Protocol):
    async def get(self, key: Key, *, lock: bool = False) -> Any: ...
    async def create(self, key: Key, values: dict[str, Any], now: datetime) -> Any: ...
    async def update(self, key: Key, values: dict[str, Any], expected: int) -> Any: ...
    async def tombstone(self, key: Key, expected: int, values: dict[str, Any],
                        now: datetime) -> int | None: ...


class RevisionedResource:
    def __init__(self, rows: Rows, key: Key, *, noun: str, label: str, required: bool) -> None:
        self.rows = rows
        self.key = key
        self.noun = noun  # "agent state", for 428 details
        self.label = label  # "Agent state 'planner' of thread 't1'", for 404 details
        self.required = required  # settings.require_preconditions

    async def _live(self, *, lock: bool) -> Any:
        row = await self.rows.get(self.key, lock=lock)
        return row if row is not None and row.deleted_at is None else None

    def _check(self, pre: Preconditions, row: Any, method: str) -> None:
        check_preconditions(pre, row.revision if row is not None else None,
                            required=self.required, method=method, noun=self.noun)

    def _not_found(self) -> NotFound:
        return NotFound(f"{self.label} does not exist.")

    async def get(self) -> Any:
        row = await self._live(lock=False)
        if row is None:
            raise self._not_found()
        return row

    async def put(self, pre: Preconditions, values: Values, now: datetime) -> tuple[Any, bool]:
        """Create or replace; returns the row and whether it was created."""
        row = await self._live(lock=True)
        self._check(pre, row, "PUT")
        if row is None:
            created = await self.rows.create(self.key, values(None), now)
            if created is not None:
                return created, True
            row = await self._live(lock=True)  # a concurrent create won: judge its row
            if row is None:
                raise Conflict(f"{self.label} changed concurrently; retry.")
            self._check(pre, row, "PUT")
        return await self._update(row, values(row)), False

    async def patch(self, pre: Preconditions, values: Values) -> Any:
        row = await self._live(lock=True)
        self._check(pre, row, "PATCH")
        if row is None:
            raise self._not_found()
        return await self._update(row, values(row))

    async def delete(self, pre: Preconditions, blank: dict[str, Any], now: datetime) -> int:
        """Tombstone the resource; returns the revision the deletion took."""
        row = await self._live(lock=True)
        self._check(pre, row, "DELETE")
        if row is None:
            raise self._not_found()
        revision = await self.rows.tombstone(self.key, row.revision, blank, now)
        if revision is None:  # only if the row lock was not held (cannot happen on either backend)
            raise RevisionMismatch(None)
        return revision

    async def _update(self, row: Any, values: dict[str, Any]) -> Any:
        updated = await self.rows.update(self.key, values, row.revision)
        if updated is None:  # as above: the lock makes this unreachable in practice
            current = await self._live(lock=False)
            raise RevisionMismatch(current.revision if current is not None else None)
        return updated
