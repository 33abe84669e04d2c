"""Errors that only message writes raise."""

from __future__ import annotations

from app.core.errors import Conflict, Unprocessable


class MessageExists(Conflict):
    code, title = "message_exists", "Message already exists"


def refuse_taken(taken: str | None) -> None:
    """409 for a client-chosen message id the thread already has (as `MessageRepository.append`
    or `taken_id` found it)."""
    if taken is not None:
        raise MessageExists(
            f"Message {taken!r} already exists in this thread; nothing was written.")


class MessageCompacted(Conflict):
    """A removal or redaction aimed at a message a live compaction replaced or wrote: revert
    the compaction first, or the record would name messages that are gone."""

    code, title = "message_compacted", "Message is part of a live compaction"


class ParentNotFound(Unprocessable):
    """A `parent_id` that names no message of the tenant (nor an earlier one of the request)."""

    code, title = "parent_not_found", "Parent message not found"


class MessageAmbiguous(Conflict):
    """An id that more than one message of the tenant carries (a forked thread copies its
    source's ids), so it cannot name one message across threads."""

    code, title = "message_ambiguous", "Message id is ambiguous"


class MessageReferenced(Conflict):
    """A delete or removal that would take messages other messages continue (`parent_id`):
    the lineage of those would break. Nothing is changed."""

    code, title = "message_referenced", "Message is a parent of other messages"


def refuse_referenced(referrer: tuple[str, str] | None, what: str) -> None:
    """409 when `referrer` (thread id, message id) continues a message `what` would take."""
    if referrer is not None:
        thread_id, message_id = referrer
        raise MessageReferenced(
            f"Message {message_id!r} of thread {thread_id!r} continues a message {what} would "
            "take (its parent_id); nothing was changed.")
