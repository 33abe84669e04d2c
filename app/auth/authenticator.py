"""Who holds this token? Answered from a small in-process cache, so that an authenticated
request normally costs a sha256 and a dict lookup rather than a database round trip.

What a server has read about a key (its tenant, scopes, hash, revocation) and whether any key
exists at all are trusted for `auth_cache_seconds`; after that the next request reads the
database again. That is the bound on how long a key revoked with `agentstate keys revoke`, or
the first key created on an open server, takes to reach a running server. One read per key is
in flight at a time, so an expiring entry under load costs one query, not one per request.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from app.auth.repository import ApiKeyRepository
from app.auth.service import key_id_of, token_hash
from app.core.errors import Unauthorized
from app.core.principal import ALL_SCOPES, ANONYMOUS, OPEN_TENANT, Principal
from app.db.engine import Database

OPEN = Principal(OPEN_TENANT, ANONYMOUS, ALL_SCOPES)
_MAX_ENTRIES = 10_000
_SECURED = "agentstate:any-key"
HOW_TO_CREATE = "`agentstate keys create --tenant <tenant> --name <name>`"


@dataclass(frozen=True)
class _Key:
    principal: Principal
    hash: str
    revoked: bool


class Authenticator:
    def __init__(self, ttl_seconds: float, require_keys: bool) -> None:
        self.ttl = ttl_seconds
        self.require_keys = require_keys
        self._entries: dict[str, tuple[float, Any]] = {}
        self._loading: dict[str, asyncio.Future[Any]] = {}

    async def authenticate(self, db: Database, token: str | None) -> Principal:
        if token is None:
            if self.require_keys or await self._cached(_SECURED, lambda: _any_key(db)):
                raise Unauthorized(
                    "Send Authorization: Bearer <api key>. An administrator creates keys with "
                    f"{HOW_TO_CREATE}."
                )
            return OPEN
        key_id = key_id_of(token)
        key = await self._cached(key_id, lambda: _load(db, key_id)) if key_id else None
        if key is None or not hmac.compare_digest(key.hash, token_hash(token)):
            raise Unauthorized("The API key is not valid.")
        if key.revoked:
            raise Unauthorized("The API key was revoked.")
        principal: Principal = key.principal
        return principal

    async def _cached(self, name: str, load: Callable[[], Awaitable[Any]]) -> Any:
        now = time.monotonic()
        entry = self._entries.get(name)
        if entry is not None and entry[0] > now:
            return entry[1]
        future = self._loading.get(name)
        if future is None:
            future = asyncio.ensure_future(self._refresh(name, load))
            self._loading[name] = future
            future.add_done_callback(lambda done: self._settle(name, done))
        # A client that disconnects must not cancel the read other requests are waiting for.
        return await asyncio.shield(future)

    async def _refresh(self, name: str, load: Callable[[], Awaitable[Any]]) -> Any:
        value = await load()
        if len(self._entries) >= _MAX_ENTRIES:  # unknown ids sent by a scanner, mostly
            now = time.monotonic()
            self._entries = {k: v for k, v in self._entries.items() if v[0] > now}
            if len(self._entries) >= _MAX_ENTRIES:
                self._entries.clear()
        self._entries[name] = (time.monotonic() + self.ttl, value)
        return value

    def _settle(self, name: str, done: asyncio.Future[Any]) -> None:
        self._loading.pop(name, None)
        if not done.cancelled():
            done.exception()  # retrieved here, so a failure nobody awaited is not logged


async def _any_key(db: Database) -> bool:
    async with db.read() as connection:
        return await ApiKeyRepository(connection).any_exist()


async def _load(db: Database, key_id: str) -> _Key | None:
    async with db.read() as connection:
        row = await ApiKeyRepository(connection).get(key_id)
    if row is None:
        return None
    scopes = frozenset(row.scopes.split(","))
    return _Key(Principal(row.tenant_id, key_id, scopes), row.hash, row.revoked_at is not None)
