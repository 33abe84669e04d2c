"""Checkpoints (API.md section 9): immutable snapshots of a graph runtime's channels, kept per
thread and namespace, with their pending writes.

The thread is reached only through its aggregate: a checkpoint write creates the thread if
needed and takes its row FOR KEY SHARE (a concurrent DELETE of the thread waits), but does not
advance its revision. `If-Match` on the thread is honoured when sent.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from app.checkpoints.errors import CheckpointExists, CheckpointItemsMissing, CheckpointNotFound
from app.checkpoints.repository import MAX_WALK, CheckpointRepository, Read
from app.checkpoints.schemas import (
    ChannelHistoryOut,
    CheckpointBatchIn,
    CheckpointBatchOut,
    CheckpointBatchRef,
    CheckpointIn,
    CheckpointItemOut,
    CheckpointOut,
    CheckpointRef,
    DeltaHistoryOut,
    DeltaWriteOut,
    DigestItemOut,
    LatestCheckpointOut,
    TaskWritesIn,
    ValueOut,
    Version,
    WriteOut,
    WritesIn,
    item_out,
    version_key,
)
from app.core.errors import RevisionMismatch, Unprocessable
from app.core.pagination import Page, decode_name_cursor, split_page
from app.core.revisions import Preconditions
from app.db.base import AnyRow, utcnow
from app.db.unit import UnitOfWork
from app.threads.aggregate import ThreadAggregate, thread_path

CURSOR = "checkpoints"
DIGEST_BYTES = 16
# A list value is stored as the digests of chunks of CHUNK item digests, each chunk an item
# row of its own: a list that grows at its end keeps its full chunks from version to
# version, so a new version stores its last chunk and one digest per chunk, not one per item.
CHUNK = 64
CHUNK_TYPE = "agentstate.chunk"


def checkpoints_path(thread_id: str) -> str:
    return f"{thread_path(thread_id)}/checkpoints"


def item_digest(type_: str, data: bytes) -> bytes:
    """The key an item is stored under: sha256 of its type tag, a NUL and its bytes,
    truncated to 16 bytes (documented in API.md, so clients can send digests)."""
    return hashlib.sha256(type_.encode() + b"\x00" + data).digest()[:DIGEST_BYTES]


def seed_digest(row: AnyRow) -> str:
    """The digest of a stored value as a delta history's seed: sha256 of its type tag and its
    stored form (a list value's chunk digests, which name its items by their digests, or the
    value's bytes), so two seeds with one digest are the same value."""
    items = row._mapping["items"]
    form = b"items\x00" + items if items is not None else b"data\x00" + (row.data or b"")
    return hashlib.sha256(row.type.encode() + b"\x00" + form).hexdigest()


def _content_hash(body: CheckpointIn) -> str:
    content = [body.checkpoint_ns, body.checkpoint_id, body.parent_checkpoint_id,
               body.checkpoint, body.metadata]
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":"))
                          .encode()).hexdigest()


def _channel_versions(checkpoint: dict[str, Any]) -> dict[str, str]:
    versions = checkpoint.get("channel_versions", {})
    if not isinstance(versions, dict) or not all(
            isinstance(v, (int, float, str)) and not isinstance(v, bool)
            and len(version_key(v)) <= 255 and len(channel) <= 1024
            for channel, v in versions.items()):
        raise Unprocessable(
            "checkpoint.channel_versions must be an object of channel to version.",
            errors=[{"pointer": "/checkpoint/channel_versions", "code": "invalid_versions",
                     "message": "an object whose values are integers, numbers or strings"}])
    return {channel: version_key(v) for channel, v in versions.items()}


def _checkpoint_row(body: CheckpointIn) -> dict[str, Any]:
    """The checkpoint row of `body`, without its tenant and thread."""
    return {"checkpoint_ns": body.checkpoint_ns, "checkpoint_id": body.checkpoint_id,
            "parent_checkpoint_id": body.parent_checkpoint_id, "checkpoint": body.checkpoint,
            "metadata": body.metadata, "content_hash": _content_hash(body),
            "created_at": utcnow(),
            "run_id": run_id if isinstance(run_id := body.metadata.get("run_id"), str)
            and len(run_id) <= 255 else None}


