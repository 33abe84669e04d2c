"""Export, import and copy: the use cases behind `agentstate export|import|copy`.

- Export reads the whole database in one read transaction (REPEATABLE READ on Postgres; on
  SQLite the deferred read transaction pins a WAL snapshot) and streams it: every query runs
  over a server-side cursor, so memory does not grow with the database.
- Import writes each thread with all its records in one transaction, so whatever stops it
  leaves whole threads. A thread that is already stored is compared with the file (a
  checksum of its records on both sides): the same, it is left alone, so importing twice
  changes nothing; different, `--on-conflict` decides (skip it, stop, or replace it).
  Records are checked as the API checks what it stores; a record it would refuse refuses its
  thread (nothing of it is written), and the import goes on with the next.
- Copy is an export piped into an import inside one process, so an interrupted copy is
  finished by running it again: the threads it already wrote compare equal and are skipped.

These are maintenance commands: they own their transactions (docs/CONVENTIONS.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import pickle
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import IO, Any, BinaryIO, Literal, get_args

from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.jsonutil import exceeds_depth, has_unstorable_escape, loads_strict
from app.core.settings import Settings
from app.db.base import AnyRow
from app.db.engine import Database
from app.portability.format import (
    BY_NAME,
    CHILDREN,
    END,
    EVENT,
    FORMAT,
    KINDS,
    THREAD,
    THREAD_END,
    VERSION,
    Counts,
    Header,
    Kind,
    SecretsMode,
    encode,
)
from app.portability.repository import PortabilityRepository
from app.portability.secrets import SecretsError, SecretsIn, SecretsOut
from app.portability.validation import RecordInvalid, decode

OnConflict = Literal["skip", "fail", "replace"]
MAX_LINE = 64 * 2**20
BATCH = 1000  # rows per INSERT
UNITS_PER_TRANSACTION = 500  # API keys, MCP servers and loose events
Progress = Callable[[int], None]


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


def row_record(kind: Kind, row: AnyRow, thread_id: str | None = None) -> dict[str, Any]:
    """A stored row as a record of its kind (sealed fields as stored)."""
    values = row._mapping
    record: dict[str, Any] = {"kind": kind.name}
    for name in kind.fields:
        record[name] = thread_id if name in kind.virtual else values[name]
    return record


# --- export ------------------------------------------------------------------------------


@asynccontextmanager
async def snapshot(db: Database) -> AsyncIterator[AsyncConnection]:
    """One read transaction over the whole database, so the tables agree with each other."""
    async with db.engine.connect() as connection:
        if db.dialect == "postgresql":
            await connection.execution_options(isolation_level="REPEATABLE READ",
                                               postgresql_readonly=True)
        async with connection.begin():
            yield connection


class Exporter:
    def __init__(self, connection: AsyncConnection, secrets: SecretsOut) -> None:
        self.repo = PortabilityRepository(connection)
        self.secrets = secrets

    def record(self, kind: Kind, row: AnyRow, thread_id: str | None = None) -> dict[str, Any]:
        record = row_record(kind, row, thread_id)
        for name in kind.sealed:
            record[name] = self.secrets.field(record["tenant_id"], record["server_name"],
                                              record[name])
        return record

    async def bundle(self, row: AnyRow) -> AsyncIterator[dict[str, Any]]:
        """A thread's records: the thread, then its children kind by kind."""
        yield self.record(THREAD, row)
        for kind in CHILDREN:
            async for child in self.repo.children(kind, row.id, (row.tenant_id, row.thread_id)):
                yield self.record(kind, child, row.thread_id)

    async def records(self) -> AsyncIterator[dict[str, Any]]:
        """Every record of the database in file order, with the thread_end and end lines."""
        total = 0
        for kind in KINDS:
            if kind is THREAD:
                async for row in self.repo.stream(THREAD):
                    counts = Counts()
                    async for record in self.bundle(row):
                        counts.add(record["kind"])
                        yield record
                    total += counts.total
                    yield {"kind": THREAD_END, "tenant_id": row.tenant_id,
                           "thread_id": row.thread_id, "records": counts.as_record()}
            elif kind.scope != "thread":
                async for row in self.repo.stream(kind):
                    total += 1
                    yield self.record(kind, row)
        async for row in self.repo.loose_events():
            total += 1
            yield self.record(EVENT, row)
        yield {"kind": END, "records": total}

    async def digest(self, row: AnyRow) -> tuple[str, dict[str, int]]:
        """A thread's checksum (sha256 of its record lines) and its records per kind."""
        hasher, counts = hashlib.sha256(), Counts()
        async for record in self.bundle(row):
            hasher.update(encode(record).encode() + b"\n")
            counts.add(record["kind"])
        return hasher.hexdigest(), counts.as_record()

    async def total(self) -> int:
        return sum([await self.repo.count(kind) for kind in KINDS])


