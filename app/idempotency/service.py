"""`Idempotency-Key` on the POSTs that append (messages, compactions), per API.md section 4.

A key is scoped to (tenant, thread, endpoint), or to (tenant, endpoint) for writes outside
threads (store items). Its row holds a hash of the request body and
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
from typing import Any

from app.db.base import utcnow
from app.db.unit import UnitOfWork
from app.idempotency.errors import IdempotencyInFlight, IdempotencyKeyReused
from app.idempotency.repository import IdempotencyRepository


@dataclass(frozen=True)
class IdempotencyRequest:
    key: str
    fingerprint: str

    @classmethod
    def of(cls, key: str, body: Any) -> IdempotencyRequest:
        """`body` is the parsed JSON (None without one): "the same JSON body" is the same
        value, so whitespace and key order do not matter."""
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return cls(key, hashlib.sha256(canonical.encode()).hexdigest())


@dataclass(frozen=True)
class Replay:
    status: int
    body: dict[str, Any]


class IdempotencyService:
    def __init__(self, uow: UnitOfWork, endpoint: str) -> None:
        self.repo = IdempotencyRepository(uow.connection, uow.tenant_id)
        self.tenant_id = uow.tenant_id
        self.endpoint = endpoint
        self.ttl = timedelta(hours=uow.settings.idempotency_ttl_hours)

    async def begin(self, thread_id: str | None,
                    request: IdempotencyRequest | None) -> Replay | None:
        """Claim the key for this transaction; the stored response if it was used before."""
        if request is None:
            return None
        lock_key = int.from_bytes(hashlib.sha256(
            "\0".join((self.tenant_id, thread_id or "", self.endpoint, request.key)).encode()
        ).digest()[:8], "big", signed=True)
        if not await self.repo.try_claim(lock_key):
            raise IdempotencyInFlight(
                "A request with this Idempotency-Key is still being processed; retry "
                "after it finishes to get its response."
            )
        stored = await self.repo.get(thread_id, self.endpoint, request.key)
        if stored is None:
            return None
        if stored.created_at < utcnow() - self.ttl:
            await self.repo.delete(stored.id, of_tenant=thread_id is None)
            return None
        if stored.request_hash != request.fingerprint:
            raise IdempotencyKeyReused(
                "This Idempotency-Key was used with a different body; use a new key for a "
                "new request.",
                errors=[{"parameter": "Idempotency-Key", "code": "idempotency_key_reused",
                         "message": "already used with a different body"}],
            )
        return Replay(stored.status, stored.response)

    async def forget_thread(self, thread_pk: int) -> None:
        """After a removal or redaction: the stored responses quote the old content, so they
        go (a retry of an earlier append is then a new append)."""
        await self.repo.forget_thread(thread_pk)

    async def save(self, thread_pk: int | None, request: IdempotencyRequest | None, status: int,
                   body: dict[str, Any]) -> None:
        if request is None:
            return
        now = utcnow()
        await self.repo.purge_expired(now - self.ttl, of_tenant=thread_pk is None)
        await self.repo.insert(thread_pk=thread_pk, endpoint=self.endpoint, key=request.key,
                               request_hash=request.fingerprint, status=status, response=body,
                               created_at=now)
