"""Errors that only checkpoint writes raise."""

from __future__ import annotations

from app.core.errors import Conflict, NotFound


class CheckpointExists(Conflict):
    """The (namespace, id) is taken by a checkpoint with other content: checkpoints are
    immutable (the same content again is a replay, answered 200)."""

    code, title = "checkpoint_exists", "Checkpoint exists with other content"


class CheckpointItemsMissing(Conflict):
    """Items sent by digest only that the thread does not hold: send them with their data."""

    code, title = "checkpoint_items_missing", "Items referenced by digest are not stored"


class CheckpointNotFound(NotFound):
    code, title = "checkpoint_not_found", "Checkpoint not found"
