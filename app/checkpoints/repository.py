"""Checkpoint rows, their channel values, list items and pending writes. Every statement is
scoped by tenant; rows are never updated, only inserted (ignoring repeats) and deleted."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    Integer,
    LargeBinary,
    Text,
    and_,
    bindparam,
    case,
    cast,
    delete,
    func,
    literal,
    literal_column,
    null,
    or_,
    select,
    true,
    tuple_,
    union_all,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.types import NullType

from app.checkpoints.models import (
    Checkpoint,
    CheckpointBlob,
    CheckpointItem,
    CheckpointWrite,
    Namespace,
)
from app.db import direct
from app.db.base import AnyRow, Name, table, utcnow
from app.db.dialect import dialect_name, insert_ignoring_conflicts, json_contains
from app.db.unit import PendingEvent
from app.events.models import Event
from app.events.repository import written_by
from app.threads.models import Thread

c = table(Checkpoint)
b = table(CheckpointBlob)
i = table(CheckpointItem)
w = table(CheckpointWrite)
e = table(Event)
t = table(Thread)
# Bound parameters per statement stay well below SQLite's 32766 and asyncpg's 32767.
_CHUNK = 500
_LOCK_NAMESPACE = 0x61676370  # "agcp": a thread's checkpoint values (see `lock_values`)


_INSERTED = ("tenant_id", "thread_pk", "checkpoint_ns", "checkpoint_id", "parent_checkpoint_id",
             "checkpoint", "metadata", "content_hash", "created_at", "run_id")


def _const(sql: str, type_: Any = Integer) -> Any:
    """A constant rendered into the statement (a bound one has no type Postgres can infer
    in a select list)."""
    return literal_column(sql, type_)


# The statements of every graph step are built once (per backend) with bound parameters:
# SQLAlchemy then finds their compiled form without walking a new statement each time.
@cache
def _insert_checkpoint(postgres: bool) -> Any:
    """The checkpoint row, or nothing if its key is taken. On Postgres the statement takes
    the thread's values lock (shared, see `CheckpointRepository.lock_values`) first, in the
    same round trip: a CTE the row is selected from, so it runs before the insert."""
    values = {name: bindparam(f"v_{name}", type_=c.c[name].type) for name in _INSERTED}
    conflict = ["thread_pk", "checkpoint_ns", "checkpoint_id"]
    returning = (c.c.id, c.c.checkpoint_ns, c.c.checkpoint_id, c.c.parent_checkpoint_id,
                 c.c.created_at)
    if not postgres:
        return (sqlite.insert(c).values(values).on_conflict_do_nothing(index_elements=conflict)
                .returning(*returning))
    lock = select(func.pg_advisory_xact_lock_shared(
        _const(str(_LOCK_NAMESPACE)), bindparam("lock", type_=Integer)).label("held")
    ).cte("values_lock")
    return (postgresql.insert(c).from_select(list(_INSERTED),
                                             select(*values.values()).select_from(lock))
            .on_conflict_do_nothing(index_elements=conflict).returning(*returning))


@cache
def _insert_ignoring(postgres: bool, name: str) -> Any:
    """INSERT ... ON CONFLICT DO NOTHING into a values, items or writes table, built once."""
    tbl, key = _KEYS[name]
    return (postgresql if postgres else sqlite).insert(tbl).on_conflict_do_nothing(
        index_elements=key)


# On Postgres the lookups by key below start from the keys (`unnest` of array parameters:
# one statement text whatever their count) and fetch each row by its whole key in a LATERAL
# subquery, so the plan is index probes by the full key whatever the planner believes of
# the tables. Written as a join or `= ANY`, a table whose statistics were taken while it was
# small (a new deployment's first minutes, any short benchmark) was planned as a scan of the
# thread's rows filtered against the keys: 1.3 ms for the three values of a 400-turn chat's
# latest read, 0.2 as key lookups (docs/PERFORMANCE.md).
def _by_key(keys: Any, rows: Any) -> Any:
    """`rows` (a SELECT correlated with `keys`), one LATERAL lookup per key."""
    found = rows.lateral("found")
    return select(found).select_from(keys.join(found, true()))


def _unnest(columns: dict[str, Any], **table_valued: Any) -> Any:
    """Rows given as one array parameter per column (named as the column, of its element
    type), as a FROM: one statement text whatever the count."""
    return func.unnest(*(bindparam(name, type_=ARRAY(type_))
                         for name, type_ in columns.items())).table_valued(
                             *columns, **table_valued).render_derived()


def _all_of(columns: dict[str, Any], counted: str) -> Any:
    """`_unnest` as a subquery LIMITed to its own count of rows (`counted`'s cardinality):
    the same rows, and a plan that Postgres keeps. It plans a prepared statement's first
    five executions for their parameters, then keeps one generic plan only if that plan's
    estimated cost is below theirs with their planning. A generic plan estimates an unnest
    of an array parameter at 10 rows (a custom plan at the array's length), so each row's
    lookup counted ten times and a checkpoint write was planned again at every execution
    (0.7-0.8 ms, more than it then ran); the LIMIT by an expression it cannot evaluate is
    estimated at a tenth of that."""
    rows = _unnest(columns)
    return select(rows).limit(func.cardinality(bindparam(
        counted, type_=ARRAY(columns[counted])))).subquery()


def _arrays(name: str, tbl: Any, columns: Sequence[str], **table_valued: Any) -> Any:
    """`_unnest` of rows of `tbl`'s `columns`, each sent as `{name}_{column}`."""
    return _unnest({f"{name}_{column}": tbl.c[column].type for column in columns},
                   **table_valued)


@cache
def _items_by_digest(postgres: bool) -> Any:
    """The items of a thread with these digests: on Postgres one array parameter; on
    SQLite an expanding IN."""
    mine = (i.c.tenant_id == bindparam("tenant"), i.c.thread_pk == bindparam("pk"))
    columns = (i.c.digest, i.c.type, i.c.data)
    if not postgres:
        return select(*columns).where(*mine, i.c.digest.in_(bindparam("digests",
                                                                      expanding=True)))
    keys = _all_of({"digests": LargeBinary}, "digests")
    return _by_key(keys, select(*columns).where(*mine, i.c.digest == keys.c.digests).limit(1))


@cache
def _blobs_by_key() -> Any:
    """Postgres: the values stored under (namespace, channel, version) keys given as three
    arrays of one length."""
    keys = _all_of({"nss": Text, "channels": Text, "versions": Text}, "versions")
    return _by_key(keys, select(b).where(
        b.c.tenant_id == bindparam("tenant"), b.c.thread_pk == bindparam("pk"),
        b.c.checkpoint_ns == keys.c.nss, b.c.channel == keys.c.channels,
        b.c.version == keys.c.versions).limit(1))


@cache
def _writes_by_key() -> Any:
    """Postgres: the pending writes of (namespace, checkpoint id) keys given as two arrays,
    in (task_path, task_id, idx) order."""
    keys = _all_of({"nss": Text, "ids": Text}, "ids")
    # OFFSET 0: a key has many writes (no LIMIT 1), and it keeps the subquery a LATERAL
    # lookup instead of letting the planner flatten it back into a join.
    stmt = _by_key(keys, select(w).where(
        w.c.tenant_id == bindparam("tenant"), w.c.thread_pk == bindparam("pk"),
        w.c.checkpoint_ns == keys.c.nss, w.c.checkpoint_id == keys.c.ids).offset(0))
    found = stmt.selected_columns
    return stmt.order_by(found.task_path, found.task_id, found.idx)


@cache
def _sqlite_blobs_by_key() -> Any:
    """SQLite: the values stored under (namespace, channel, version) keys, a list of them."""
    return select(b).where(
        b.c.tenant_id == bindparam("tenant"), b.c.thread_pk == bindparam("pk"),
        tuple_(b.c.checkpoint_ns, b.c.channel, b.c.version).in_(bindparam("keys", expanding=True)))


@cache
def _sqlite_writes_by_key() -> Any:
    """SQLite: the pending writes of (namespace, checkpoint id) keys, a list of them."""
    return (select(w).where(
        w.c.tenant_id == bindparam("tenant"), w.c.thread_pk == bindparam("pk"),
        tuple_(w.c.checkpoint_ns, w.c.checkpoint_id).in_(bindparam("keys", expanding=True)))
        .order_by(w.c.task_path, w.c.task_id, w.c.idx))


# The columns `insert_all` sends as arrays, per table (tenant_id and thread_pk are one value).
_EVENT_COLUMNS = ("type", "resource", "thread_id")
_ROWS = {"items": ("digest", "type", "data"),
         "blobs": ("checkpoint_ns", "channel", "version", "type", "data", "items"),
         "writes": ("checkpoint_ns", "checkpoint_id", "task_id", "idx", "channel", "type", "data",
                    "task_path")}


def _stored_rows(pk: Any, *source: Any) -> list[Any]:
    """The CTEs that insert a thread's new items, values and pending writes (each table's
    rows as arrays, one per column, through `unnest`; repeats ignored) and the change's
    audit events, for the thread `pk`: one row of each is stored per row of `source` (the
    CTEs `pk` comes from; none: `pk` is a parameter)."""
    parts = []
    tenant = bindparam("tenant", type_=Name)
    for name, columns in _ROWS.items():
        tbl, key = _KEYS[name]
        rows = _arrays(name, tbl, columns)
        parts.append(postgresql.insert(tbl).from_select(
            ["tenant_id", "thread_pk", *columns],
            select(tenant, pk, *(rows.c[f"{name}_{column}"] for column in columns))
            .select_from(*source, rows))
            .on_conflict_do_nothing(index_elements=key).cte(f"new_{name}"))
    # The audit events, in their order: ids are drawn in the order of the SELECT's rows.
    queued = _arrays("events", e, _EVENT_COLUMNS, with_ordinality="n")
    parts.append(written_by(
        select(tenant, bindparam("actor", type_=Name), queued.c.events_type,
               queued.c.events_resource, cast(null(), e.c.revision.type),
               queued.c.events_thread_id, bindparam("at", type_=e.c.at.type))
        .select_from(*source, queued).order_by(queued.c.n)).cte("new_events"))
    return parts


@cache
def _insert_all() -> Any:
    """Postgres: a thread's new items, values and pending writes in one statement, with the
    change's audit events: one round trip where three `executemany`s took three."""
    return select(_const("1")).add_cte(*_stored_rows(bindparam("pk", type_=BigInteger)))


@cache
def _store_alone(checkpoint: bool) -> Any:
    """Postgres: a whole checkpoint write as one statement, to run alone (it commits by
    itself). The live thread `thread` is held FOR KEY SHARE (as `ThreadAggregate
    .for_child_write` holds it); with `checkpoint`, the thread's values lock is taken shared,
    the stored values the checkpoint refers to are held (`base_*`: the lists it extends, with
    the chunk digests read for them; `named`: the items it names by digest), and the
    checkpoint row is inserted (`_insert_checkpoint`'s parameters) if all of them are there;
    the rows of `_insert_all` are stored from that insert. So nothing at all is stored if the
    thread is not live, a value referred to is gone or changed, or the checkpoint's key is
    taken. One row: the thread's key and the new checkpoint's columns (None if it was not
    stored); no row if the thread is not live."""
    tenant = bindparam("tenant", type_=Name)
    thread = (select(t.c.id).where(*_LIVE_THREAD)
              .with_for_update(read=True, key_share=True).cte("live_thread"))
    if not checkpoint:
        return select(thread.c.id.label("pk")).add_cte(*_stored_rows(thread.c.id, thread))
    lock = select(func.pg_advisory_xact_lock_shared(
        _const(str(_LOCK_NAMESPACE)), cast(thread.c.id % 2**31, Integer)).label("held"),
        thread.c.id).cte("values_lock")
    # What the write refers to, held against deletion once the lock is: the lists it extends
    # (with the chunks read for them) and the items it names by digest. Locking reads see
    # what a collection that committed while the lock was awaited left, which the
    # statement's snapshot, taken before, does not.
    # Each is fetched by its whole key (a LATERAL lookup, as `_by_key`: as a join, stale
    # statistics plan a scan of the thread's rows).
    bases = _all_of({"base_nss": Text, "base_channels": Text, "base_versions": Text,
                     "base_items": LargeBinary}, "base_versions")
    base = (select(b.c.version).where(
        b.c.tenant_id == tenant, b.c.thread_pk == lock.c.id,
        b.c.checkpoint_ns == bases.c.base_nss, b.c.channel == bases.c.base_channels,
        b.c.version == bases.c.base_versions, b.c["items"] == bases.c.base_items)
        .limit(1).with_for_update(read=True, key_share=True).lateral("base"))
    held_bases = (select(base.c.version)
                  .select_from(lock.join(bases, true()).join(base, true())).cte("held_bases"))
    named = _all_of({"named": LargeBinary}, "named")
    item = (select(i.c.digest).where(
        i.c.tenant_id == tenant, i.c.thread_pk == lock.c.id, i.c.digest == named.c.named)
        .limit(1).with_for_update(read=True, key_share=True).lateral("item"))
    held_items = (select(item.c.digest)
                  .select_from(lock.join(named, true()).join(item, true())).cte("held_items"))
    values = [tenant, lock.c.id, *(bindparam(f"v_{name}", type_=c.c[name].type)
                                   for name in _INSERTED[2:])]
    held = and_(select(func.count()).select_from(held_bases).scalar_subquery()
                == func.cardinality(bindparam("base_versions", type_=ARRAY(Text))),
                select(func.count()).select_from(held_items).scalar_subquery()
                == func.cardinality(bindparam("named", type_=ARRAY(LargeBinary))))
    new = (postgresql.insert(c).from_select(list(_INSERTED),
                                            select(*values).select_from(lock).where(held))
           .on_conflict_do_nothing(index_elements=["thread_pk", "checkpoint_ns", "checkpoint_id"])
           .returning(c.c.thread_pk, c.c.checkpoint_ns, c.c.checkpoint_id,
                      c.c.parent_checkpoint_id, c.c.created_at).cte("new_checkpoint"))
    return (select(thread.c.id.label("pk"), new.c.checkpoint_ns, new.c.checkpoint_id,
                   new.c.parent_checkpoint_id, new.c.created_at)
            .select_from(thread.outerjoin(new, true()))
            .add_cte(*_stored_rows(new.c.thread_pk, new)))


_KEYS = {"blobs": (b, ["thread_pk", "checkpoint_ns", "channel", "version"]),
         "items": (i, ["thread_pk", "digest"]),
         "writes": (w, ["thread_pk", "checkpoint_ns", "checkpoint_id", "task_id", "idx"])}


# The live thread `thread` of the tenant `tenant`, found by its id.
_LIVE_THREAD = (t.c.tenant_id == bindparam("tenant", type_=Name),
                t.c.thread_id == bindparam("thread"), t.c.deleted_at.is_(None))


def _of_live_thread(postgres: bool, checkpoints: Any) -> Any:
    """`checkpoints` (a SELECT from the checkpoints table) narrowed to `_LIVE_THREAD`. On
    Postgres a LATERAL lookup from the thread row, so the checkpoint key's index is read
    from the thread's end, whatever the statistics say."""
    if not postgres:
        return checkpoints.join(t, t.c.id == c.c.thread_pk).where(*_LIVE_THREAD)
    return _by_key(t, checkpoints.where(c.c.thread_pk == t.c.id)).where(*_LIVE_THREAD)


@cache
def _latest_of_live(postgres: bool) -> Any:
    return _of_live_thread(postgres, select(c).where(
        c.c.tenant_id == bindparam("tenant", type_=Name), c.c.checkpoint_ns == bindparam("ns"))
        .order_by(c.c.checkpoint_id.desc()).limit(1))


# The columns of the records `_latest_whole` returns in its arrays.
BLOB_FIELDS = ("channel", "version", "type", "data", "items")
WRITE_FIELDS = ("task_id", "idx", "channel", "type", "data", "task_path")
_BLOB, _WRITE = direct.row_type(BLOB_FIELDS), direct.row_type(WRITE_FIELDS)
# A checkpoint's values and writes, read with it, and the rows of its delta history (None:
# not asked for).
Read = tuple[list[AnyRow], list[AnyRow], list[AnyRow] | None]


@cache
def _latest_whole(channels: int) -> Any:
    """Postgres: `_latest_of_live`'s row with its values (`blobs`: the stored value of each
    channel version the checkpoint names) and its pending writes (`writes`, in (task_path,
    task_id, idx) order), each an array of records of `BLOB_FIELDS` and `WRITE_FIELDS`:
    one round trip where three statements took three. Each value is fetched by its whole
    key, as `_blobs_by_key` does (the versions are the checkpoint's `channel_versions` as
    JSON text, which is how `version_key` stores a number). With `channels`, `history`:
    the rows of `_delta_history` for the channels `ch{n}`, as records (its target is the
    newest checkpoint too: one statement, one snapshot)."""
    found = _latest_of_live(True).subquery("latest")
    tenant = bindparam("tenant", type_=Name)
    versions = func.json_each_text(found.c.checkpoint.op("->")(
        literal_column("'channel_versions'"))).table_valued("key", "value").render_derived()
    blob = (select(*(b.c[name] for name in BLOB_FIELDS)).where(
        b.c.tenant_id == tenant, b.c.thread_pk == found.c.thread_pk,
        b.c.checkpoint_ns == found.c.checkpoint_ns, b.c.channel == versions.c.key,
        b.c.version == versions.c.value).limit(1).correlate_except(b).lateral("blob"))
    blobs = select(func.row(*(blob.c[name] for name in BLOB_FIELDS))).select_from(
        versions.join(blob, true())).scalar_subquery()
    writes = (select(func.row(*(w.c[name] for name in WRITE_FIELDS))).where(
        w.c.tenant_id == tenant, w.c.thread_pk == found.c.thread_pk,
        w.c.checkpoint_ns == found.c.checkpoint_ns, w.c.checkpoint_id == found.c.checkpoint_id)
        .order_by(w.c.task_path, w.c.task_id, w.c.idx).scalar_subquery())
    whole = select(found, func.array(blobs, type_=NullType).label("blobs"),
                   func.array(writes, type_=NullType).label("writes"))
    if not channels:
        return whole
    walked = _delta_history(True, channels, latest=True).subquery("history")
    history = select(func.row(*walked.c)).select_from(walked).scalar_subquery()
    return whole.add_columns(func.array(history, type_=NullType).label("history"))


@cache
def _list_value(by_thread_id: bool) -> Any:
    """A list value's chunk digests and the data of its last chunk, found by its key (a
    correlated lookup, so by the items' whole key); the thread by its key `pk`, or with
    `by_thread_id` the live thread `thread`."""
    last = (select(i.c.data).where(
        i.c.tenant_id == b.c.tenant_id, i.c.thread_pk == b.c.thread_pk,
        i.c.digest == func.substr(b.c["items"], func.length(b.c["items"]) - 15, 16))
        .scalar_subquery())
    pk = (select(t.c.id).where(*_LIVE_THREAD).scalar_subquery() if by_thread_id
          else bindparam("pk"))
    return (select(b.c["items"], last.label("last"))
            .where(b.c.tenant_id == bindparam("tenant"), b.c.thread_pk == pk,
                   b.c.checkpoint_ns == bindparam("ns"), b.c.channel == bindparam("channel"),
                   b.c.version == bindparam("version")))


# The walk of `delta_history` stops at this depth: a parent chain this long (or a cycle of
# parent ids, which clients could build) is refused instead of walked forever.
MAX_WALK = 100_000
EMPTY = "empty"  # the type of the value a checkpoint stores for a channel that holds none


def _version_of(postgres: bool, checkpoint: Any, channel: Any) -> Any:
    """`checkpoint.channel_versions[channel]` as the text `version_key` stores it."""
    if postgres:
        return cast(checkpoint.op("->")(literal_column("'channel_versions'"))
                    .op("->>")(channel), Text)
    versions = func.json_each(checkpoint, literal_column("'$.channel_versions'")).table_valued(
        "key", "value")
    return (select(cast(versions.c.value, Text)).where(versions.c.key == channel)
            .scalar_subquery())


@cache
def _delta_history(postgres: bool, channels: int, latest: bool) -> Any:
    """One statement: the target checkpoint (`cid`, or the newest of `ns` with `latest`) of
    the live thread `thread`, then per channel `ch{n}` a recursive walk up the target's
    parent chain to the nearest ancestor that stores a value for it (its seed), with the
    channel's pending writes of every ancestor on the way (the seed's own included, the
    target's not). Rows: `kind` t (the target), w (a write) or s (a seed), the channel's
    index, and the ancestor's depth (1: the target's parent)."""
    tenant, ns = bindparam("tenant", type_=Name), bindparam("ns", type_=Namespace)
    target = (select(c.c.thread_pk, c.c.checkpoint_id, c.c.parent_checkpoint_id)
              .where(c.c.tenant_id == tenant, c.c.checkpoint_ns == ns))
    target = (target.order_by(c.c.checkpoint_id.desc()).limit(1) if latest
              else target.where(c.c.checkpoint_id == bindparam("cid")))
    found = _of_live_thread(postgres, target).cte("target")
    pk = select(found.c.thread_pk).scalar_subquery()
    nothing = (cast(null(), Text), cast(null(), Text), cast(null(), Integer))
    parts: list[Any] = [select(
        _const("'t'", Text).label("kind"), _const("-1").label("channel"),
        _const("0").label("depth"), found.c.checkpoint_id, nothing[0].label("task_path"),
        nothing[1].label("task_id"), nothing[2].label("idx"),
        cast(null(), Text).label("type"), cast(null(), LargeBinary).label("data"),
        cast(null(), LargeBinary).label("items"))]
    for n in range(channels):
        channel = bindparam(f"ch{n}", type_=Text)
        walk = select(found.c.checkpoint_id, found.c.parent_checkpoint_id,
                      _const("0").label("depth"), cast(null(), Text).label("version"),
                      _const("0").label("seed")).cte(f"walk{n}", recursive=True)
        # Each step, write and seed is fetched by its whole key: on Postgres as a LATERAL
        # lookup (see `_by_key`; as joins, stale statistics made each step a scan of the
        # thread's checkpoints: 37 ms instead of 1.5 for a walk of 150), on SQLite as joins.
        p: Any = c.alias(f"p{n}")
        parent = (p.c.tenant_id == tenant, p.c.thread_pk == pk, p.c.checkpoint_ns == ns,
                  p.c.checkpoint_id == walk.c.parent_checkpoint_id)
        version = _version_of(postgres, p.c.checkpoint, channel)
        if postgres:
            # The step's columns only, its version read out of its JSON once: a fifth less
            # of the walk's time than the whole row with the version read twice.
            p = select(p.c.thread_pk, p.c.checkpoint_id, p.c.parent_checkpoint_id,
                       version.label("version")).where(*parent).limit(1).lateral(f"step{n}")
            steps, version = walk.join(p, true()), p.c.version
        else:
            steps = p.join(walk, and_(*parent))
        stored = (select(_const("1")).select_from(b)
                  .where(b.c.tenant_id == tenant, b.c.thread_pk == p.c.thread_pk,
                         b.c.checkpoint_ns == ns, b.c.channel == channel,
                         b.c.version == version, b.c.type != EMPTY).exists())
        step = select(p.c.checkpoint_id, p.c.parent_checkpoint_id, walk.c.depth + 1, version,
                      case((stored, _const("1")), else_=_const("0"))).select_from(steps)
        walk = walk.union_all(step.where(walk.c.seed == 0, walk.c.depth < MAX_WALK))
        writes = (w.c.tenant_id == tenant, w.c.thread_pk == pk, w.c.checkpoint_ns == ns,
                  w.c.channel == channel, w.c.checkpoint_id == walk.c.checkpoint_id)
        seeds = (b.c.tenant_id == tenant, b.c.thread_pk == pk, b.c.checkpoint_ns == ns,
                 b.c.channel == channel, b.c.version == walk.c.version)
        found_w: Any
        found_b: Any
        if postgres:
            found_w = select(w).where(*writes).offset(0).lateral(f"w{n}")
            found_b = select(b).where(*seeds).limit(1).lateral(f"b{n}")
            writes_from, seeds_from = walk.join(found_w, true()), walk.join(found_b, true())
        else:
            found_w, found_b = w, b
            writes_from = walk.join(w, and_(*writes))
            seeds_from = walk.join(b, and_(*seeds))
        parts.append(
            select(_const("'w'", Text), _const(str(n)), walk.c.depth, walk.c.checkpoint_id,
                   found_w.c.task_path, found_w.c.task_id, found_w.c.idx, found_w.c.type,
                   found_w.c.data, cast(null(), LargeBinary))
            .select_from(writes_from).where(walk.c.depth >= 1))
        parts.append(
            select(_const("'s'", Text), _const(str(n)), walk.c.depth, walk.c.checkpoint_id,
                   *nothing, found_b.c.type, found_b.c.data, found_b.c["items"])
            .select_from(seeds_from).where(walk.c.seed == 1))
    return union_all(*parts)


@cache
def _history_row() -> Any:
    """The rows of `_delta_history` (its columns, whatever the channels), for its records
    in `_latest_whole`'s `history`."""
    return direct.row_type([column.key for column in
                            _delta_history(True, 1, True).selected_columns])


def _chunks(values: Sequence[Any], size: int = _CHUNK) -> Iterable[Sequence[Any]]:
    for start in range(0, len(values), size):
        yield values[start:start + size]


class CheckpointRepository:
    def __init__(self, connection: AsyncConnection, tenant_id: str) -> None:
        self.connection = connection
        self.tenant_id = tenant_id
        self.postgres = dialect_name(connection) == "postgresql"
        self._shared = False  # this transaction holds the values lock shared (Postgres)

    def _mine(self, tbl: Any, thread_pk: int) -> Any:
        return and_(tbl.c.tenant_id == self.tenant_id, tbl.c.thread_pk == thread_pk)

    async def lock_values(self, thread_pk: int, *, exclusive: bool) -> None:
        """Postgres: a transaction lock on the thread's stored values. Writes that may refer
        to stored values take it shared, deletes that collect unreferenced values take it
        exclusive, so a collection never drops a value a concurrent checkpoint refers to.
        (SQLite serialises writers already.)"""
        if not self.postgres or (self._shared and not exclusive):
            return
        self._shared = self._shared or not exclusive
        lock = func.pg_advisory_xact_lock if exclusive else func.pg_advisory_xact_lock_shared
        await self.connection.execute(select(lock(
            literal(_LOCK_NAMESPACE, Integer), literal(thread_pk % 2**31, Integer))))

    # --- reads ---------------------------------------------------------------------------

    async def get(self, thread_pk: int, ns: str, checkpoint_id: str) -> AnyRow | None:
        return (await self.connection.execute(
            select(c).where(self._mine(c, thread_pk), c.c.checkpoint_ns == ns,
                            c.c.checkpoint_id == checkpoint_id))).first()

    async def latest(self, thread_id: str, ns: str, channels: Sequence[str] = (),
                     ) -> tuple[AnyRow, Read | None] | None:
        """The newest checkpoint of a namespace of the live thread `thread_id`, found by the
        thread's id (its `thread_pk` is the thread's key), in one statement; on Postgres
        with what `_latest_whole` reads with it: its values (rows of `BLOB_FIELDS`), its
        pending writes (rows of `WRITE_FIELDS`, in order) and the rows of its delta history
        for `channels` (as `delta_history`'s; none without channels). None if the thread is
        missing, deleted or has none there."""
        params = {"tenant": self.tenant_id, "thread": thread_id, "ns": ns,
                  **{f"ch{n}": ch for n, ch in enumerate(channels)}}
        if not self.postgres:
            row = await direct.first(self.connection, _latest_of_live(False), params)
            return None if row is None else (row, None)
        found: AnyRow | None = await direct.first(self.connection,
                                                  _latest_whole(len(channels)), params)
        if found is None:
            return None
        return found, ([_BLOB._make(r) for r in found.blobs],
                       [_WRITE._make(r) for r in found.writes],
                       [_history_row()._make(r) for r in found.history] if channels else None)

    async def page(self, thread_pk: int, *, ns: str | None, before: str | None,
                   after: tuple[str, str] | None, metadata: dict[str, Any] | None,
                   limit: int) -> list[AnyRow]:
        """Checkpoints newest first (by id, then namespace), in one namespace or all."""
        stmt = select(c).where(self._mine(c, thread_pk))
        if ns is not None:
            stmt = stmt.where(c.c.checkpoint_ns == ns)
        if before is not None:
            stmt = stmt.where(c.c.checkpoint_id < before)
        if metadata:
            stmt = stmt.where(json_contains(self.connection, c.c.metadata, metadata))
        if after is not None:
            stmt = stmt.where(or_(c.c.checkpoint_id < after[0],
                                  and_(c.c.checkpoint_id == after[0],
                                       c.c.checkpoint_ns < after[1])))
        stmt = stmt.order_by(c.c.checkpoint_id.desc(), c.c.checkpoint_ns.desc()).limit(limit)
        return list((await self.connection.execute(stmt)).all())

    async def delta_history(self, thread_id: str, ns: str, checkpoint_id: str | None,
                            channels: Sequence[str]) -> list[AnyRow]:
        """The rows of `_delta_history` (no rows: the thread or the checkpoint is missing)."""
        params: dict[str, Any] = {"tenant": self.tenant_id, "thread": thread_id, "ns": ns,
                                  **{f"ch{n}": ch for n, ch in enumerate(channels)}}
        if checkpoint_id is not None:
            params["cid"] = checkpoint_id
        stmt = _delta_history(self.postgres, len(channels), checkpoint_id is None)
        return await direct.rows(self.connection, stmt, params)

    async def blobs(self, thread_pk: int, keys: Sequence[tuple[str, str, str]]) -> list[AnyRow]:
        """The values stored under (namespace, channel, version) keys."""
        if self.postgres:
            nss, channels, versions = zip(*set(keys), strict=True) if keys else ((), (), ())
            return await direct.rows(self.connection, _blobs_by_key(), {
                "tenant": self.tenant_id, "pk": thread_pk, "nss": list(nss),
                "channels": list(channels), "versions": list(versions)})
        rows: list[AnyRow] = []
        for chunk in _chunks(sorted(set(keys)), _CHUNK // 3):
            rows.extend((await self.connection.execute(_sqlite_blobs_by_key(), {
                "tenant": self.tenant_id, "pk": thread_pk, "keys": list(chunk)})).all())
        return rows

    async def list_value(self, thread: int | str, ns: str, channel: str,
                         version: str) -> AnyRow | None:
        """A stored value's `items` (its chunks' digests) with `last`, the data of its last
        chunk (None if that chunk is not stored), in one statement; None if no such value.
        The thread by its key, or by its id (live only)."""
        by_id = isinstance(thread, str)
        found: AnyRow | None = await direct.first(self.connection, _list_value(by_id), {
            "tenant": self.tenant_id, "thread" if by_id else "pk": thread, "ns": ns,
            "channel": channel, "version": version})
        return found

    async def items(self, thread_pk: int, digests: Sequence[bytes]) -> list[AnyRow]:
        values = sorted(set(digests))
        rows: list[AnyRow] = []
        for chunk in [values] if self.postgres else _chunks(values):
            rows.extend(await direct.rows(self.connection, _items_by_digest(self.postgres), {
                "tenant": self.tenant_id, "pk": thread_pk, "digests": list(chunk)}))
        return rows

    async def held_digests(self, thread_pk: int, digests: Sequence[bytes]) -> set[bytes]:
        return {row.digest for row in await self.items(thread_pk, digests)}

    async def writes(self, thread_pk: int, keys: Sequence[tuple[str, str]]) -> list[AnyRow]:
        """Pending writes of the (namespace, checkpoint id)s."""
        if self.postgres:
            nss, ids = zip(*set(keys), strict=True) if keys else ((), ())
            return await direct.rows(self.connection, _writes_by_key(), {
                "tenant": self.tenant_id, "pk": thread_pk, "nss": list(nss), "ids": list(ids)})
        rows: list[AnyRow] = []
        for chunk in _chunks(sorted(set(keys)), _CHUNK // 2):
            rows.extend((await self.connection.execute(_sqlite_writes_by_key(), {
                "tenant": self.tenant_id, "pk": thread_pk, "keys": list(chunk)})).all())
        return rows

    async def keys(self, thread_pk: int) -> list[AnyRow]:
        """(id, namespace, checkpoint id) of every checkpoint, newest first per namespace."""
        return list((await self.connection.execute(
            select(c.c.id, c.c.checkpoint_ns, c.c.checkpoint_id)
            .where(self._mine(c, thread_pk))
            .order_by(c.c.checkpoint_ns, c.c.checkpoint_id.desc()))).all())

    async def of_runs(self, run_ids: Sequence[str]) -> list[AnyRow]:
        """(id, thread_pk, namespace, checkpoint id) of the tenant's checkpoints of the runs."""
        return list((await self.connection.execute(
            select(c.c.id, c.c.thread_pk, c.c.checkpoint_ns, c.c.checkpoint_id)
            .where(c.c.tenant_id == self.tenant_id, c.c.run_id.in_(list(run_ids))))).all())

    async def versions_in_use(self, thread_pk: int) -> list[AnyRow]:
        return list((await self.connection.execute(
            select(c.c.checkpoint_ns, c.c.checkpoint).where(self._mine(c, thread_pk)))).all())

    async def blob_keys(self, thread_pk: int) -> list[AnyRow]:
        return list((await self.connection.execute(
            select(b.c.checkpoint_ns, b.c.channel, b.c.version, b.c["items"])
            .where(self._mine(b, thread_pk)))).all())

    async def item_digests(self, thread_pk: int) -> list[bytes]:
        return list((await self.connection.execute(
            select(i.c.digest).where(self._mine(i, thread_pk)))).scalars())

    # --- writes --------------------------------------------------------------------------

    async def insert(self, values: dict[str, Any]) -> AnyRow | None:
        """The new row's key columns (not the checkpoint and metadata documents just sent),
        or None if the (thread, namespace, id) is taken. On Postgres it holds the thread's
        values lock (shared) once it returns, whatever the outcome."""
        row = {"tenant_id": self.tenant_id, **values}
        params = {f"v_{name}": row[name] for name in _INSERTED}
        params["lock"] = values["thread_pk"] % 2**31
        if not self.postgres:
            del params["lock"]
        found: AnyRow | None = await direct.first(
            self.connection, _insert_checkpoint(self.postgres), params)
        self._shared = self.postgres
        return found

    async def _insert_ignoring(self, name: str, rows: list[dict[str, Any]]) -> None:
        if rows:
            await direct.execute_many(
                self.connection, _insert_ignoring(self.postgres, name),
                [{"tenant_id": self.tenant_id, **row} for row in rows])

    async def insert_all(self, thread_pk: int, items: list[dict[str, Any]],
                         blobs: list[dict[str, Any]], writes: list[dict[str, Any]],
                         events: Sequence[PendingEvent] = (), actor: str = "") -> None:
        """New items, values and pending writes of a thread (rows without tenant_id and
        thread_pk), repeats ignored (for writes, of a (checkpoint, task id, idx)): one
        statement on Postgres, with `events` (the audit events of the change, by `actor`,
        in order; Postgres only), one `executemany` per table on SQLite."""
        tables = {"items": items, "blobs": blobs, "writes": writes}
        if not self.postgres:
            assert not events, "SQLite numbers events as it inserts them: the unit writes them"
            for name, rows in tables.items():
                await self._insert_ignoring(name, [{"thread_pk": thread_pk, **row}
                                                   for row in rows])
            return
        if not any(tables.values()) and not events:
            return
        await direct.execute(self.connection, _insert_all(),
                             {"pk": thread_pk, **self._row_params(tables, events, actor)})

    async def store_alone(self, thread_id: str, checkpoint: dict[str, Any] | None,
                          items: list[dict[str, Any]], blobs: list[dict[str, Any]],
                          writes: list[dict[str, Any]], events: Sequence[PendingEvent],
                          actor: str, bases: Sequence[tuple[str, str, str, bytes]] = (),
                          named: Iterable[bytes] = ()) -> AnyRow | None:
        """Postgres: `_store_alone`, the checkpoint row (without tenant_id and thread_pk;
        None: writes only) and what `insert_all` stores, for the live thread `thread_id`,
        if the lists `bases` ((namespace, channel, version, chunk digests)) and the items
        `named` are stored. Its row (None if the thread is not live)."""
        params = {"thread": thread_id, **self._row_params(
            {"items": items, "blobs": blobs, "writes": writes}, events, actor)}
        if checkpoint is not None:
            params.update({f"v_{name}": checkpoint[name] for name in _INSERTED[2:]})
            for column, values in zip(("nss", "channels", "versions", "items"),
                                      zip(*bases, strict=True) if bases else ((),) * 4,
                                      strict=True):
                params[f"base_{column}"] = list(values)
            params["named"] = list(named)
        found: AnyRow | None = await direct.first(
            self.connection, _store_alone(checkpoint is not None), params)
        return found

    def _row_params(self, tables: dict[str, list[dict[str, Any]]],
                    events: Sequence[PendingEvent], actor: str) -> dict[str, Any]:
        """The parameters of `_stored_rows`: each table's rows as one list per column."""
        params: dict[str, Any] = {"tenant": self.tenant_id, "actor": actor, "at": utcnow()}
        for name, rows in tables.items():
            for column in _ROWS[name]:
                params[f"{name}_{column}"] = [row[column] for row in rows]
        for column in _EVENT_COLUMNS:
            params[f"events_{column}"] = [getattr(event, column) for event in events]
        return params

    async def delete_checkpoints(self, thread_pk: int, rows: Sequence[AnyRow]) -> None:
        """Delete checkpoints (rows with id, checkpoint_ns, checkpoint_id) and their writes."""
        for chunk in _chunks(list(rows)):
            await self.connection.execute(
                delete(c).where(self._mine(c, thread_pk), c.c.id.in_([r.id for r in chunk])))
            await self.connection.execute(
                delete(w).where(self._mine(w, thread_pk),
                                tuple_(w.c.checkpoint_ns, w.c.checkpoint_id).in_(
                                    [(r.checkpoint_ns, r.checkpoint_id) for r in chunk])))

    async def delete_all(self, thread_pk: int) -> int:
        """Every checkpoint of the thread with its values, items and writes; how many."""
        gone = await self.connection.execute(
            delete(c).where(self._mine(c, thread_pk)).returning(c.c.id))
        count = len(gone.all())
        for tbl in (w, b, i):
            await self.connection.execute(delete(tbl).where(self._mine(tbl, thread_pk)))
        return count

    async def delete_blobs(self, thread_pk: int, keys: Sequence[tuple[str, str, str]]) -> None:
        for chunk in _chunks(list(keys), _CHUNK // 3):
            await self.connection.execute(
                delete(b).where(self._mine(b, thread_pk),
                                tuple_(b.c.checkpoint_ns, b.c.channel, b.c.version)
                                .in_(list(chunk))))

    async def delete_items(self, thread_pk: int, digests: Sequence[bytes]) -> None:
        for chunk in _chunks(list(digests)):
            await self.connection.execute(
                delete(i).where(self._mine(i, thread_pk), i.c.digest.in_(list(chunk))))

    async def copy(self, source_pk: int, target_pk: int, now: datetime) -> int:
        """Copy every checkpoint, value, item and write of one thread into another (keys the
        target already holds are kept as they are); how many checkpoints were new."""
        target = literal(target_pk, BigInteger)
        copied = 0
        for tbl, conflict in ((c, ["thread_pk", "checkpoint_ns", "checkpoint_id"]),
                              (b, ["thread_pk", "checkpoint_ns", "channel", "version"]),
                              (i, ["thread_pk", "digest"]),
                              (w, ["thread_pk", "checkpoint_ns", "checkpoint_id", "task_id",
                                   "idx"])):
            names = [col.name for col in tbl.c if col.name != "id"]
            columns = [target if name == "thread_pk"
                       else literal(now, c.c.created_at.type) if tbl is c and name == "created_at"
                       else tbl.c[name] for name in names]
            stmt = insert_ignoring_conflicts(
                dialect_name(self.connection), tbl, conflict).from_select(
                names, select(*columns).where(self._mine(tbl, source_pk)))
            if tbl is c:
                stmt = stmt.returning(c.c.id)
                copied = len((await self.connection.execute(stmt)).all())
            else:
                await self.connection.execute(stmt)
        return copied