async def export(db: Database, out: IO[str], header: Header, secrets: SecretsOut,
                 progress: Progress | None = None) -> int:
    """Write the whole database; returns the number of records."""
    written = 0
    async with snapshot(db) as connection:
        out.write(header.line() + "\n")
        async for record in Exporter(connection, secrets).records():
            out.write(encode(record) + "\n")
            if record["kind"] == END:
                written = record["records"]
            elif progress is not None and record["kind"] != THREAD_END:
                progress(1)
    return written


# --- reading a file ----------------------------------------------------------------------


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


# --- import ------------------------------------------------------------------------------


@dataclass
class Summary:
    """What an import did: per unit (api_key, mcp_server, thread, event), how many were
    created, unchanged, replaced, skipped (a conflict), refused; and why each refusal."""

    units: dict[str, Counter[str]] = field(default_factory=dict)
    rows: int = 0
    refused: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def count(self, unit: str, outcome: str) -> None:
        self.units.setdefault(unit, Counter())[outcome] += 1

    def lines(self) -> list[str]:
        order = ("created", "replaced", "unchanged", "skipped", "refused")
        lines = []
        for kind in KINDS:
            if kind.name in self.units:
                outcomes = self.units[kind.name]
                label = "events outside threads" if kind is EVENT else f"{kind.table_name}"
                lines.append(f"{label}: " + ", ".join(
                    f"{outcomes[o]} {o}" for o in order if outcomes[o]))
        lines.append(f"{self.rows} rows written")
        return lines


class SeqTaken(Exception):
    def __init__(self, seq: int) -> None:
        super().__init__(f"event seq {seq} is taken by another event in this database")


class ThreadWriter:
    """Stores one thread's records in the caller's transaction, a batch per INSERT."""

    def __init__(self, connection: AsyncConnection) -> None:
        self.connection = connection
        self.repo = PortabilityRepository(connection)
        self.pending: dict[str, list[dict[str, Any]]] = {}
        self.pk: int | None = None
        self.rows = 0

    async def start(self, record: dict[str, Any]) -> bool:
        """Insert the thread row; False if the thread exists."""
        self.pk = await self.repo.insert_thread(
            {column.name: record[column.name] for column in THREAD.columns})
        self.rows = 1
        return self.pk is not None

    async def add(self, kind: Kind, record: dict[str, Any]) -> None:
        row = {column.name: record[column.name] for column in kind.columns}
        if kind.thread_fk is not None:
            row[kind.thread_fk] = self.pk
        rows = self.pending.setdefault(kind.name, [])
        rows.append(row)
        if len(rows) >= BATCH:
            await self.flush(kind)

    async def flush(self, kind: Kind) -> None:
        rows = self.pending.pop(kind.name, [])
        if not rows:
            return
        if kind is EVENT:
            for tenant in sorted({row["tenant_id"] for row in rows}):
                await self.repo.hold_event_seqs(tenant)
                taken = await self.repo.taken_seqs(
                    tenant, [row["seq"] for row in rows if row["tenant_id"] == tenant])
                if taken:
                    raise SeqTaken(taken[0])
        await self.repo.insert(kind, rows)
        self.rows += len(rows)

    async def finish(self) -> None:
        for kind in CHILDREN:
            await self.flush(kind)


@dataclass
class _Bundle:
    """A thread being imported: written as it streams in (a new thread), or hashed (and
    spooled, for --on-conflict replace) to be compared with the stored one."""

    where: str
    tenant_id: str
    thread_id: str
    counts: Counts = field(default_factory=Counts)
    refused: str | None = None
    last_seq: int = 0
    history_limit: int | None = None
    stack: AsyncExitStack | None = None
    writer: ThreadWriter | None = None
    target: tuple[str, dict[str, int]] | None = None
    hasher: Any = None
    spool: IO[bytes] | None = None

    @property
    def label(self) -> str:
        return f"thread {self.tenant_id}/{self.thread_id}"


