"""Framework ids of any string, mapped reversibly onto agentstate's name rules.

agentstate names (`thread_id`, `agent_name`, message ids) are 1-255 characters from
`A-Z a-z 0-9 . _ : @ -` and do not start with `.`. Framework ids are any string: LangGraph
thread ids such as `user/42/chat`, ADK's (app, user, session) triple. Every adapter maps
them the same way:

- a string that already follows the rules and holds no `@` is its own name, so uuids and
  most ids read the same in agentstate as in the framework;
- otherwise every UTF-8 byte outside `A-Z a-z 0-9 . _ : -` (and `@` itself, and a leading
  `.`) is written `@XX`, its two upper-case hex digits: `user/42/chat` -> `user@2F42@2Fchat`.

`decode_id(encode_id(s)) == s` for every string. Ids whose name would exceed 255
characters, and the empty string, raise `ValueError`: agentstate would refuse them anyway.
`join_ids` builds one name from several parts (ADK's app, user and session) joined by `:`,
escaping `:` inside the parts; `split_ids` takes it apart again.
"""

from __future__ import annotations

import re

MAX_NAME = 255
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-")
_HEX = "0123456789ABCDEF"
# A name already: its own encoding (a saver encodes the thread id at every call).
_NAME = re.compile(rf"[A-Za-z0-9_:-][A-Za-z0-9._:-]{{0,{MAX_NAME - 1}}}")


def _encode(value: str, *, safe: frozenset[int]) -> str:
    out: list[str] = []
    for index, byte in enumerate(value.encode("utf-8")):
        if byte in safe and not (index == 0 and byte == ord(".")):
            out.append(chr(byte))
        else:
            out.append(f"@{byte:02X}")
    return "".join(out)


def encode_id(value: str) -> str:
    """The agentstate name of a framework id."""
    if _NAME.fullmatch(value):
        return value
    if not value:
        raise ValueError("an id cannot be empty")
    name = _encode(value, safe=_SAFE)
    if len(name) > MAX_NAME:
        raise ValueError(f"id too long: its agentstate name has {len(name)} characters, the limit is {MAX_NAME}")
    return name


def decode_id(name: str) -> str:
    """The framework id an agentstate name stands for (the inverse of `encode_id`)."""
    raw = bytearray()
    index = 0
    while index < len(name):
        char = name[index]
        if char == "@":
            digits = name[index + 1 : index + 3]
            if len(digits) != 2 or any(d not in _HEX for d in digits):
                raise ValueError(f"not an encoded id: bad escape at {index} in {name!r}")
            raw.append(int(digits, 16))
            index += 3
        else:
            raw.extend(char.encode("utf-8"))
            index += 1
    return raw.decode("utf-8")


def join_ids(*parts: str) -> str:
    """One name for several ids (e.g. app, user, session), reversible with `split_ids`.

    Each part is encoded with `:` escaped too, then the parts are joined with `:`.
    """
    safe = _SAFE - {ord(":")}
    name = ":".join(_encode(part, safe=safe) if part else "@" for part in parts)
    if not name or len(name) > MAX_NAME:
        raise ValueError(f"ids too long: their agentstate name has {len(name)} characters, the limit is {MAX_NAME}")
    return name


def split_ids(name: str) -> list[str]:
    """The parts `join_ids` joined."""
    return ["" if part == "@" else decode_id(part) for part in name.split(":")]
