"""What the asyncio framework adapters (ADK, OpenAI Agents SDK, pydantic-ai) share: the
client they own or are given, and appends that need no `Idempotency-Key`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from agentstate_client._async import AsyncAgentStateClient
from agentstate_client.errors import APIConnectionError, NotFound

MAX_ATTEMPTS = 3  # sends of a batch whose connection failed
ITEM_ONLY = ("item",)  # the one member of a message a session reads back (`fields`)

A = TypeVar("A", bound="OwnsClient")


class OwnsClient:
    """An adapter's `AsyncAgentStateClient`: the one passed in, or one made from
    `base_url`/`api_key` (default: `$AGENTSTATE_URL`, `$AGENTSTATE_API_KEY`) that the adapter
    owns and closes in `close()` (also as `async with`)."""

    client: AsyncAgentStateClient
    _owns_client: bool

    def _use_client(self, base_url: str | None, api_key: str | None,
                    client: AsyncAgentStateClient | None) -> None:
        self._owns_client = client is None
        self.client = client or AsyncAgentStateClient(base_url, api_key=api_key)

    async def close(self) -> None:
        """Close the client if the adapter created it."""
        if self._owns_client:
            await self.client.aclose()

    async def __aenter__(self: A) -> A:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


async def send_once(client: AsyncAgentStateClient, ops: Sequence[dict[str, Any]],
                    thread_id: str, message_id: str) -> list[dict[str, Any]] | None:
    """`ops` (which append the message `message_id` to `thread_id`) as one batch without an
    `Idempotency-Key`: every message carries an id of its own (a framework's event id, or a
    fresh one), so a repeat is refused as `MessageExists` instead of stored twice. Sent again
    when the connection failed, unless the lost attempt was stored: then None."""
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
