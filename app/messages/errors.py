"""Errors that only message writes raise."""

from __future__ import annotations

from app.core.errors import Conflict


class MessageExists(Conflict):
    code, title = "message_exists", "Message already exists"


def refuse_taken(taken: str | None) -> None:
    """409 for a client-chosen message id the thread already has (`MessageRepository.taken_id`)."""
    if taken is not None:
        raise MessageExists(
            f"Message {taken!r} already exists in this thread; nothing was written.")


class MessageCompacted(Conflict):
    """A removal or redaction aimed at a message a live compaction replaced or wrote: revert
    the compaction first, or the record would name messages that are gone."""

    code, title = "message_compacted", "Message is part of a live compaction"
