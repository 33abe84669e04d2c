"""Errors that only MCP server writes raise."""

from __future__ import annotations

from app.core.errors import Unprocessable


class UnknownSecret(Unprocessable):
    code = "unknown_secret"
