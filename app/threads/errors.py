"""Errors that only thread writes raise."""

from __future__ import annotations

from app.core.errors import Conflict, Gone


class ThreadExists(Conflict):
    code, title = "thread_exists", "Thread already exists"


class ThreadDeleted(Gone):
    code, title = "thread_deleted", "Thread was deleted"
