"""Section 2 of the contract, decided in one place: revisions as strong ETags, the parsing of
If-Match / If-None-Match, and what a write may do given the current revision.

`check_preconditions` judges any resource; `RevisionedResource` applies it to the resources
stored one row per key with a tombstone (agent states, MCP servers, see
`app/db/revisioned.py`). Threads use `check_preconditions` through their aggregate
(`app/threads/aggregate.py`). Nothing here knows about HTTP: `app/http/preconditions.py` reads
the headers into a `Preconditions`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from app.core.errors import (
    AlreadyExists,
    Conflict,
    InvalidHeader,
    NotFound,
    PreconditionFailed,
    PreconditionRequired,
    RevisionMismatch,
)

_ETAG = re.compile(r'\s*(W/)?"([^"]*)"\s*(?:,|$)')
# A revision as we write it in an ETag: no sign, no leading zero, ASCII digits, within int64.
# Any other opaque tag is well formed and names no revision (strong comparison is exact).
_REVISION_TAG = re.compile(r"0|[1-9][0-9]{0,18}", re.ASCII)
INT64_MAX = 2**63 - 1
# More entity tags than any client needs: the header is malformed (400), not a database query.
MAX_TAGS = 64


def etag(revision: int) -> str:
    return f'"{revision}"'


def revision_of_tag(tag: str) -> int | None:
    """The revision an opaque tag names exactly as `etag()` writes it, else None."""
    if _REVISION_TAG.fullmatch(tag) is None:
        return None
    revision = int(tag)
    return revision if revision <= INT64_MAX else None


@dataclass(frozen=True)
class ETagList:
    """A parsed If-Match / If-None-Match value: `*` or a list of (weak, opaque-tag)."""

    any: bool
    tags: tuple[tuple[bool, str], ...] = ()

    @classmethod
    def parse(cls, header_name: str, value: str | None) -> ETagList | None:
        if value is None:
            return None
        if value.strip() == "*":
            return cls(any=True)
        tags: list[tuple[bool, str]] = []
        pos = 0
        while pos < len(value):
            match = _ETAG.match(value, pos)
            if match is None or match.end() == pos:
                raise InvalidHeader(
                    f'{header_name} must be "*" or a list of entity tags such as "3" (quotes included).'
                )
            tags.append((match.group(1) is not None, match.group(2)))
            if len(tags) > MAX_TAGS:
                raise InvalidHeader(f"{header_name} may list at most {MAX_TAGS} entity tags.")
            pos = match.end()
        if not tags:
            raise InvalidHeader(f"{header_name} is empty.")
        return cls(any=False, tags=tuple(tags))

    def strong_revisions(self) -> set[int]:
        """Revisions named by strong tags; weak tags never match under strong comparison."""
        return {revision for weak, tag in self.tags
                if not weak and (revision := revision_of_tag(tag)) is not None}

    def matches_strong(self, revision: int | None) -> bool:
        if revision is None:
            return False
        return self.any or revision in self.strong_revisions()

    def matches_weak(self, revision: int | None) -> bool:
        if revision is None:
            return False
        return self.any or any(tag == str(revision) for _weak, tag in self.tags)


@dataclass(frozen=True)
class Preconditions:
    """The preconditions of one request. POSTs that take only If-Match leave
    `if_none_match` None."""

    if_match: ETagList | None = None
    if_none_match: ETagList | None = None

    @property
    def create_only(self) -> bool:
        return self.if_none_match is not None and self.if_none_match.any

    @property
    def any_given(self) -> bool:
        return self.if_match is not None or self.if_none_match is not None

    def expected_revisions(self) -> set[int] | None:
        """What a conditional UPDATE may find: None for "any revision" (no If-Match, or `*`)."""
        if self.if_match is None or self.if_match.any:
            return None
        return self.if_match.strong_revisions()


NONE = Preconditions()


def check_preconditions(pre: Preconditions, current: int | None, *, required: bool,
                        method: str, noun: str) -> None:
    """Section 2 for a write to a resource now at revision `current` (None: it does not
    exist). Raises 412 or 428; returning means the write may go ahead."""
    if pre.if_match is not None and not pre.if_match.matches_strong(current):
        raise RevisionMismatch(current)
    if current is None:
        return
    if pre.create_only:
        raise AlreadyExists(current)
    if pre.if_none_match is not None and pre.if_none_match.matches_weak(current):
        raise PreconditionFailed("If-None-Match names the current ETag.",
                                 current_revision=current)
    if required and not pre.any_given:  # off with the last-writer-wins setting
        raise PreconditionRequired(
            f'{method} of an existing {noun} needs If-Match: "<revision>" (the ETag you '
            f"read), or If-Match: * to overwrite whatever is there."
        )


def not_modified(if_none_match: ETagList | None, revision: int) -> bool:
    """GET with If-None-Match naming the current ETag (weak comparison, RFC 9110 13.1.2)."""
    return if_none_match is not None and if_none_match.matches_weak(revision)


# --- resources stored one row per key, with a tombstone ------------------------------------

Key = tuple[str, ...]
# The stored values a write produces, from the live row it replaces (None: it creates).
Values = Callable[[Any | None], dict[str, Any]]


class Rows(Protocol):
    """What `app.db.revisioned.RevisionedRepository` offers."""

    async def get(self, key: Key, *, lock: bool = False) -> Any: ...
    async def create(self, key: Key, values: dict[str, Any], now: datetime) -> Any: ...
    async def update(self, key: Key, values: dict[str, Any], expected: int) -> Any: ...
    async def tombstone(self, key: Key, expected: int, values: dict[str, Any],
                        now: datetime) -> int | None: ...


class RevisionedResource:
    """PUT, PATCH, DELETE and GET of one such resource under section 2.

    Each write locks the row, judges the preconditions against it and bumps the revision in
    SQL, guarded by the revision it judged. A create race ends in INSERT ... ON CONFLICT DO
    NOTHING; the loser then judges the winner's row like any existing one (412 or 428, never
    a 500).
    """

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