class Importer:
    def __init__(self, db: Database, settings: Settings, secrets: SecretsIn,
                 on_conflict: OnConflict = "fail", progress: Progress | None = None) -> None:
        self.db = db
        self.settings = settings
        self.secrets = secrets
        self.on_conflict = on_conflict
        self.progress = progress
        self.summary = Summary()
        self._units: AsyncExitStack | None = None
        self._units_repo: PortabilityRepository | None = None
        self._units_open = 0
        self._unreadable: Counter[str] = Counter()

    def _decode(self, kind: Kind, item: Item) -> dict[str, Any]:
        if item.trusted:
            return item.record
        if item.error is not None:
            raise RecordInvalid(item.error)
        return decode(kind, item.record, self.settings)

    async def run(self, items: AsyncIterator[Item]) -> Summary:
        bundle: _Bundle | None = None
        seen, last = 0, "the start"
        try:
            async for item in items:
                last = item.where
                name = item.record["kind"]
                if name == END:
                    if bundle is not None:
                        raise ImportStopped(item.where, f"the end line inside {bundle.label}")
                    if item.record.get("records") != seen:
                        raise ImportStopped(item.where, f"the end line counts "
                                            f"{item.record.get('records')} records, the file "
                                            f"has {seen}: records are missing")
                    await self._close_units()
                    return self._finish()
                if name == THREAD_END:
                    if bundle is None or (item.record.get("tenant_id"), item.record.get(
                            "thread_id")) != (bundle.tenant_id, bundle.thread_id):
                        raise ImportStopped(item.where, "a thread_end that closes no open thread")
                    await self._end(bundle, item)
                    bundle = None
                elif name not in BY_NAME:
                    raise ImportStopped(item.where, f"unknown record kind {name!r}")
                elif name == THREAD.name:
                    if bundle is not None:
                        raise ImportStopped(item.where, f"{bundle.label} has no thread_end")
                    await self._close_units()
                    bundle = await self._open(item)
                    seen += 1
                elif bundle is not None:
                    kind = BY_NAME[name]
                    if kind.scope != "thread" or (
                            item.record.get("tenant_id"), item.record.get("thread_id")
                    ) != (bundle.tenant_id, bundle.thread_id):
                        raise ImportStopped(item.where, f"a {name} record inside {bundle.label} "
                                                        "that is not of it")
                    await self._child(bundle, kind, item)
                    seen += 1
                elif name == EVENT.name or BY_NAME[name].scope != "thread":
                    await self._unit(BY_NAME[name], item)
                    seen += 1
                else:
                    raise ImportStopped(item.where, f"a {name} record outside its thread")
                if self.progress is not None and name != THREAD_END:
                    self.progress(1)
            if bundle is not None:
                raise ImportStopped(last, f"the input ends inside {bundle.label}: truncated; "
                                          "nothing of that thread was written")
            raise ImportStopped(last, "the input ends without its end line: truncated "
                                      "(the threads before this point were imported whole)")
        except ImportStopped:
            if bundle is not None:
                await self._discard(bundle)
            await self._close_units(commit=True)  # the units before are whole
            raise
        except BaseException:
            if bundle is not None:
                await self._discard(bundle)
            await self._close_units(commit=False)
            raise

    def _finish(self) -> Summary:
        for key_id, count in sorted(self._unreadable.items()):
            self.summary.warnings.append(
                f"the secrets of {count} MCP servers are sealed with "
                f"{'key ' + key_id if key_id != '?' else 'a key'} this server does not have; "
                "add it to AGENTSTATE_SECRET_KEYS to read them")
        return self.summary

    # --- threads -------------------------------------------------------------------------

    async def _open(self, item: Item) -> _Bundle:
        raw = item.record
        tenant_id, thread_id = raw.get("tenant_id"), raw.get("thread_id")
        if not isinstance(tenant_id, str) or not isinstance(thread_id, str):
            raise ImportStopped(item.where, "a thread record names its tenant_id and thread_id")
        bundle = _Bundle(item.where, tenant_id, thread_id)
        bundle.counts.add(THREAD.name)
        try:
            record = self._decode(THREAD, item)
        except RecordInvalid as exc:
            bundle.refused = f"{item.where}: thread.{exc}"
            return bundle
        bundle.last_seq, bundle.history_limit = record["last_seq"], record["history_limit"]
        # A new thread (the common case) costs one INSERT; only a taken id is looked up.
        stack = AsyncExitStack()
        writer = ThreadWriter(await stack.enter_async_context(self.db.write()))
        try:
            created = await writer.start(record)
        except BaseException:
            await stack.aclose()
            raise
        if created:
            bundle.stack, bundle.writer = stack, writer
            return bundle
        await stack.aclose()
        async with self.db.read() as connection:
            pk = await PortabilityRepository(connection).thread_pk(tenant_id, thread_id)
        assert pk is not None, "the thread exists: its insert found the id taken"
        bundle.target = await self._digest(pk)
        bundle.hasher = hashlib.sha256()
        if self.on_conflict == "replace":
            bundle.spool = tempfile.TemporaryFile()  # noqa: SIM115 - closed with the bundle
        self._keep(bundle, record)
        return bundle

    async def _digest(self, pk: int) -> tuple[str, dict[str, int]]:
        async with snapshot(self.db) as connection:
            exporter = Exporter(connection, SecretsOut("ciphertext", None))
            row = await exporter.repo.thread_row(pk)
            assert row is not None
            return await exporter.digest(row)

    def _keep(self, bundle: _Bundle, record: dict[str, Any]) -> None:
        bundle.hasher.update(encode(record).encode() + b"\n")
        if bundle.spool is not None:
            pickle.dump(record, bundle.spool)

    async def _child(self, bundle: _Bundle, kind: Kind, item: Item) -> None:
        bundle.counts.add(kind.name)
        if bundle.refused is not None:
            return
        try:
            record = self._decode(kind, item)
            if kind is EVENT and record["thread_id"] != bundle.thread_id:
                raise RecordInvalid("thread_id: not the thread it is filed under")
            if kind.name in ("message", "compaction") and record["seq"] > bundle.last_seq:
                raise RecordInvalid(f"seq: {record['seq']} is beyond the thread's last_seq")
            # The server keeps no history for such a thread, and its writes count on there
            # being none (ThreadAggregate._keep): an export of it never has any.
            if kind.name == "thread_revision" and bundle.history_limit == 0:
                raise RecordInvalid("revision: the thread keeps no history (history_limit 0)")
        except RecordInvalid as exc:
            await self._discard(bundle)
            bundle.refused = f"{item.where}: {kind.name}.{exc}"
            return
        if bundle.writer is None:
            self._keep(bundle, record)
            return
        try:
            await bundle.writer.add(kind, record)
        except SeqTaken as exc:
            await self._discard(bundle)
            self._conflict_refusal(bundle, str(exc))

    async def _end(self, bundle: _Bundle, item: Item) -> None:
        if bundle.refused is None and item.record.get("records") != bundle.counts.as_record():
            await self._discard(bundle)
            bundle.refused = (f"{item.where}: its thread_end counts {item.record.get('records')}"
                              f" but the file holds {bundle.counts.as_record()}")
        if bundle.refused is None and bundle.writer is not None:
            try:
                await bundle.writer.finish()
            except SeqTaken as exc:
                await self._discard(bundle)
                self._conflict_refusal(bundle, str(exc))
        if bundle.refused is not None:
            self.summary.refused.append(f"{bundle.refused} ({bundle.label}: nothing of it "
                                        "was written)")
            self.summary.count(THREAD.name, "refused")
            return
        if bundle.writer is not None:
            await bundle.writer.connection.commit()
            assert bundle.stack is not None
            await bundle.stack.aclose()
            self.summary.rows += bundle.writer.rows
            self.summary.count(THREAD.name, "created")
            return
        if (bundle.hasher.hexdigest(), bundle.counts.as_record()) == bundle.target:
            self.summary.count(THREAD.name, "unchanged")
        elif self.on_conflict == "skip":
            self.summary.count(THREAD.name, "skipped")
        elif self.on_conflict == "fail":
            raise ImportStopped(bundle.where, f"{bundle.label} is stored with other content "
                                              "(--on-conflict skip or replace decides)")
        else:
            await self._replace(bundle)
        if bundle.spool is not None:
            bundle.spool.close()

    def _conflict_refusal(self, bundle: _Bundle, reason: str) -> None:
        if self.on_conflict == "fail":
            raise ImportStopped(bundle.where, f"{bundle.label}: {reason}")
        bundle.refused = f"{bundle.where}: {reason}"

    async def _discard(self, bundle: _Bundle) -> None:
        """Roll back what was written of the thread; drop its spool."""
        if bundle.stack is not None:
            await bundle.stack.aclose()  # leaving the connection rolls back
            bundle.stack = bundle.writer = None
        if bundle.spool is not None:
            bundle.spool.close()
            bundle.spool = None

    async def _replace(self, bundle: _Bundle) -> None:
        assert bundle.spool is not None
        bundle.spool.seek(0)
        async with self.db.write() as connection:
            repo = PortabilityRepository(connection)
            pk = await repo.thread_pk(bundle.tenant_id, bundle.thread_id)
            if pk is not None:
                await repo.delete_thread(pk, bundle.tenant_id, bundle.thread_id)
            writer = ThreadWriter(connection)
            await writer.start(pickle.load(bundle.spool))
            try:
                while True:
                    try:
                        record = pickle.load(bundle.spool)
                    except EOFError:
                        break
                    await writer.add(BY_NAME[record["kind"]], record)
                await writer.finish()
            except SeqTaken as exc:
                self.summary.refused.append(f"{bundle.where}: {bundle.label} cannot replace the "
                                            f"stored one: {exc}")
                self.summary.count(THREAD.name, "refused")
                return
            await connection.commit()
        self.summary.rows += writer.rows
        self.summary.count(THREAD.name, "replaced")

    # --- API keys, MCP servers, events outside threads -----------------------------------

    async def _units_repository(self) -> PortabilityRepository:
        if self._units_repo is None:
            self._units = AsyncExitStack()
            connection = await self._units.enter_async_context(self.db.write())
            self._units_repo = PortabilityRepository(connection)
        return self._units_repo

    async def _close_units(self, commit: bool = True) -> None:
        if self._units is None or self._units_repo is None:
            return
        if commit:
            await self._units_repo.connection.commit()
        await self._units.aclose()
        self._units = self._units_repo = None
        self._units_open = 0

    async def _unit(self, kind: Kind, item: Item) -> None:
        try:
            record = self._decode(kind, item)
            if kind.sealed and not item.trusted:
                self.secrets.check(record["secrets"], record["secret_names"])
        except (RecordInvalid, ValueError) as exc:
            self.summary.refused.append(f"{item.where}: {kind.name}.{exc}")
            self.summary.count(kind.name, "refused")
            return
        repo = await self._units_repository()
        if kind is EVENT:
            await repo.hold_event_seqs(record["tenant_id"])
            found = await repo.find_events(record["tenant_id"], [record["seq"]])
            stored = found[0] if found else None
        else:
            stored = await repo.find(kind, record)
        try:
            if stored is None:
                await self._insert_unit(repo, kind, record)
                outcome = "created"
            elif self._same(kind, record, stored):
                outcome = "unchanged"
            elif self.on_conflict == "skip":
                outcome = "skipped"
            elif self.on_conflict == "fail":
                raise ImportStopped(item.where, f"{kind.name} {self._key(kind, record)} is "
                                                "stored with other content (--on-conflict "
                                                "skip or replace decides)")
            else:
                if kind is EVENT:
                    await repo.delete_event(record["tenant_id"], record["seq"])
                else:
                    await repo.delete_one(kind, record)
                await self._insert_unit(repo, kind, record)
                outcome = "replaced"
        except SecretsError as exc:
            self.summary.refused.append(f"{item.where}: {exc}")
            self.summary.count(kind.name, "refused")
            return
        self.summary.count(kind.name, outcome)
        self._units_open += 1
        if self._units_open >= UNITS_PER_TRANSACTION:
            await self._close_units()

    @staticmethod
    def _key(kind: Kind, record: dict[str, Any]) -> str:
        return "/".join(str(record[name]) for name in kind.key)

    def _same(self, kind: Kind, record: dict[str, Any], stored: AnyRow) -> bool:
        held = row_record(kind, stored)
        for name in kind.sealed:
            if not self.secrets.same(record["tenant_id"], record["server_name"], record[name],
                                     held[name]):
                return False
        plain = {name: value for name, value in record.items() if name not in kind.sealed}
        return encode(plain) == encode({name: value for name, value in held.items()
                                        if name not in kind.sealed})

    async def _insert_unit(self, repo: PortabilityRepository, kind: Kind,
                           record: dict[str, Any]) -> None:
        row = {column.name: record[column.name] for column in kind.columns}
        if kind.sealed:
            tenant_id, name = record["tenant_id"], record["server_name"]
            row["secrets"], row["secret_names"] = self.secrets.columns(
                tenant_id, name, record["secrets"], record["secret_names"])
            if not self.secrets.openable(tenant_id, name, row["secrets"]):
                self._unreadable[(record["secrets"] or {}).get("key_id") or "?"] += 1
        await repo.insert(kind, [row])
        self.summary.rows += 1


# --- copy and verify ---------------------------------------------------------------------


async def count_records(db: Database) -> int:
    async with snapshot(db) as connection:
        return await Exporter(connection, SecretsOut("ciphertext", None)).total()


async def copy(source: Database, target: Database, target_settings: Settings,
               on_conflict: OnConflict, progress: Progress | None = None) -> Summary:
    """Stream every record of `source` into `target` (ciphertexts as they are: the target
    needs the same AGENTSTATE_SECRET_KEYS)."""
    from app.core.secretbox import load_secret_box

    async with snapshot(source) as connection:
        exporter = Exporter(connection, SecretsOut("ciphertext", None))
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
