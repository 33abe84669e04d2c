"""Appends that need no `Idempotency-Key`: every message carries an id of its own (a
framework's event id, or a fresh one), so a repeat is refused as `MessageExists` instead of
being stored twice, and the key's two statements a write are saved."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentstate_client._async import AsyncAgentStateClient
from agentstate_client.errors import APIConnectionError, NotFound

MAX_ATTEMPTS = 3  # sends of a batch whose connection failed


async def send_once(client: AsyncAgentStateClient, ops: Sequence[dict[str, Any]],
                    thread_id: str, message_id: str) -> list[dict[str, Any]] | None:
    """`ops` (which append the message `message_id` to `thread_id`) as one unkeyed batch,
    sent again when the connection failed, unless the lost attempt was stored: then None."""
    for attempt in range(MAX_ATTEMPTS):
        try:
            return await client.batch(ops, keyed=False)
        except APIConnectionError:
            if attempt == MAX_ATTEMPTS - 1:
                raise
            try:
                await client.get_message(thread_id, message_id)
            except NotFound:
                continue
            return None
    raise AssertionError("unreachable")
