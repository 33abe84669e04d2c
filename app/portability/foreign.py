"""Importers for the stores agentstate replaces (filled in below)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from app.portability.service import Item


def foreign_items(fmt: str, source: str, tenant_id: str) -> AsyncIterator[Item]:
    raise NotImplementedError(fmt)
