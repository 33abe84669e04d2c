"""OpenAI Agents SDK drop-in: `AgentStateSession` implements the SDK's `Session` protocol.

    from agentstate_client.openai_agents import AgentStateSession

    session = AgentStateSession("user-42", base_url="http://127.0.0.1:8080")
    result = await Runner.run(agent, "Hi", session=session)   # instead of SQLiteSession(...)

How a session is kept:
- the thread `encode_id(session_id)` (`agentstate_client.ids`, the same mapping as every
  adapter), created by the first `add_items`;
- each item is one message whose `item` is the SDK's item, stored verbatim (same keys, same
  order) and returned as it was given; its `role` is the item's `role` (`user`,
  `assistant`, ...) or, for items without one, its `type` (`function_call`, `reasoning`, ...),
  so the thread reads sensibly in agentstate's own tools;
- `get_items(limit)` reads the last `limit` items (all of them with `None`, or with the
  session's `SessionSettings.limit`); `pop_item` is one request that removes the newest item
  and answers it, so two concurrent pops never return the same item; `clear_session` removes
  every item and keeps the (empty) thread, so the session can be used again at once.

Items go in batches of 100 per request (the server's default limit): `add_items` of more is
several appends. Each item is stored under a fresh message id (`item-<uuid>`), so a batch
whose answer was lost is sent again without an Idempotency-Key and can never be stored twice
(`agentstate_client._adapters`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agentstate_client._adapters import ITEM_ONLY, OwnsClient, send_once
from agentstate_client._async import AsyncAgentStateClient
from agentstate_client.errors import NotFound
from agentstate_client.ids import encode_id

if TYPE_CHECKING:
    from agents.memory.session_settings import SessionSettings  # type: ignore[import-not-found, unused-ignore]

__all__ = ["AgentStateSession"]

PAGE = 1000  # messages per read, the server's maximum
BATCH = 100  # messages per append, the server's default limit
ROLE_MAX = 64


def _role(item: Any) -> str:
    """The message role an item is stored under: its `role`, else its `type`."""
    if isinstance(item, dict):
        for key in ("role", "type"):
            value = item.get(key)
            if isinstance(value, str) and value and value.isprintable():
                return value[:ROLE_MAX]
    return "item"


class AgentStateSession(OwnsClient):
    """The openai-agents `Session` protocol on an agentstate thread (see the module docstring).

    Pass an `AsyncAgentStateClient`, or `base_url`/`api_key` (default: `$AGENTSTATE_URL`,
    `$AGENTSTATE_API_KEY`) for a client the session owns and closes in `close()`.
    """

    session_settings: SessionSettings | None

    def __init__(self, session_id: str, *, base_url: str | None = None,
                 api_key: str | None = None, client: AsyncAgentStateClient | None = None,
                 session_settings: SessionSettings | None = None) -> None:
        self.session_id = session_id
        self.thread_id = encode_id(session_id)
        self._use_client(base_url, api_key, client)
        if session_settings is None:
            try:
                from agents.memory.session_settings import SessionSettings
            except ImportError:  # the protocol works without the SDK installed
                session_settings = None
            else:
                session_settings = SessionSettings()
        self.session_settings = session_settings

    def _limit(self, limit: int | None) -> int | None:
        if limit is not None:
            return limit
        settings = self.session_settings
        return getattr(settings, "limit", None) if settings is not None else None

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The session's items, oldest first; with `limit`, the newest `limit` of them."""
        limit = self._limit(limit)
        if limit == 0:
            return []
        try:
            if limit is None or limit < 0:  # SQLiteSession reads a negative limit as none
                return await self._read(None)
            return (await self._read(limit))[::-1]
        except NotFound:
            return []

    async def _read(self, limit: int | None) -> list[Any]:
        """Every item oldest first, or the newest `limit` newest first: pages of up to
        PAGE of the items alone (`fields`), each body parsed once (no `Message` per item)."""
        cursor: str | None = None
        items: list[Any] = []
        while True:
            page = json.loads(await self.client.list_messages_json(
                self.thread_id, order=None if limit is None else "desc",
                limit=PAGE if limit is None else min(limit, PAGE), cursor=cursor,
                fields=ITEM_ONLY))
            items.extend(message.get("item") for message in page["data"])
            cursor = page.get("next_cursor")
            if limit is not None and len(items) >= limit:
                return items[:limit]
            if cursor is None or not page["data"]:
                return items

    async def add_items(self, items: Sequence[Any]) -> None:
        """Append `items` in order (nothing for an empty list)."""
        messages = [{"id": f"item-{uuid.uuid4().hex}", "role": _role(item), "content": None,
                     "item": item} for item in items]
        for start in range(0, len(messages), BATCH):
            chunk = messages[start:start + BATCH]
            await send_once(self.client, [{"op": "messages.append", "thread_id": self.thread_id,
                                           "body": {"messages": chunk}}],
                            self.thread_id, chunk[0]["id"])

    async def pop_item(self) -> Any | None:
        """Remove the newest item and return it; None if the session is empty."""
        try:
            removed = await self.client.remove_messages(self.thread_id, last=1)
        except NotFound:
            return None
        return removed.data[0].item if removed.data else None

    async def clear_session(self) -> None:
        """Remove every item; the session stays usable."""
        try:
            while (await self.client.remove_messages(self.thread_id, after_seq=0)).data:
                pass
        except NotFound:
            pass
