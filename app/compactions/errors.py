"""Errors that only compactions raise: their sources must be a contiguous live run."""

from __future__ import annotations

from app.core.errors import Conflict, Unprocessable


class CompactionCovered(Conflict):
    code, title = "compaction_covered", "Compaction is covered by a later one"


class CompactionNotContiguous(Unprocessable):
    code, title = "compaction_not_contiguous", "Sources are not a contiguous run"


class MessageNotLive(Unprocessable):
    code, title = "message_not_live", "Source message is not live"


class MessageNotFound(Unprocessable):
    """A compaction source that is not a message of this thread (a GET of one is a 404)."""

    code, title = "message_not_found", "Source message not found"
