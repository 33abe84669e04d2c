"""What the framework adapters share: the client the asyncio ones (ADK, OpenAI Agents SDK,
pydantic-ai) own or are given, the two clients of LangGraph's saver and store, and appends
that need no `Idempotency-Key`."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any, TypeVar

from agentstate_client._async import AsyncAgentStateClient
from agentstate_client._sync import AgentStateClient
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


class ClientPair:
    """LangGraph's saver and store, which LangGraph calls both blocking and async: the
    blocking `client` (the one passed in, else one made at the first blocking call, so async
    use never makes one) and the async client (the one passed in, else one of its own for
    each event loop it is used from: an httpx.AsyncClient's connections belong to the loop
    that opened them, and a second `asyncio.run` is another loop)."""

    def _use_clients(self, base_url: str | None, api_key: str | None, timeout: float,
                     client: AgentStateClient | None,
                     async_client: AsyncAgentStateClient | None) -> None:
        self._base_url, self._api_key, self._timeout = base_url, api_key, timeout
        self._client = client
        self._client_lock = threading.Lock()
        self._async_client = async_client
        self._async_loop: asyncio.AbstractEventLoop | None = None
        self._owns_async = async_client is None

    @property
    def client(self) -> AgentStateClient:
        """The blocking client (made now if none was passed or made yet)."""
        if self._client is None:
            with self._client_lock:
                if self._client is None:
                    self._client = AgentStateClient(self._base_url, api_key=self._api_key,
                                                    timeout=self._timeout)
        return self._client

    def _aclient(self) -> AsyncAgentStateClient:
        loop = asyncio.get_running_loop()
        if self._async_client is None or (self._owns_async and loop is not self._async_loop):
            self._async_client = AsyncAgentStateClient(self._base_url, api_key=self._api_key,
                                                       timeout=self._timeout)
            self._async_loop = loop
        return self._async_client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    async def aclose(self) -> None:
        if self._owns_async and self._async_client is not None:
            await self._async_client.aclose()
            self._async_client = None


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
