"""Server-generated ids: a prefix and a ULID, so they sort by creation time."""

from __future__ import annotations

import os
import threading
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford base32
_lock = threading.Lock()
_last_ms = 0
_last_random = 0


def _ulid() -> str:
    """Monotonic within a process: ids made in the same millisecond still sort in order."""
    global _last_ms, _last_random
    with _lock:
        now = time.time_ns() // 1_000_000
        if now <= _last_ms:
            now = _last_ms
            _last_random += 1
        else:
            _last_random = int.from_bytes(os.urandom(10), "big") >> 1  # room to increment
        _last_ms = now
        value = (now << 80) | _last_random
    return "".join(_ALPHABET[(value >> shift) & 31] for shift in range(125, -1, -5))


def new_id(prefix: str) -> str:
    return f"{prefix}_{_ulid()}"