@dataclass
class _New:
    """What a write request stores besides checkpoint rows, gathered as its checkpoints and
    writes are read and inserted at its end in one statement with its audit events
    (`CheckpointRepository.insert_all`). Rows without tenant_id and thread_pk."""

    since: int  # the unit's events from this index on are this write's
    items: dict[bytes, dict[str, Any]] = field(default_factory=dict)
    blobs: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    writes: list[dict[str, Any]] = field(default_factory=list)
    # The stored lists its values extend: (namespace, channel, version, chunk digests read).
    bases: list[tuple[str, str, str, bytes]] = field(default_factory=list)


def _split(items: bytes | None) -> list[bytes]:
    if not items:
        return []
    return [items[n:n + DIGEST_BYTES] for n in range(0, len(items), DIGEST_BYTES)]


class CheckpointService:
    def __init__(self, uow: UnitOfWork) -> None:
        self.uow = uow
        self.repo = CheckpointRepository(uow.connection, uow.tenant_id)
        self.threads = ThreadAggregate(uow)

    async def _writable(self, thread_id: str, pre: Preconditions, *,
                        create: bool = True) -> AnyRow:
        thread = await self.threads.for_child_write(thread_id, create=create)
        expected = pre.expected_revisions()
        if expected is not None and thread.revision not in expected:
            raise RevisionMismatch(thread.revision)
        return thread

    def _record(self, change: str, thread_id: str, resource: str | None = None) -> None:
        self.uow.record(f"checkpoint.{change}", resource or checkpoints_path(thread_id),
                        revision=None, thread_id=thread_id)

    # --- writes --------------------------------------------------------------------------

    async def create(self, thread_id: str, body: CheckpointIn,
                     pre: Preconditions) -> tuple[CheckpointRef, bool]:
        """Store a checkpoint and the values it adds; (its key, whether it was a replay)."""
        _channel_versions(body.checkpoint)
        alone = await self._alone(thread_id, [body], [], pre)
        if alone is not None:
            return alone[0], False
        thread = await self._writable(thread_id, pre)
        new = _New(since=len(self.uow.events))
        created = await self._create(thread.id, thread_id, body, new)
        await self._insert(thread.id, new)
        return created

    async def batch(self, thread_id: str, body: CheckpointBatchIn,
                    pre: Preconditions) -> CheckpointBatchOut:
        """Checkpoints and pending writes of one thread in one transaction, as their single
        requests store them (in order: the checkpoints, then the writes): all, or none."""
        for index, checkpoint in enumerate(body.checkpoints):
            try:
                _channel_versions(checkpoint.checkpoint)
            except Unprocessable as error:
                error.extra["errors"] = [
                    {**e, "pointer": f"/checkpoints/{index}{e['pointer']}"}
                    for e in error.extra["errors"]]
                raise
        writes = sum(len(w.writes) for w in body.writes)
        alone = await self._alone(thread_id, body.checkpoints, body.writes, pre)
        if alone is not None:
            return CheckpointBatchOut(checkpoints=[
                CheckpointBatchRef(**ref.model_dump(), replayed=False) for ref in alone],
                writes=writes)
        thread = await self._writable(thread_id, pre)
        new, refs = _New(since=len(self.uow.events)), []
        for checkpoint in body.checkpoints:
            ref, replayed = await self._create(thread.id, thread_id, checkpoint, new)
            refs.append(CheckpointBatchRef(**ref.model_dump(), replayed=replayed))
        self._store_writes(thread_id, body.writes, new)
        await self._insert(thread.id, new)
        return CheckpointBatchOut(checkpoints=refs, writes=writes)

    async def _alone(self, thread_id: str, checkpoints: list[CheckpointIn],
                     tasks: list[TaskWritesIn], pre: Preconditions) -> list[CheckpointRef] | None:
        """The write as one statement that commits by itself (`UnitOfWork.autocommit`,
        `CheckpointRepository.store_alone`: one round trip where the transaction takes
        five; two when a list extends a stored one, which is read first), for at most one
        checkpoint and no If-Match. The new checkpoints' keys; None if it stored nothing
        (the thread is not live, a value it refers to is missing or was changed since it
        was read, or the checkpoint's key is taken) or cannot run so: then the transaction
        does the write, and gives its answer (the thread created, 404, 410, 409, a replay)."""
        if (len(checkpoints) > 1 or pre.expected_revisions() is not None
                or not await self.uow.autocommit()):
            return None
        new = _New(since=len(self.uow.events))
        row, named = None, set()
        try:
            for body in checkpoints:
                named = await self._store_values(thread_id, body, new)
                row = _checkpoint_row(body)
                self._record("created", thread_id,
                             f"{checkpoints_path(thread_id)}/{body.checkpoint_id}")
        except CheckpointItemsMissing:  # judged again in the transaction
            found = None
        else:
            self._store_writes(thread_id, tasks, new)
            found = await self.repo.store_alone(
                thread_id, row, list(new.items.values()), list(new.blobs.values()),
                new.writes, self.uow.hand_over(new.since), self.uow.principal.actor,
                new.bases, named)
        if found is None or (row is not None and found.checkpoint_id is None):
            del self.uow.events[new.since:]
            await self.uow.transactional()
            return None
        return [self._ref(thread_id, found)] if row is not None else []

    async def _insert(self, thread_pk: int, new: _New) -> None:
        """What `new` gathered, with the events recorded since (on Postgres, one statement)."""
        events = self.uow.hand_over(new.since) if self.repo.postgres else []
        await self.repo.insert_all(thread_pk, list(new.items.values()), list(new.blobs.values()),
                                   new.writes, events, self.uow.principal.actor)

    async def _create(self, thread_pk: int, thread_id: str, body: CheckpointIn,
                      new: _New) -> tuple[CheckpointRef, bool]:
        values = _checkpoint_row(body)
        # The checkpoint row first: a replay or a conflict is known before any value is
        # written, without a read of its own in the common case.
        row = await self.repo.insert({"thread_pk": thread_pk, **values})
        if row is None:  # stored before (or by a concurrent create)
            existing = await self.repo.get(thread_pk, body.checkpoint_ns, body.checkpoint_id)
            assert existing is not None
            return self._replayed(thread_id, existing, values["content_hash"]), True
        # A no-op on Postgres, where the insert took it; SQLite serialises writers.
        await self.repo.lock_values(thread_pk, exclusive=False)
        named = await self._store_values(thread_pk, body, new)
        missing = named - await self.repo.held_digests(thread_pk, list(named)) if named else ()
        if missing:
            raise CheckpointItemsMissing(
                f"{len(missing)} items sent by digest are not stored in this thread; send "
                "them with type and data.", missing=sorted(d.hex() for d in missing))
        self._record("created", thread_id,
                     f"{checkpoints_path(thread_id)}/{body.checkpoint_id}")
        return self._ref(thread_id, row), False

    def _replayed(self, thread_id: str, existing: AnyRow, digest: str) -> CheckpointRef:
        if existing.content_hash != digest:
            raise CheckpointExists(
                f"Checkpoint {existing.checkpoint_id!r} in namespace "
                f"{existing.checkpoint_ns!r} exists with other content; checkpoints are "
                "immutable.")
        return self._ref(thread_id, existing)

    @staticmethod
    def _ref(thread_id: str, row: AnyRow) -> CheckpointRef:
        return CheckpointRef(thread_id=thread_id, checkpoint_ns=row.checkpoint_ns,
                             checkpoint_id=row.checkpoint_id,
                             parent_checkpoint_id=row.parent_checkpoint_id,
                             created_at=row.created_at)

    async def _store_values(self, thread: int | str, body: CheckpointIn,
                            new: _New) -> set[bytes]:
        """Gather the values `body` adds into `new` (their lists' items and chunks too: an
        item is named by its content's digest, so a repeat is the same row), reading the
        stored lists they extend from the thread (by its key, or its id); the digests of
        the stored items they name, for the caller to check."""
        blobs: list[dict[str, Any]] = []
        referenced: set[bytes] = set()
        for value in body.values:
            row: dict[str, Any] = {"checkpoint_ns": body.checkpoint_ns, "channel": value.channel,
                                   "version": version_key(value.version), "type": value.type,
                                   "data": value.data, "items": None}
            if value.items is not None:
                digests: list[bytes] = []
                for item in value.items:
                    if item.data is not None and item.type is not None:
                        key = item_digest(item.type, item.data)
                        new.items[key] = {"digest": key, "type": item.type, "data": item.data}
                    else:
                        assert item.digest is not None
                        key = bytes.fromhex(item.digest)
                        referenced.add(key)
                    digests.append(key)
                chunks: list[bytes] = []
                if value.base_version is not None:
                    # The stored list at base_version, then these items: its full chunks are
                    # kept as they are, its last one is continued.
                    chunks, tail = await self._base(thread, body.checkpoint_ns,
                                                    value.channel, value.base_version, new)
                    digests = tail + digests
                for start in range(0, len(digests), CHUNK):
                    data = b"".join(digests[start:start + CHUNK])
                    key = item_digest(CHUNK_TYPE, data)
                    new.items[key] = {"digest": key, "type": CHUNK_TYPE, "data": data}
                    chunks.append(key)
                row["items"] = b"".join(chunks)
            blobs.append(row)
        for row in blobs:  # the first value under a key is kept, as the insert keeps it
            new.blobs.setdefault((row["checkpoint_ns"], row["channel"], row["version"]), row)
        return referenced - new.items.keys()

    async def _base(self, thread: int | str, ns: str, channel: str, version: Version,
                    new: _New) -> tuple[list[bytes], list[bytes]]:
        """The full chunks of a stored list value (kept in `new.bases`) or of one this
        request stores, and the item digests of its last chunk when that one is not full;
        409 if the thread holds no such list."""
        key = version_key(version)
        found = await self.repo.list_value(thread, ns, channel, key)  # with its last chunk
        stored = found._mapping["items"] if found is not None else None
        if stored is not None:
            new.bases.append((ns, channel, key, stored))
        last = found.last if found is not None else None
        if found is None and (ns, channel, key) in new.blobs:  # an earlier one of the batch
            stored = new.blobs[(ns, channel, key)]["items"]
            chunk = new.items.get(stored[-DIGEST_BYTES:]) if stored else None
            last = chunk["data"] if chunk is not None else None
        if stored is None:
            raise CheckpointItemsMissing(
                f"Version {key!r} of channel {channel!r} is not a list stored in this thread; "
                "send every item.", missing=[])
        chunks = _split(stored)
        if not chunks:
            return [], []
        if last is None:
            raise CheckpointItemsMissing(f"The last chunk of version {key!r} of channel "
                                         f"{channel!r} is not stored; send every item.",
                                         missing=[chunks[-1].hex()])
        tail = _split(last)
        return (chunks, []) if len(tail) == CHUNK else (chunks[:-1], tail)

    async def put_writes(self, thread_id: str, checkpoint_id: str, body: WritesIn,
                         pre: Preconditions) -> int:
        """Store a task's pending writes against a checkpoint; repeats of (task_id, idx) are
        ignored. How many writes were sent.

        The checkpoint need not be stored yet: graph runtimes save checkpoints in the
        background (LangGraph's default durability), so a task's writes may arrive first.
        They are read with the checkpoint once it is there, and deleted with it."""
        task = TaskWritesIn(checkpoint_id=checkpoint_id, **dict(body))
        if await self._alone(thread_id, [], [task], pre) is not None:
            return len(body.writes)
        thread = await self._writable(thread_id, pre)
        new = _New(since=len(self.uow.events))
        self._store_writes(thread_id, [task], new)
        await self._insert(thread.id, new)
        return len(body.writes)

    def _store_writes(self, thread_id: str, tasks: list[TaskWritesIn], new: _New) -> None:
        new.writes.extend(
            {"checkpoint_ns": task.checkpoint_ns, "checkpoint_id": task.checkpoint_id,
             "task_id": task.task_id, "idx": write.idx, "channel": write.channel,
             "type": write.type, "data": write.data, "task_path": task.task_path}
            for task in tasks for write in task.writes)
        for task in tasks:
            self._record("writes_added", thread_id,
                         f"{checkpoints_path(thread_id)}/{task.checkpoint_id}/writes")

    async def delete_all(self, thread_id: str, pre: Preconditions) -> int:
        thread = await self._writable(thread_id, pre, create=False)
        await self.repo.lock_values(thread.id, exclusive=True)
        count = await self.repo.delete_all(thread.id)
        self._record("deleted", thread_id)
        return count

    async def prune(self, thread_id: str, keep: int, pre: Preconditions) -> int:
        """Keep the newest `keep` checkpoints of each namespace; how many were deleted."""
        thread = await self._writable(thread_id, pre, create=False)
        if keep == 0:
            await self.repo.lock_values(thread.id, exclusive=True)
            count = await self.repo.delete_all(thread.id)
        else:
            seen: dict[str, int] = defaultdict(int)
            doomed = []
            for row in await self.repo.keys(thread.id):
                seen[row.checkpoint_ns] += 1
                if seen[row.checkpoint_ns] > keep:
                    doomed.append(row)
            await self.repo.lock_values(thread.id, exclusive=True)
            await self.repo.delete_checkpoints(thread.id, doomed)
            await self._collect(thread.id)
            count = len(doomed)
        self._record("pruned", thread_id)
        return count

    async def delete_runs(self, run_ids: list[str]) -> int:
        """Delete the tenant's checkpoints whose metadata names one of the runs."""
        rows = await self.repo.of_runs(run_ids) if run_ids else []
        by_thread: dict[int, list[AnyRow]] = defaultdict(list)
        for row in rows:
            by_thread[row.thread_pk].append(row)
        for thread_pk, doomed in sorted(by_thread.items()):  # locks in one order
            await self.repo.lock_values(thread_pk, exclusive=True)
            await self.repo.delete_checkpoints(thread_pk, doomed)
            await self._collect(thread_pk)
        if rows:
            self.uow.record("checkpoint.runs_deleted", "/v1/checkpoints/delete-runs",
                            revision=None)
        return len(rows)

    async def _collect(self, thread_pk: int) -> None:
        """Drop the values and items no remaining checkpoint of the thread refers to."""
        used: set[tuple[str, str, str]] = set()
        for row in await self.repo.versions_in_use(thread_pk):
            for channel, version in _channel_versions(row.checkpoint).items():
                used.add((row.checkpoint_ns, channel, version))
        blobs = await self.repo.blob_keys(thread_pk)
        unused = [(r.checkpoint_ns, r.channel, r.version) for r in blobs
                  if (r.checkpoint_ns, r.channel, r.version) not in used]
        await self.repo.delete_blobs(thread_pk, unused)
        chunks = {d for r in blobs if (r.checkpoint_ns, r.channel, r.version) in used
                  for d in _split(r._mapping["items"])}
        kept_items = chunks | {d for row in (await self.repo.items(thread_pk, list(chunks))
                                             if chunks else [])
                               for d in _split(row.data)}
        await self.repo.delete_items(thread_pk, [
            d for d in await self.repo.item_digests(thread_pk) if d not in kept_items])

    async def copy(self, thread_id: str, target_id: str, pre: Preconditions) -> int:
        """Copy every checkpoint (with values and writes) into another thread."""
        source = await self._writable(thread_id, pre, create=False)
        target = await self.threads.for_child_write(target_id)
        await self.repo.lock_values(source.id, exclusive=False)  # no collection mid-copy
        count = await self.repo.copy(source.id, target.id, utcnow())
        self._record("copied", target_id)
        return count

    # --- reads ---------------------------------------------------------------------------

    async def latest(self, thread_id: str, ns: str, *, by_digest: bool = False,
                     delta_channels: list[str] | None = None,
                     known_seeds: Collection[str] = ()) -> LatestCheckpointOut:
        """The newest checkpoint of `ns`, with the delta history of `delta_channels` (the
        walk `delta_history` does, for this checkpoint)."""
        channels = list(dict.fromkeys(delta_channels or ()))
        found = await self.repo.latest(thread_id, ns, channels)
        if found is None:
            await self.threads.live_pk(thread_id)  # 404/410 for the thread itself first
            raise CheckpointNotFound(
                f"Thread {thread_id!r} has no checkpoint in namespace {ns!r}.")
        row, read = found
        out = (await self._expand(thread_id, row.thread_pk, [row], by_digest, read))[0]
        history = (await self.delta_history(
            thread_id, ns, row.checkpoint_id, channels, by_digest=by_digest,
            thread_pk=row.thread_pk, known_seeds=known_seeds,
            walked=None if read is None else read[2])).channels if channels else None
        return LatestCheckpointOut.model_construct(**dict(out), delta_history=history)

    async def get(self, thread_id: str, ns: str, checkpoint_id: str, *,
                  by_digest: bool = False) -> CheckpointOut:
        pk = await self.threads.live_pk(thread_id)
        row = await self.repo.get(pk, ns, checkpoint_id)
        if row is None:
            raise CheckpointNotFound(
                f"Checkpoint {checkpoint_id!r} in namespace {ns!r} of thread {thread_id!r} "
                "does not exist.")
        return (await self._expand(thread_id, pk, [row], by_digest))[0]

    async def history(self, thread_id: str, *, ns: str | None, before: str | None,
                   metadata: dict[str, Any] | None, limit: int,
                   cursor: str | None, by_digest: bool = False) -> Page[CheckpointOut]:
        pk = await self.threads.live_pk(thread_id)
        after = decode_name_cursor(CURSOR, cursor, 2)
        rows = await self.repo.page(pk, ns=ns, before=before,
                                    after=(after[0], after[1]) if after else None,
                                    metadata=metadata, limit=limit + 1)
        page = split_page(CURSOR, rows, limit,
                          lambda row: [row.checkpoint_id, row.checkpoint_ns], lambda row: row)
        return Page(data=await self._expand(thread_id, pk, page.data, by_digest),
                    next_cursor=page.next_cursor, has_more=page.has_more)

    async def items(self, thread_id: str, digests: list[str]) -> list[DigestItemOut]:
        """The items of the thread with these digests (hex); unknown ones are left out."""
        pk = await self.threads.live_pk(thread_id)
        keys = [bytes.fromhex(d) for d in digests]
        return [DigestItemOut(**item_out(r.type, r.data), digest=r.digest.hex())
                for r in (await self.repo.items(pk, keys) if keys else [])
                if r.type != CHUNK_TYPE]

    async def _lists(self, pk: int, blobs: Iterable[AnyRow], by_digest: bool,
                     ) -> tuple[dict[bytes, list[bytes]], dict[bytes, CheckpointItemOut]]:
        """The chunks (digest -> item digests) of the list values among `blobs`, and their
        items (none with `by_digest`), in two statements for all of them."""
        chunk_keys = [d for r in blobs for d in _split(r._mapping["items"])]
        chunks = {r.digest: _split(r.data)
                  for r in (await self.repo.items(pk, chunk_keys) if chunk_keys else [])}
        digests = [d for chunk in chunks.values() for d in chunk]
        items = {} if by_digest else {
            r.digest: item_out(r.type, r.data)
            for r in (await self.repo.items(pk, digests) if digests else [])}
        return chunks, items

    @staticmethod
    def _value(blob: AnyRow, chunks: dict[bytes, list[bytes]],
               items: dict[bytes, CheckpointItemOut], by_digest: bool) -> ValueOut:
        if blob._mapping["items"] is None:
            return ValueOut(type=blob.type, data=blob.data)
        if by_digest:
            return ValueOut(type=blob.type, digests=[
                d.hex() for c in _split(blob._mapping["items"]) for d in chunks[c]])
        return ValueOut(type=blob.type, items=[
            items[d] for c in _split(blob._mapping["items"]) for d in chunks[c]])

    async def _expand(self, thread_id: str, pk: int, rows: list[AnyRow],
                      by_digest: bool = False,
                      read: Read | None = None,
                      ) -> list[CheckpointOut]:
        """The checkpoints with their values (items resolved, or their digests only with
        `by_digest`) and pending writes, read in a few statements for the whole page (or
        `read`: the values and writes of the one checkpoint of `rows`, read with it)."""
        versions = {row.id: _channel_versions(row.checkpoint) for row in rows}
        if read is None:
            keys = [(row.checkpoint_ns, ch, v) for row in rows
                    for ch, v in versions[row.id].items()]
            blobs = {(r.checkpoint_ns, r.channel, r.version): r
                     for r in await self.repo.blobs(pk, keys)}
            found = [((r.checkpoint_ns, r.checkpoint_id), r) for r in await self.repo.writes(
                pk, [(row.checkpoint_ns, row.checkpoint_id) for row in rows])]
        else:
            (row,) = rows
            blobs = {(row.checkpoint_ns, r.channel, r.version): r for r in read[0]}
            found = [((row.checkpoint_ns, row.checkpoint_id), r) for r in read[1]]
        chunks, items = await self._lists(pk, blobs.values(), by_digest)
        writes: dict[tuple[str, str], list[WriteOut]] = defaultdict(list)
        for key, r in found:
            writes[key].append(WriteOut(task_id=r.task_id, idx=r.idx, channel=r.channel,
                                        type=r.type, data=r.data, task_path=r.task_path))
        out = []
        for row in rows:
            values: dict[str, ValueOut] = {}
            for channel, version in versions[row.id].items():
                blob = blobs.get((row.checkpoint_ns, channel, version))
                if blob is not None:
                    values[channel] = self._value(blob, chunks, items, by_digest)
            out.append(CheckpointOut(
                thread_id=thread_id, checkpoint_ns=row.checkpoint_ns,
                checkpoint_id=row.checkpoint_id,
                parent_checkpoint_id=row.parent_checkpoint_id, checkpoint=row.checkpoint,
                metadata=row.metadata, values=values,
                pending_writes=writes[(row.checkpoint_ns, row.checkpoint_id)],
                created_at=row.created_at))
        return out

    async def delta_history(self, thread_id: str, ns: str, checkpoint_id: str | None,
                            channels: list[str], *, by_digest: bool = False,
                            thread_pk: int | None = None,
                            known_seeds: Collection[str] = (),
                            walked: list[AnyRow] | None = None) -> DeltaHistoryOut:
        """Per channel, the pending writes on the parent chain of a checkpoint (`None`: the
        newest of `ns`) since the nearest ancestor that stores a value for it, oldest first,
        and that value (the seed; None if the walk reached the root). The checkpoint's own
        writes are not included, the seed ancestor's are (a stored value is the state
        entering its checkpoint). LangGraph's `get_delta_channel_history`, one statement.
        A channel named twice is walked once (the answer is keyed by channel). A seed whose
        digest is in `known_seeds` (the client holds it) is named by its digest only.
        `walked`: the walk's rows, read already with the checkpoint (`repo.latest`)."""
        channels = list(dict.fromkeys(channels))
        rows = (walked if walked is not None
                else await self.repo.delta_history(thread_id, ns, checkpoint_id, channels))
        target = next((r for r in rows if r.kind == "t"), None)
        if target is None:
            await self.threads.live_pk(thread_id)  # 404/410 for the thread itself first
            raise CheckpointNotFound(
                f"Checkpoint {checkpoint_id!r} in namespace {ns!r} of thread {thread_id!r} "
                "does not exist." if checkpoint_id else
                f"Thread {thread_id!r} has no checkpoint in namespace {ns!r}.")
        writes: list[list[AnyRow]] = [[] for _ in channels]
        seeds: dict[int, AnyRow] = {}
        deepest = [0] * len(channels)
        for row in rows:
            if row.kind == "w":
                writes[row.channel].append(row)
            elif row.kind == "s":
                seeds[row.channel] = row
            deepest[row.channel] = max(deepest[row.channel], row.depth)
        if any(deepest[n] >= MAX_WALK and n not in seeds for n in range(len(channels))):
            raise Unprocessable(f"The parent chain of the checkpoint is longer than {MAX_WALK} "
                                "checkpoints (or its parent ids form a cycle).")
        digests = {n: seed_digest(seed) for n, seed in seeds.items()}
        sent = {n: seed for n, seed in seeds.items() if digests[n] not in known_seeds}
        lists = [seed for seed in sent.values() if seed._mapping["items"] is not None]
        chunks: dict[bytes, list[bytes]] = {}
        items: dict[bytes, CheckpointItemOut] = {}
        if lists:
            if thread_pk is None:
                thread_pk = await self.threads.live_pk(thread_id)
            chunks, items = await self._lists(thread_pk, lists, by_digest)
        # Built without validation, as `_lists`'s items: the rows were validated on the way in.
        return DeltaHistoryOut(checkpoint_id=target.checkpoint_id, channels={
            channel: ChannelHistoryOut(
                writes=[DeltaWriteOut.model_construct(
                    checkpoint_id=r.checkpoint_id, task_id=r.task_id, idx=r.idx, type=r.type,
                    data=r.data, task_path=r.task_path)
                        for r in sorted(writes[n], key=lambda r: (-r.depth, r.task_path,
                                                                  r.task_id, r.idx))],
                seed=self._value(sent[n], chunks, items, by_digest) if n in sent else None,
                seed_digest=digests.get(n))
            for n, channel in enumerate(channels)})
