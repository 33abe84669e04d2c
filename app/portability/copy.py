"""Copy and verify: `agentstate copy` from one database to another.

A copy is an export piped into an import inside one process (ciphertexts as they are), so an
interrupted copy is finished by running it again: the threads it already wrote compare equal
and are skipped. Verify then compares the two databases thread by thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from app.core.settings import Settings
from app.db.engine import Database
from app.portability.export import Exporter, Progress, snapshot
from app.portability.format import BY_NAME, END, EVENT, KINDS, THREAD, THREAD_END, Counts, encode
from app.portability.importer import Importer, OnConflict, Summary
from app.portability.reader import Item
from app.portability.secrets import SecretsIn, SecretsOut
from app.portability.writer import BATCH


async def count_records(db: Database) -> int:
    async with snapshot(db) as connection:
        return await Exporter(connection, SecretsOut("ciphertext", None)).total()


async def copy(source: Database, target: Database, target_settings: Settings,
               on_conflict: OnConflict, progress: Progress | None = None) -> Summary:
    """Stream every record of `source` into `target` (ciphertexts as they are: the target
    needs the key that sealed them; each carries the id of the source's key that opens it)."""
    from app.core.secretbox import load_secret_box

    async with snapshot(source) as connection:
        source_box = load_secret_box(source.settings, create=False)
        exporter = Exporter(connection, SecretsOut("ciphertext", source_box))
        # Reading the source and writing the target overlap: the reader runs ahead by at
        # most a queue of records (memory stays flat), each side waits on its own database.
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(maxsize=4 * BATCH)

        async def read() -> None:
            try:
                async for record in exporter.records():
                    await queue.put(record)
            finally:
                await queue.put(None)

        async def items() -> AsyncIterator[Item]:
            number = 0
            while (record := await queue.get()) is not None:
                number += 1
                yield Item(f"record {number}", record, trusted=True)
            await reader  # the reader's exception, if it stopped early

        importer = Importer(target, target_settings,
                            SecretsIn("ciphertext", load_secret_box(target_settings)),
                            on_conflict, progress)
        reader = asyncio.create_task(read())
        try:
            return await importer.run(items())
        finally:
            if not reader.done():
                reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader


@dataclass
class Verification:
    threads: int = 0
    records: int = 0
    differences: list[str] = field(default_factory=list)


async def verify(source: Database, target: Database) -> Verification:
    """Compare the two databases: per thread its records per kind and a checksum of them,
    every other record as a whole, and the row count of every table."""
    result = Verification()
    async with snapshot(source) as src, snapshot(target) as dst:
        ours = Exporter(src, SecretsOut("ciphertext", None))
        theirs = Exporter(dst, SecretsOut("ciphertext", None))
        hasher, counts, in_thread = hashlib.sha256(), Counts(), False
        async for record in ours.records():
            name = record["kind"]
            if name == END:
                break
            if name == THREAD_END:
                label = f"thread {record['tenant_id']}/{record['thread_id']}"
                pk = await theirs.repo.thread_pk(record["tenant_id"], record["thread_id"])
                row = await theirs.repo.thread_row(pk) if pk is not None else None
                if row is None:
                    result.differences.append(f"{label} is missing from the target")
                elif await theirs.digest(row) != (hasher.hexdigest(), counts.as_record()):
                    result.differences.append(f"{label} differs (records or checksum)")
                result.threads += 1
                hasher, counts, in_thread = hashlib.sha256(), Counts(), False
                continue
            result.records += 1
            in_thread = in_thread or name == THREAD.name
            if in_thread:
                hasher.update(encode(record).encode() + b"\n")
                counts.add(name)
                continue
            kind = BY_NAME[name]
            if kind is EVENT:
                found = await theirs.repo.find_events(record["tenant_id"], [record["seq"]])
                held = theirs.record(EVENT, found[0]) if found else None
            else:
                stored = await theirs.repo.find(kind, record)
                held = theirs.record(kind, stored) if stored is not None else None
            if held is None or encode(held) != encode(record):
                result.differences.append(f"{name} {'/'.join(str(record[k]) for k in kind.key)}"
                                          " differs or is missing")
        for kind in KINDS:
            mine, other = await ours.repo.count(kind), await theirs.repo.count(kind)
            if mine != other:
                result.differences.append(f"{kind.table_name}: {mine} rows in the source, "
                                          f"{other} in the target")
    return result
