"""Reading an export file: its header, then one record per line, each checked as JSON.

A line that cannot be read on stops the import (`ImportStopped`, naming the line); a line
that is JSON but could not be stored travels on as an `Item` with its `error`, so only its
thread is refused.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, get_args

from app.core.jsonutil import exceeds_depth, has_unstorable_escape, loads_strict
from app.core.settings import Settings
from app.portability.format import FORMAT, VERSION, Header, SecretsMode

MAX_LINE = 64 * 2**20


class ImportStopped(Exception):
    """The input cannot be read on (or `--on-conflict fail` met a conflict): where and why.
    Threads before it are stored whole; nothing of the thread it stopped in is."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message


@dataclass(frozen=True)
class Item:
    """One record on its way in. `trusted`: stored values read from a database of this
    version (copy), not decoded again. `error`: what makes the line unstorable."""

    where: str
    record: dict[str, Any]
    trusted: bool = False
    error: str | None = None




def _line(stream: BinaryIO) -> bytes:
    return stream.readline(MAX_LINE + 1)


def _json(line: bytes, where: str) -> dict[str, Any]:
    if not line.endswith(b"\n"):
        if len(line) > MAX_LINE:
            raise ImportStopped(where, "the line is longer than 64 MiB")
        raise ImportStopped(where, "truncated: the line does not end (an interrupted export "
                                   "or copy?); nothing of the thread it is in was written")
    try:
        value = loads_strict(line)
    except ValueError:
        raise ImportStopped(where, "not valid JSON") from None
    if not isinstance(value, dict):
        raise ImportStopped(where, "not a JSON object")
    return value


def read_header(stream: BinaryIO) -> Header:
    line = _line(stream)
    if not line:
        raise ImportStopped("line 1", "the file is empty")
    header = _json(line, "line 1")
    if header.get("format") != FORMAT:
        raise ImportStopped("line 1", f"not an agentstate export (its first line names no "
                                      f"\"format\": \"{FORMAT}\")")
    if header.get("version") != VERSION:
        raise ImportStopped("line 1", f"format version {header.get('version')!r} is not one "
                                      f"this agentstate reads (it reads version {VERSION}); "
                                      "import it with an agentstate that knows that version")
    mode: SecretsMode = header.get("secrets")  # type: ignore[assignment]  # checked next
    if mode not in get_args(SecretsMode):
        raise ImportStopped("line 1", f"unknown secrets mode {mode!r}")
    kdf = header.get("kdf")
    if mode == "passphrase" and not isinstance(kdf, dict):
        raise ImportStopped("line 1", "a passphrase export's header needs its kdf")
    return Header(schema=header.get("schema"), secrets=mode, kdf=kdf)


def read_items(stream: BinaryIO, settings: Settings) -> Iterator[Item]:
    """The records after the header, one per line."""
    number = 1
    while line := _line(stream):
        number += 1
        where = f"line {number}"
        record = _json(line, where)
        if not isinstance(record.get("kind"), str):
            raise ImportStopped(where, 'not a record (an object with a "kind")')
        error = None
        if has_unstorable_escape(line):
            error = "a string holds \\u0000 or a lone surrogate, which cannot be stored"
        elif exceeds_depth(line, settings.max_json_depth):
            error = f"nested deeper than {settings.max_json_depth} levels"
        yield Item(where, record, error=error)


async def from_sync(items: Iterator[Item]) -> AsyncIterator[Item]:
    for item in items:
        yield item
