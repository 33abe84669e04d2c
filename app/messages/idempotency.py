"""`Idempotency-Key` on the POSTs that append (messages, compactions), per API.md section 4.

A key is scoped to (tenant, thread, endpoint). Its row holds a hash of the request body and
the first response, and is written in the same transaction as the write it protects, so a
key is stored exactly when its write committed. Replays are answered before any
precondition is evaluated.

In flight: on Postgres the first request holds a transaction-scoped advisory lock on the key
until it commits or rolls back; a second request that cannot take it (`pg_try_`, never
waiting) is answered 409 at once, whichever process it reached. Postgres releases the lock
only after the commit is visible, so whoever takes it next finds the stored response.
On SQLite writers are serialised by BEGIN IMMEDIATE: a retry waits for the first request
and then replays it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Any

from fastapi import Depends, Header, Request
from sqlalchemy import delete, func, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.errors import IdempotencyInFlight, IdempotencyKeyReused, InvalidHeader
from app.core.jsonutil import loads_strict
from app.core.settings import Settings
from app.db.base import utcnow
from app.db.dialect import dialect_name
from app.messages.models import IdempotencyKey
from app.threads.models import Thread

k = IdempotencyKey.__table__
t = Thread.__table__
_PURGE_BATCH = 100


@dataclass(frozen=True)
class IdempotencyRequest:
    key: str
    fingerprint: str


@dataclass(frozen=True)
class Replay:
    status: int
    body: dict[str, Any]


async def idempotency_request(
    request: Request,
    idempotency_key: Annotated[str | None, Header(
        alias="Idempotency-Key",
        description="Makes a retry safe: the same key and body replay the first response "
        "(kept at least 24 h). 1-255 printable ASCII characters; a quoted "
        "structured-field string is accepted too.",
    )] = None,
) -> IdempotencyRequest | None:
    if idempotency_key is None:
        return None
    key = idempotency_key.strip()
    if len(key) >= 2 and key[0] == key[-1] == '"':  # sf-string form of the IETF draft
        key = key[1:-1]
    if not 0 < len(key) <= 255 or not all(" " <= char <= "~" for char in key):
        raise InvalidHeader("Idempotency-Key must be 1-255 printable ASCII characters.")
    body = await request.body()
    # "The same JSON body": the parsed value, so whitespace and key order do not matter.
    canonical = json.dumps(loads_strict(body) if body.strip() else None, sort_keys=True,
                           separators=(",", ":"), ensure_ascii=False)
    return IdempotencyRequest(key, hashlib.sha256(canonical.encode()).hexdigest())


IdempotencyDep = Annotated[IdempotencyRequest | None, Depends(idempotency_request)]


class IdempotencyStore:
    def __init__(self, session: AsyncConnection, tenant_id: str, settings: Settings) -> None:
        self.session = session
        self.tenant_id = tenant_id
        self.ttl = timedelta(hours=settings.idempotency_ttl_hours)

    async def begin(self, thread_id: str, endpoint: str,
                    request: IdempotencyRequest | None) -> Replay | None:
        """Claim the key for this transaction; the stored response if it was used before."""
        if request is None:
            return None
        if dialect_name(self.session) == "postgresql":
            lock_key = int.from_bytes(hashlib.sha256(
                "\0".join((self.tenant_id, thread_id, endpoint, request.key)).encode()
            ).digest()[:8], "big", signed=True)
            claimed = await self.session.scalar(select(func.pg_try_advisory_xact_lock(lock_key)))
            if not claimed:
                raise IdempotencyInFlight(
                    "A request with this Idempotency-Key is still being processed; retry "
                    "after it finishes to get its response."
                )
        stored = (await self.session.execute(
            select(k.c.id, k.c.request_hash, k.c.status, k.c.response, k.c.created_at)
            .join(t, t.c.id == k.c.thread_pk)
            .where(t.c.tenant_id == self.tenant_id, t.c.thread_id == thread_id,
                   t.c.deleted_at.is_(None), k.c.tenant_id == self.tenant_id,
                   k.c.endpoint == endpoint, k.c.key == request.key)
        )).first()
        if stored is None:
            return None
        if stored.created_at < utcnow() - self.ttl:
            await self.session.execute(delete(k).where(k.c.id == stored.id))
            return None
        if stored.request_hash != request.fingerprint:
            raise IdempotencyKeyReused(
                "This Idempotency-Key was used with a different body; use a new key for a "
                "new request.",
                errors=[{"parameter": "Idempotency-Key", "code": "idempotency_key_reused",
                         "message": "already used with a different body"}],
            )
        return Replay(stored.status, stored.response)

    async def save(self, thread_pk: int, endpoint: str, request: IdempotencyRequest | None,
                   status: int, body: dict[str, Any]) -> None:
        if request is None:
            return
        now = utcnow()
        # Lazy expiry, a bounded batch at a time, so no write ever pays for a backlog. Two
        # statements, not DELETE ... IN (subquery), which Postgres may answer with a seq scan.
        expired = (await self.session.scalars(
            select(k.c.id)
            .where(k.c.tenant_id == self.tenant_id, k.c.created_at < now - self.ttl)
            .order_by(k.c.created_at)
            .limit(_PURGE_BATCH)
        )).all()
        if expired:
            await self.session.execute(delete(k).where(k.c.id.in_(expired)))
        await self.session.execute(insert(k).values(
            tenant_id=self.tenant_id, thread_pk=thread_pk, endpoint=endpoint, key=request.key,
            request_hash=request.fingerprint, status=status, response=body, created_at=now,
        ))


