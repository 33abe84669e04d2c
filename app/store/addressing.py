"""Namespaces and keys as URL path segments, reversibly (API.md section 7b).

Labels and keys are any non-empty strings. In a URL (and in the database) each is written as
a name, exactly as `agentstate_client.ids.encode_id` writes framework ids: a string of
`A-Z a-z 0-9 . _ : -` not starting with `.` is itself; any other UTF-8 byte (and `@`, and a
leading `.`) is `@XX`, its upper-case hex. A namespace is its encoded labels joined by `/`:
`("users", "a/b")` is `users/a@2Fb`. Only that spelling names an item: a segment that decodes
but is not how its text encodes (`@61` for `a`, lower-case hex) is refused, so every item has
exactly one URL.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from app.core.errors import Unprocessable
from app.core.settings import Settings

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-")
# Text that is its own encoding (safe characters, no leading `.`): most labels and keys.
_PLAIN = re.compile(r"[A-Za-z0-9_:-][A-Za-z0-9._:-]*")
_HEX = "0123456789ABCDEF"
MAX_SEGMENT_CHARS = 255  # a key, or a label (AGENTSTATE_STORE_MAX_LABEL_CHARS may lower it)
MAX_NAMESPACE_CHARS = 512  # the encoded labels and their separators


def encode_segment(text: str) -> str:
    if _PLAIN.fullmatch(text):
        return text
    out: list[str] = []
    for index, byte in enumerate(text.encode("utf-8")):
        if byte in _SAFE and not (index == 0 and byte == 0x2E):
            out.append(chr(byte))
        else:
            out.append(f"@{byte:02X}")
    return "".join(out)


def decode_segment(segment: str) -> str:
    """The text a stored (canonical) segment stands for: itself when it escapes nothing
    (its characters are then all safe ASCII, each the byte it stands for)."""
    if "@" not in segment:
        return segment
    raw = bytearray()
    index = 0
    while index < len(segment):
        if segment[index] == "@":
            raw.append(int(segment[index + 1:index + 3], 16))
            index += 3
        else:
            raw.append(ord(segment[index]))
            index += 1
    return raw.decode("utf-8")


def canonical_text(segment: str) -> str | None:
    """The text a URL segment names, or None when the segment is not the one spelling of
    some text (a stray `@`, lower-case hex, an escaped safe character, invalid UTF-8)."""
    if _PLAIN.fullmatch(segment):
        return segment
    raw = bytearray()
    index = 0
    while index < len(segment):
        char = segment[index]
        if char == "@":
            digits = segment[index + 1:index + 3]
            if len(digits) != 2 or any(d not in _HEX for d in digits):
                return None
            raw.append(int(digits, 16))
            index += 3
        elif ord(char) < 128 and ord(char) in _SAFE:
            raw.append(ord(char))
            index += 1
        else:
            return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if text and encode_segment(text) == segment else None


def labels_of(namespace: str) -> list[str]:
    return [decode_segment(segment) for segment in namespace.split("/")]


def _invalid(detail: str, where: dict[str, str], code: str) -> Unprocessable:
    return Unprocessable(detail, errors=[{**where, "code": code, "message": detail}])


class Addressing:
    """The settings' limits on labels, applied to URL segments and to labels in bodies."""

    def __init__(self, settings: Settings) -> None:
        self.max_labels = settings.store_max_namespace_labels
        self.max_label_chars = settings.store_max_label_chars

    def _check_segment(self, segment: str, what: str, limit: int,
                       where: dict[str, str]) -> None:
        if len(segment) > limit:
            raise _invalid(f"The {what} is {len(segment)} characters as a URL segment "
                           f"(encoded); at most {limit}.", where, "too_long")

    def path_namespace(self, namespace: str) -> str:
        """A namespace as it came in a URL: its canonical stored form (it is that text)."""
        where = {"parameter": "namespace"}
        segments = namespace.split("/")
        if len(segments) > self.max_labels:
            raise _invalid(f"A namespace has at most {self.max_labels} labels.", where,
                           "too_many_labels")
        for segment in segments:
            if canonical_text(segment) is None:
                raise _invalid(
                    f"{segment[:80]!r} is not an encoded label: write each byte outside "
                    "A-Z a-z 0-9 . _ : - (and @, and a leading .) as @XX, upper-case hex.",
                    where, "invalid_label")
            self._check_segment(segment, "label", self.max_label_chars, where)
        self._check_namespace(namespace, where)
        return namespace

    def path_key(self, key: str) -> str:
        where = {"parameter": "key"}
        if canonical_text(key) is None:
            raise _invalid(f"{key[:80]!r} is not an encoded key: write each byte outside "
                           "A-Z a-z 0-9 . _ : - (and @, and a leading .) as @XX, upper-case "
                           "hex.", where, "invalid_key")
        self._check_segment(key, "key", MAX_SEGMENT_CHARS, where)
        return key

    def _check_namespace(self, namespace: str, where: dict[str, str]) -> None:
        if len(namespace) > MAX_NAMESPACE_CHARS:
            raise _invalid(f"The namespace is {len(namespace)} characters encoded; at most "
                           f"{MAX_NAMESPACE_CHARS}.", where, "too_long")

    def labels(self, labels: Sequence[str], pointer: str, *, minimum: int = 1,
               parameter: str | None = None) -> list[str]:
        """Labels sent in a body, encoded; 422 (at `pointer`, or at the query `parameter`
        they came in) when they break a limit."""
        where = {"parameter": parameter} if parameter else {"pointer": pointer}
        if len(labels) < minimum:
            raise _invalid(f"A namespace has at least {minimum} label.", where,
                           "too_few_labels")
        if len(labels) > self.max_labels:
            raise _invalid(f"A namespace has at most {self.max_labels} labels.", where,
                           "too_many_labels")
        segments = []
        for index, label in enumerate(labels):
            at = where if parameter else {"pointer": f"{pointer}/{index}"}
            if not label:
                raise _invalid("Namespace labels are non-empty strings.", at, "empty_label")
            segment = encode_segment(label)
            self._check_segment(segment, "label", self.max_label_chars, at)
            segments.append(segment)
        self._check_namespace("/".join(segments), where)
        return segments

    def key(self, key: str, pointer: str, *, parameter: str | None = None) -> str:
        where = {"parameter": parameter} if parameter else {"pointer": pointer}
        if not key:
            raise _invalid("A key is a non-empty string.", where, "empty_key")
        segment = encode_segment(key)
        self._check_segment(segment, "key", MAX_SEGMENT_CHARS, where)
        return segment


def item_path(namespace: str, key: str) -> str:
    return f"/v1/store/items/{namespace}/{key}"
