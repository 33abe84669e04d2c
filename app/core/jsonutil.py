"""JSON helpers shared by the request edge, the database layer and the SQLite backend."""

from __future__ import annotations

import json
import re
from typing import Any

_STRUCTURE = re.compile(rb'["\\\[\]{}]')
# \u0000 (Postgres cannot store it) or a lone UTF-16 surrogate, not itself escaped.
_BAD_ESCAPE = re.compile(
    rb"(?<!\\)(?:\\\\)*(?:"
    rb"\\u(?:0000|[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F]))"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F])"
)


def dumps(value: Any) -> str:
    """Compact, order-preserving, UTF-8 friendly: the form we store and send."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def loads_strict(body: bytes) -> Any:
    """json.loads that refuses NaN/Infinity (not JSON, and Postgres refuses them)."""
    return json.loads(body, parse_constant=_reject_constant)


def exceeds_depth(body: bytes, limit: int) -> bool:
    """True when arrays/objects nest deeper than `limit` (the outermost counts as 1).

    Scans structure characters only, outside strings, so it is linear and cannot recurse.
    """
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    depth, in_string, skip = 0, False, -1
    for match in _STRUCTURE.finditer(body):
        pos = match.start()
        if pos == skip:
            continue
        char = body[pos]
        if in_string:
            if char == 0x5C:  # backslash: the next character is escaped
                skip = pos + 1
            elif char == 0x22:
                in_string = False
        elif char == 0x22:
            in_string = True
        elif char in (0x5B, 0x7B):
            depth += 1
            if depth > limit:
                return True
        elif char in (0x5D, 0x7D):
            depth -= 1
    return False


def has_unstorable_escape(body: bytes) -> bool:
    return b"\\u" in body and _BAD_ESCAPE.search(body) is not None


def contains(target: Any, query: Any, *, top: bool = True) -> bool:
    """Postgres `jsonb @>` semantics, for the SQLite backend and for tests.

    Objects: every query key present with a contained value. Arrays: every query element
    contained in some target element. Scalars: equal, with booleans never equal to numbers.
    At the top level only, an array contains a bare scalar that is one of its elements.
    """
    if isinstance(query, dict):
        return isinstance(target, dict) and all(
            key in target and contains(target[key], value, top=False) for key, value in query.items()
        )
    if isinstance(query, list):
        return isinstance(target, list) and all(
            any(contains(element, q, top=False) for element in target) for q in query
        )
    if isinstance(target, list):
        return top and any(_scalar_equal(element, query) for element in target)
    return _scalar_equal(target, query)


def _scalar_equal(a: Any, b: Any) -> bool:
    if isinstance(a, (dict, list)) or isinstance(b, (dict, list)):
        return False
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def sqlite_contains(target_json: str | None, query_json: str | None) -> int:
    """SQLite function `agentstate_json_contains(target, query)`."""
    if target_json is None or query_json is None:
        return 0
    return int(contains(json.loads(target_json), json.loads(query_json)))
