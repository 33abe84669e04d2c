"""Import: records in (from a file, another store or a copy), whole threads out.

Each thread is written with all its records in one transaction, so whatever stops an import
leaves whole threads. A thread that is already stored is compared with the input (a checksum
of its records on both sides): the same, it is left alone, so importing twice changes
nothing; different, `--on-conflict` decides (skip it, stop, or replace it). Records are
checked as the API checks what it stores; a record it would refuse refuses its thread
(nothing of it is written), and the import goes on with the next. API keys, MCP servers and
events outside threads are committed `UNITS_PER_TRANSACTION` at a time.

A maintenance command's use case: it owns its transactions (docs/CONVENTIONS.md).
"""

from __future__ import annotations

import hashlib
import pickle
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import IO, Any, Literal

from app.core.settings import Settings
from app.db.base import AnyRow
from app.db.engine import Database
from app.portability.export import Exporter, Progress, row_record, snapshot
from app.portability.format import (
    BY_NAME,
    END,
    EVENT,
    KINDS,
    THREAD,
    THREAD_END,
    Counts,
    Kind,
    encode,
)
from app.portability.reader import ImportStopped, Item
from app.portability.repository import PortabilityRepository
from app.portability.secrets import SecretsError, SecretsIn, SecretsOut
from app.portability.validation import RecordInvalid, decode
from app.portability.writer import SeqTaken, ThreadWriter

OnConflict = Literal["skip", "fail", "replace"]
UNITS_PER_TRANSACTION = 500  # API keys, MCP servers and loose events


@dataclass
class Summary:
    """What an import did: per unit (api_key, mcp_server, thread, event), how many were
    created, unchanged, replaced, skipped (a conflict), refused; and why each refusal."""

    units: dict[str, Counter[str]] = field(default_factory=dict)
    rows: int = 0
    refused: list[str] = field(default_factory=list)
    # MCP servers whose stored secrets the target's keys do not open, per id of the key that
    # sealed them ("?": not known); the command says where that key is.
    unreadable: Counter[str] = field(default_factory=Counter)

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

    def holds(self, record: dict[str, Any]) -> bool:
        """Whether `record` names this thread."""
        return (record.get("tenant_id"), record.get("thread_id")) == (self.tenant_id,
                                                                        self.thread_id)


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
        self._bundle: _Bundle | None = None  # the thread being read
        self._seen = 0  # records read (the end line counts them)

    def _decode(self, kind: Kind, item: Item) -> dict[str, Any]:
        if item.trusted:
            return item.record
        if item.error is not None:
            raise RecordInvalid(item.error)
        return decode(kind, item.record, self.settings)

    async def run(self, items: AsyncIterator[Item]) -> Summary:
        """Store every item; the summary once the end line is read. `ImportStopped` when the
        input cannot be read on: the threads and units before it are stored whole."""
        # What each line does to the import, by its kind: the file's structure (the end, a
        # thread's start and end) has a handler of its own, every other kind is a record.
        handlers: dict[str, Callable[[Item], Awaitable[bool]]] = {
            END: self._input_end, THREAD.name: self._thread_start,
            THREAD_END: self._thread_end}
        last = "the start"
        try:
            async for item in items:
                last, name = item.where, item.record["kind"]
                handler = handlers.get(name, self._record if name in BY_NAME else None)
                if handler is None:
                    raise ImportStopped(item.where, f"unknown record kind {name!r}")
                if await handler(item):
                    return self.summary
                if name != THREAD_END:
                    self._seen += 1
                    if self.progress is not None:
                        self.progress(1)
            if self._bundle is not None:
                raise ImportStopped(last, f"the input ends inside {self._bundle.label}: "
                                          "truncated; nothing of that thread was written")
            raise ImportStopped(last, "the input ends without its end line: truncated "
                                      "(the threads before this point were imported whole)")
        except ImportStopped:
            await self._discard_open()
            await self._close_units(commit=True)  # the units before are whole
            raise
        except BaseException:
            await self._discard_open()
            await self._close_units(commit=False)
            raise

    # Each handler returns True only for the end line: the import is done.

    async def _input_end(self, item: Item) -> bool:
        if self._bundle is not None:
            raise ImportStopped(item.where, f"the end line inside {self._bundle.label}")
        if item.record.get("records") != self._seen:
            raise ImportStopped(item.where, f"the end line counts {item.record.get('records')} "
                                            f"records, the file has {self._seen}: records are "
                                            "missing")
        await self._close_units()
        async with self.db.write() as connection:
            await PortabilityRepository(connection).analyze()
            await connection.commit()
        return True

    async def _thread_start(self, item: Item) -> bool:
        if self._bundle is not None:
            raise ImportStopped(item.where, f"{self._bundle.label} has no thread_end")
        await self._close_units()
        self._bundle = await self._open(item)
        return False

    async def _thread_end(self, item: Item) -> bool:
        bundle = self._bundle
        if bundle is None or not bundle.holds(item.record):
            raise ImportStopped(item.where, "a thread_end that closes no open thread")
        await self._end(bundle, item)
        self._bundle = None
        return False

    async def _record(self, item: Item) -> bool:
        """A record of a thread (inside its open thread) or a unit of its own."""
        kind, bundle = BY_NAME[item.record["kind"]], self._bundle
        if bundle is not None:
            if kind.scope != "thread" or not bundle.holds(item.record):
                raise ImportStopped(item.where, f"a {kind.name} record inside {bundle.label} "
                                                "that is not of it")
            await self._child(bundle, kind, item)
        elif kind is EVENT or kind.scope != "thread":
            await self._unit(kind, item)
        else:
            raise ImportStopped(item.where, f"a {kind.name} record outside its thread")
        return False

    async def _discard_open(self) -> None:
        if self._bundle is not None:
            await self._discard(self._bundle)

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
        token: str | None = None  # the secrets stored for the record, whoever stored them
        try:
            if stored is None:
                token = await self._insert_unit(repo, kind, record)
                outcome = "created"
            elif self._same(kind, record, stored):
                token = stored.secrets if kind.sealed else None
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
                token = await self._insert_unit(repo, kind, record)
                outcome = "replaced"
        except SecretsError as exc:
            self.summary.refused.append(f"{item.where}: {exc}")
            self.summary.count(kind.name, "refused")
            return
        self.summary.count(kind.name, outcome)
        # What is stored now, whether this run wrote it or an earlier one did (a rerun says
        # it again): secrets this server's keys do not open, by the key that sealed them.
        if outcome != "skipped" and not self.secrets.openable(
                record["tenant_id"], record.get("server_name", ""), token):
            self.summary.unreadable[(record["secrets"] or {}).get("key_id") or "?"] += 1
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
                           record: dict[str, Any]) -> str | None:
        """Store the record; the ciphertext it stored (None: no secrets)."""
        row = {column.name: record[column.name] for column in kind.columns}
        if kind.sealed:
            row["secrets"], row["secret_names"] = self.secrets.columns(
                record["tenant_id"], record["server_name"], record["secrets"],
                record["secret_names"])
        await repo.insert(kind, [row])
        self.summary.rows += 1
        return row.get("secrets")
