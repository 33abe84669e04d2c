"""Errors of `Idempotency-Key` handling (API.md section 4)."""

from __future__ import annotations

from app.core.errors import Conflict, Unprocessable


class IdempotencyInFlight(Conflict):
    code, title = "idempotency_in_flight", "A request with this Idempotency-Key is in flight"


class IdempotencyKeyReused(Unprocessable):
    code, title = "idempotency_key_reused", "Idempotency-Key reused with a different body"
