"""What lexical search reads of an item: the text at its index fields, as tokens.

Fields are JSON paths in LangGraph's syntax: `"$"` (the whole value), `"a.b"`, `"a[*].b"`,
`"a[0]"`, `"a[-1]"`. The text of a field is every string, number and boolean under it (values,
never object keys). Tokens are computed here, the same way for an item and for a query
(Unicode NFKC, case-folded, runs of letters and digits), and stored space-separated, so
Postgres (`to_tsvector('simple', ...)`) and SQLite (FTS5, `unicode61`) index the same words.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from typing import Any

_WORD = re.compile(r"[^\W_]+")
_STEP = re.compile(r"\[(\*|-?\d+)\]|([^.\[\]]+)")
MAX_QUERY_TOKENS = 64


def parse_path(path: str) -> list[str | int] | None:
    """`a.b[*].c` as steps (`"*"` for every element); None when it is not a path."""
    if path == "$":
        return []
    steps: list[str | int] = []
    position = 0
    while position < len(path):
        if path[position] == "." and steps and position + 1 < len(path):
            position += 1
        match = _STEP.match(path, position)
        if match is None:
            return None
        index, name = match.groups()
        steps.append(name if name is not None else ("*" if index == "*" else int(index)))
        position = match.end()
    return steps or None


def _leaves(value: Any) -> Iterator[str]:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))
        elif isinstance(item, bool):
            yield "true" if item else "false"
        elif isinstance(item, (str, int, float)):
            yield str(item)


def _at(value: Any, steps: list[str | int]) -> Iterator[Any]:
    if not steps:
        yield value
        return
    step, rest = steps[0], steps[1:]
    if step == "*" and isinstance(value, list):
        for element in value:
            yield from _at(element, rest)
    elif isinstance(step, int) and isinstance(value, list):
        if -len(value) <= step < len(value):
            yield from _at(value[step], rest)
    elif isinstance(step, str) and isinstance(value, dict) and step in value:
        yield from _at(value[step], rest)


def tokens(text: str) -> list[str]:
    return _WORD.findall(unicodedata.normalize("NFKC", text).casefold())


def search_text(value: dict[str, Any], fields: list[str] | None) -> str | None:
    """The tokens of the item's index fields (None: not searchable by text)."""
    paths = [[]] if fields is None else [parse_path(field) or [] for field in fields]
    if fields == []:
        return None
    words: list[str] = []
    for steps in paths:
        for found in _at(value, steps):
            for leaf in _leaves(found):
                words.extend(tokens(leaf))
    return " ".join(words)


def query_tokens(query: str) -> list[str]:
    """A query's distinct tokens, in order, at most MAX_QUERY_TOKENS."""
    return list(dict.fromkeys(tokens(query)))[:MAX_QUERY_TOKENS]
