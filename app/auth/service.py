"""API keys: minting, hashing, and the management use cases behind `agentstate keys`.

A token is `agst_<key_id>_<secret>`: the prefix makes a leaked token recognisable to secret
scanners, `key_id` (16 hex digits) is the public name that events record as the actor, and the
secret is 32 random bytes. Only sha256 of the token is stored. A slow password hash would add
nothing: 256 random bits cannot be guessed, whereas passwords can.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from app.auth.repository import ApiKeyRepository
from app.core.errors import NotFound, Unprocessable
from app.core.principal import ALL_SCOPES
from app.core.schemas import NAME_PATTERN, NAME_RULE
from app.db.base import utcnow

TOKEN_PREFIX = "agst_"
DEFAULT_SCOPES = ("read", "write")
_TOKEN = re.compile(r"^agst_([0-9a-f]{16})_[A-Za-z0-9_-]{43}$")


def new_token() -> tuple[str, str]:
    key_id = secrets.token_hex(8)
    return key_id, f"{TOKEN_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"


def key_id_of(token: str) -> str | None:
    """The key id of a well-formed token, else None (nothing to look up)."""
    match = _TOKEN.match(token)
    return match.group(1) if match else None


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def parse_scopes(text: str) -> frozenset[str]:
    scopes = frozenset(part.strip() for part in text.split(",") if part.strip())
    unknown = scopes - ALL_SCOPES
    if unknown or not scopes:
        raise Unprocessable(
            f"Scopes must be a comma-separated subset of {', '.join(sorted(ALL_SCOPES))}; "
            f"got {text!r}."
        )
    return scopes


@dataclass(frozen=True)
class KeyInfo:
    key_id: str
    tenant_id: str
    name: str
    scopes: tuple[str, ...]
    created_at: datetime
    revoked_at: datetime | None


class ApiKeyService:
    def __init__(self, connection: AsyncConnection) -> None:
        self.repo = ApiKeyRepository(connection)

    async def create(self, tenant_id: str, name: str,
                     scopes: frozenset[str]) -> tuple[KeyInfo, str]:
        """The new key and its token; the token exists only in this return value."""
        for label, value in (("tenant", tenant_id), ("name", name)):
            if not re.match(NAME_PATTERN, value):
                raise Unprocessable(f"The {label} must be {NAME_RULE}; got {value!r}.")
        key_id, token = new_token()
        now = utcnow()
        ordered = tuple(sorted(scopes))
        await self.repo.insert(key_id=key_id, tenant_id=tenant_id, name=name,
                               scopes=",".join(ordered), hash=token_hash(token), created_at=now)
        return KeyInfo(key_id, tenant_id, name, ordered, now, None), token

    async def list(self, tenant_id: str | None = None) -> list[KeyInfo]:
        return [
            KeyInfo(row.key_id, row.tenant_id, row.name, tuple(row.scopes.split(",")),
                    row.created_at, row.revoked_at)
            for row in await self.repo.list(tenant_id)
        ]

    async def revoke(self, key_id: str) -> bool:
        """True if this call revoked the key, False if it was revoked before."""
        if await self.repo.revoke(key_id, utcnow()):
            return True
        if await self.repo.get(key_id) is None:
            raise NotFound(f"There is no key {key_id!r}; `agentstate keys list` shows the keys.")
        return False
