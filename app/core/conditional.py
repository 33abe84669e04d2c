"""RFC 9110 conditional requests: ETags are `"<revision>"`, If-Match compares strongly."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header

from app.core.errors import (
    AlreadyExists,
    InvalidHeader,
    PreconditionFailed,
    PreconditionRequired,
    RevisionMismatch,
)

_ETAG = re.compile(r'\s*(W/)?"([^"]*)"\s*(?:,|$)')


def etag(revision: int) -> str:
    return f'"{revision}"'


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
            pos = match.end()
        if not tags:
            raise InvalidHeader(f"{header_name} is empty.")
        return cls(any=False, tags=tuple(tags))

    def strong_revisions(self) -> set[int]:
        """Revisions named by strong tags; weak tags never match under strong comparison."""
        return {int(tag) for weak, tag in self.tags if not weak and tag.isdigit()}

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
    if_match: ETagList | None
    if_none_match: ETagList | None

    @property
    def create_only(self) -> bool:
        return self.if_none_match is not None and self.if_none_match.any

    @property
    def any_given(self) -> bool:
        return self.if_match is not None or self.if_none_match is not None


# async: FastAPI runs a plain `def` dependency in its thread pool, a thread hop per request.
async def preconditions(
    if_match: Annotated[
        str | None,
        Header(description='`"<revision>"`, a list of them, or `*`. Strong comparison.'),
    ] = None,
    if_none_match: Annotated[
        str | None, Header(description="`*` to create only; on GET, the ETag you hold.")
    ] = None,
) -> Preconditions:
    return Preconditions(
        ETagList.parse("If-Match", if_match), ETagList.parse("If-None-Match", if_none_match)
    )


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


def not_modified(if_none_match: str | None, revision: int) -> bool:
    """GET with If-None-Match naming the current ETag (weak comparison, RFC 9110 13.1.2)."""
    parsed = ETagList.parse("If-None-Match", if_none_match)
    return parsed is not None and parsed.matches_weak(revision)


Conditions = Annotated[Preconditions, Depends(preconditions)]
