"""A LangGraph checkpointer backed by agentstate: `AgentStateSaver`.

    from agentstate_client.langgraph import AgentStateSaver

    saver = AgentStateSaver(base_url="http://127.0.0.1:8080", api_key="agst_...")
    graph = builder.compile(checkpointer=saver)
    graph.invoke({"messages": [...]}, {"configurable": {"thread_id": "user/42/chat"}})

It implements langgraph-checkpoint's `BaseCheckpointSaver` in full, blocking and asyncio
(`put`, `put_writes`, `get_tuple`, `list`, `delete_thread`, `delete_for_runs`, `copy_thread`,
`prune`, `get_delta_channel_history` and their `a...` forms), over the checkpoint endpoints
of the HTTP API (API.md 7a). Install with `pip install 'agentstate-client[langgraph]'`.
Each operation is written once, as steps (agentstate_client._core) that the blocking client
runs for the plain method and the asyncio client for its `a...` form.

- LangGraph thread ids of any string map onto agentstate thread ids with
  `agentstate_client.ids.encode_id` (`user/42/chat` is the thread `user@2F42@2Fchat`).
- Values are serialized by the saver's `serde` (LangGraph's `JsonPlusSerializer` by
  default) and travel as `{"type": tag, "data": base64}`. Only the channels whose version
  changed are sent with a checkpoint; the server keeps one value per channel version.
- A channel whose value is a plain `list` (a `MessagesState`'s `messages`) is sent item by
  item: the server stores each item once per thread, and the saver sends items it has
  already stored by their digest only. A 400-turn chat then stores each message once instead
  of once per version of the list. A saver that has not seen the thread (a new process) reads
  a checkpoint with its items in one request, and then sends what the lists gained since.
- A DeltaChannel's history is one request: the server walks the parent chain. Its
  snapshots of a list (`_DeltaSnapshot(list)`) are sent item by item like a list.
- Async writes of one thread are stored by group commit (`_Pipe`): the calls made while the
  thread's previous request is in flight go as one request, one transaction, and each call
  returns once its own write is committed.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import secrets
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, TypeGuard, TypeVar

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        DeltaChannelHistory,
        get_checkpoint_id,
        get_serializable_checkpoint_metadata,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("agentstate_client.langgraph needs langgraph-checkpoint: "
                      "pip install 'agentstate-client[langgraph]'") from exc

try:  # langgraph-checkpoint 4.3+ (DeltaChannel); before it, no value is a snapshot
    from langgraph.checkpoint.serde.types import _DeltaSnapshot
except ImportError:  # pragma: no cover - depends on the environment
    class _DeltaSnapshot(tuple[Any, ...]):  # type: ignore[no-redef]
        value: Any

from agentstate_client._adapters import ClientPair
from agentstate_client._api import _Api
from agentstate_client._async import AsyncAgentStateClient
from agentstate_client._core import Op
from agentstate_client._langgraph_store import AgentStateStore
from agentstate_client._sync import AgentStateClient
from agentstate_client.errors import AgentStateError, CheckpointItemsMissing, NotFound
from agentstate_client.ids import decode_id, encode_id

__all__ = ["AgentStateSaver", "AgentStateStore"]

LIST_TYPE = "agentstate.list"  # the type tag of a value sent as its items
# A DeltaChannel's snapshot of a list (its messages), sent as the list's items too: each
# snapshot stores the messages since the previous one, not the whole log again.
SNAPSHOT_LIST_TYPE = "agentstate.delta-snapshot.list"
EMPTY_TYPE = "empty"  # a channel in new_versions that holds no value any more
_PAGE = 100  # the server's largest page
_KNOWN_THREADS = 256  # threads whose stored item digests the saver remembers
_KEYS = 4 * _KNOWN_THREADS  # (thread, namespace, channel)s whose last list and seed it keeps
_FETCH = 5000  # items asked for in one request
_CHANNELS = 32  # channels of one delta history request
_BATCH = 100  # saver calls stored by one request
_SETTLE_TICKS = 3  # event loop passes the group commit waits after answering its callers
P = ParamSpec("P")
R = TypeVar("R")
Items = dict[str, tuple[str, bytes]]  # digest -> (type tag, bytes)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def item_digest(type_: str, data: bytes) -> str:
    """The digest the server stores an item under (API.md 7a)."""
    return hashlib.sha256(type_.encode() + b"\x00" + data).digest()[:16].hex()


def _kept(found: CheckpointTuple | None,
          wanted: dict[str, Any] | None) -> TypeGuard[CheckpointTuple]:
    """Whether `found` exists and its metadata holds every pair of `wanted` (list's filter)."""
    return found is not None and all(found.metadata.get(k) == v
                                     for k, v in (wanted or {}).items())


class AgentStateSaver(ClientPair, BaseCheckpointSaver[str]):
    """LangGraph's checkpointer interface over agentstate's HTTP API.

    Pass `base_url` and `api_key` as to `AgentStateClient` (they default to
    `$AGENTSTATE_URL` and `$AGENTSTATE_API_KEY`), or ready-made `client` / `async_client`.
    `list_items=False` sends list values whole instead of item by item.
    """

    def __init__(self, base_url: str | None = None, *, api_key: str | None = None,
                 serde: SerializerProtocol | None = None, timeout: float = 30.0,
                 client: AgentStateClient | None = None,
                 async_client: AsyncAgentStateClient | None = None,
                 list_items: bool = True, item_cache_bytes: int = 64 * 1024 * 1024) -> None:
        super().__init__(serde=serde)
        self._use_clients(base_url, api_key, timeout, client, async_client)
        self._list_items = list_items
        # thread name -> digests of items the server holds for it (as far as we know).
        self._known: OrderedDict[str, set[str]] = OrderedDict()
        # (thread name, namespace, channel) -> the version and item digests of the list this
        # saver stored last: a list that extends it is sent as what it gained.
        self._lists: OrderedDict[tuple[str, str, str], tuple[Any, list[str]]] = OrderedDict()
        # digest -> (type, bytes) of list items sent or read: reads ask for digests only and
        # fetch the items missing here. Content-addressed, so never stale.
        self._items: OrderedDict[str, tuple[str, bytes]] = OrderedDict()
        self._items_bytes = 0
        self._item_cache_bytes = item_cache_bytes
        # thread name -> the channels a delta history was last asked for: the next read of
        # the thread's newest checkpoint asks for their history along with it, and
        # thread name -> namespace -> (checkpoint id, that history) until it is asked for
        # (a write to the thread, or its deletion, drops it: it may be stale then).
        self._delta_channels: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        self._delta_ahead: dict[str, dict[str, tuple[str, dict[str, Any]]]] = {}
        # (thread name, namespace, channel) -> (digest, value) of the seed its delta history
        # had last: named in the next read's `known_seed`, it is not sent again (a
        # DeltaChannel's seed is the same from one snapshot to the next).
        self._seeds: OrderedDict[tuple[str, str, str], tuple[str, dict[str, Any]]] = (
            OrderedDict())
        self._lock = threading.Lock()
        self._pipe_: _Pipe | None = None

    def _pipe(self) -> _Pipe:
        """The group commit of the running event loop's client."""
        api = self._aclient()
        if self._pipe_ is None or self._pipe_.api is not api:
            self._pipe_ = _Pipe(self, api)
        return self._pipe_

    def get_next_version(self, current: str | None, channel: None = None) -> str:
        """A channel version unique to this write: the counter, then random digits.

        Values are stored once per (channel, version), so a fork (`update_state` on a past
        checkpoint) must not reuse the version a later checkpoint of the other branch holds.
        Zero-padded to a fixed width, so versions compare as their counters do (as LangGraph's
        own savers); 48 random bits tell apart two branches' writes of the same counter."""
        if current is None:
            counter = 0
        elif isinstance(current, int):
            counter = current
        else:
            counter = int(str(current).split(".", 1)[0])
        return f"{counter + 1:016}.{secrets.token_hex(6)}"

    # --- encoding ------------------------------------------------------------------------

    def _known_for(self, thread: str) -> set[str]:
        with self._lock:
            known = self._known.get(thread)
            if known is None:
                known = self._known[thread] = set()
                while len(self._known) > _KNOWN_THREADS:
                    self._known.popitem(last=False)
            else:
                self._known.move_to_end(thread)
            return known

    def _forget(self, thread: str) -> None:
        with self._lock:
            self._known.pop(thread, None)
            self._delta_ahead.pop(thread, None)
            for cache in (self._lists, self._seeds):
                for key in [key for key in cache if key[0] == thread]:
                    del cache[key]

    def _value(self, where: tuple[str, str, str], version: Any, value: Any, known: set[str],
               sent: _Sent) -> dict[str, Any]:
        channel = where[2]
        snapshot = type(value) is _DeltaSnapshot and type(value.value) is list
        if self._list_items and (type(value) is list or snapshot):
            encoded = [self.serde.dumps_typed(element)
                       for element in (value.value if snapshot else value)]
            digests = [item_digest(type_, data) for type_, data in encoded]
            self._cache_items(zip(digests, encoded))
            sent.items.extend(digests)
            sent.lists[where] = (version, digests)
            value_: dict[str, Any] = {"channel": channel, "version": version,
                                      "type": SNAPSHOT_LIST_TYPE if snapshot else LIST_TYPE}
            start = 0
            with self._lock:
                last = self._lists.get(where)
            if last is not None and digests[:len(last[1])] == last[1]:
                value_["base_version"], start = last[0], len(last[1])
            value_["items"] = [{"digest": digest} if digest in known
                               else {"type": type_, "data": _b64(data)}
                               for (type_, data), digest in zip(encoded[start:], digests[start:])]
            return value_
        type_, data = self.serde.dumps_typed(value)
        return {"channel": channel, "version": version, "type": type_, "data": _b64(data)}

    def _remember(self, thread: str, sent: _Sent | None) -> None:
        if sent is None:
            return
        with self._lock:
            self._known.setdefault(thread, set()).update(sent.items)
            for where, last in sent.lists.items():
                _keep_newest(self._lists, where, last)

    def _put_body(self, config: RunnableConfig, checkpoint: Checkpoint,
                  metadata: CheckpointMetadata, new_versions: ChannelVersions,
                  known: set[str]) -> tuple[dict[str, Any], _Sent]:
        conf = config["configurable"]
        thread = encode_id(str(conf["thread_id"]))
        ns = conf.get("checkpoint_ns", "")
        stored: dict[str, Any] = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        values = checkpoint["channel_values"]
        sent = _Sent()
        blobs = [self._value((thread, ns, channel), version, values[channel], known, sent)
                 if channel in values else
                 {"channel": channel, "version": version, "type": EMPTY_TYPE, "data": ""}
                 for channel, version in new_versions.items()]
        body = {
            "checkpoint_ns": conf.get("checkpoint_ns", ""), "checkpoint_id": checkpoint["id"],
            "parent_checkpoint_id": conf.get("checkpoint_id"), "checkpoint": stored,
            "metadata": get_serializable_checkpoint_metadata(config, metadata),
            "values": blobs,
        }
        return body, sent

    def _cache_items(self, items: Iterable[tuple[str, tuple[str, bytes]]]) -> None:
        with self._lock:
            for digest, item in items:
                if digest in self._items:
                    self._items.move_to_end(digest)
                    continue
                self._items[digest] = item
                self._items_bytes += len(item[1])
            while self._items_bytes > self._item_cache_bytes and self._items:
                self._items_bytes -= len(self._items.popitem(last=False)[1][1])

    def _needed(self, values: Iterable[dict[str, Any]]) -> tuple[Items, list[str]]:
        """The items the values name that the cache holds, and the digests it lacks."""
        held: Items = {}
        missing: set[str] = set()
        with self._lock:
            for value in values:
                for digest in value.get("digests") or ():
                    item = self._items.get(digest)
                    if item is None:
                        missing.add(digest)
                    else:
                        held[digest] = item
        return held, sorted(missing)

    def _keep_fetched(self, held: Items, fetched: Sequence[dict[str, Any]]) -> None:
        items = [(item["digest"], (item["type"], base64.b64decode(item["data"])))
                 for item in fetched]
        held.update(items)
        self._cache_items(items)

    def _fill(self, api: _Api, name: str, values: Iterable[dict[str, Any]]) -> Op[Items]:
        """The items `values` name by digest: from the cache, the rest fetched."""
        held, missing = self._needed(values)
        for start in range(0, len(missing), _FETCH):
            self._keep_fetched(held, (yield from _Api.get_checkpoint_items.steps(
                api, name, missing[start:start + _FETCH])))
        return held

    def _decode(self, value: dict[str, Any], items: Items) -> Any:
        if value.get("digests") is not None:
            decoded: Any = [self.serde.loads_typed(items[digest]) for digest in value["digests"]]
        elif value.get("items") is not None:
            decoded = [self.serde.loads_typed((item["type"], base64.b64decode(item["data"])))
                       for item in value["items"]]
        else:
            return self.serde.loads_typed((value["type"],
                                           base64.b64decode(value["data"] or "")))
        return _DeltaSnapshot(decoded) if value["type"] == SNAPSHOT_LIST_TYPE else decoded

    def _tuple(self, thread_id: str, body: dict[str, Any], items: Items) -> CheckpointTuple:
        ns = body["checkpoint_ns"]
        checkpoint: dict[str, Any] = dict(body["checkpoint"])
        checkpoint["channel_values"] = {
            channel: self._decode(value, items) for channel, value in body["values"].items()
            if value["type"] != EMPTY_TYPE}
        parent = body["parent_checkpoint_id"]
        return CheckpointTuple(
            config={"configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                                     "checkpoint_id": body["checkpoint_id"]}},
            checkpoint=checkpoint,  # type: ignore[arg-type]
            metadata=body["metadata"],
            parent_config={"configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                                            "checkpoint_id": parent}} if parent else None,
            pending_writes=[(w["task_id"], w["channel"],
                             self.serde.loads_typed((w["type"], base64.b64decode(w["data"]))))
                            for w in body["pending_writes"]],
        )

    @staticmethod
    def _stored(config: RunnableConfig, checkpoint: Checkpoint) -> RunnableConfig:
        conf = config["configurable"]
        return {"configurable": {"thread_id": conf["thread_id"],
                                 "checkpoint_ns": conf.get("checkpoint_ns", ""),
                                 "checkpoint_id": checkpoint["id"]}}

    def _listing(self, config: RunnableConfig | None, before: RunnableConfig | None,
                 filter: dict[str, Any] | None, limit: int | None) -> _Listing:
        if config is None or "thread_id" not in config.get("configurable", {}):
            raise ValueError("AgentStateSaver.list needs a config with a thread_id")
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        return _Listing(thread_id=thread_id, name=encode_id(thread_id), config=config,
                        filter=filter, left=limit, only=bool(conf.get("checkpoint_id")),
                        done=limit is not None and limit <= 0,
                        params={"checkpoint_ns": conf.get("checkpoint_ns"),
                                "before": get_checkpoint_id(before) if before else None,
                                "metadata": filter or None})

    # --- operations: each written once, as steps that a blocking or an asyncio client runs
    # (`_run`, `_arun`; agentstate_client._core.operation for the client's own) ------------

    def _run(self, steps: Callable[Concatenate[_Api, P], Op[R]], *args: P.args,
             **kwargs: P.kwargs) -> R:
        client = self.client
        return client._drive(steps(client, *args, **kwargs))

    async def _arun(self, steps: Callable[Concatenate[_Api, P], Op[R]], *args: P.args,
                    **kwargs: P.kwargs) -> R:
        api = self._aclient()
        return await api._drive(steps(api, *args, **kwargs))

    def _get_tuple(self, api: _Api, config: RunnableConfig) -> Op[CheckpointTuple | None]:
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        name = encode_id(thread_id)
        checkpoint_id, ns = get_checkpoint_id(config), conf.get("checkpoint_ns", "")
        with self._lock:
            cold = name not in self._known
            # The newest checkpoint of a thread whose delta channels were asked for: their
            # history comes along, what LangGraph asks for next (one request, not two).
            delta = self._delta_channels.get(name, ()) if checkpoint_id is None else ()
        try:
            # A thread this saver has not written or read (a new process resuming it): the
            # items come with the checkpoint, one request; else their digests, and only the
            # items the cache lacks are fetched.
            body = yield from _Api.get_checkpoint.steps(
                api, name, checkpoint_id, checkpoint_ns=ns,
                items="data" if cold else "digests", delta_channels=delta,
                known_seeds=self._known_seeds(name, ns, delta))
        except NotFound:
            return None
        if body.get("delta_history") is not None:
            with self._lock:
                self._delta_ahead.setdefault(name, {})[ns] = (body["checkpoint_id"],
                                                             body["delta_history"])
        if cold:
            self._learn_lists(name, body)
        items = yield from self._fill(api, name, body["values"].values())
        return self._tuple(thread_id, body, items)

    def _learn_lists(self, name: str, body: dict[str, Any]) -> None:
        """What a read of a whole checkpoint says: the server holds its lists' items for the
        thread, and a list that extends one of them can be sent as what it gained (with
        that list's version as `base_version`), as after this saver's own write. Inline
        items become digests (the cache keeps them), as a read by digest would have it."""
        self._known_for(name)  # one of the threads it remembers, the oldest forgotten
        sent = _Sent()
        versions = body["checkpoint"].get("channel_versions", {})
        for channel, value in body["values"].items():
            if value.get("items") is None or channel not in versions:
                continue
            digests = self._by_digest(value)
            sent.items.extend(digests)
            sent.lists[(name, body["checkpoint_ns"], channel)] = (versions[channel], digests)
        self._remember(name, sent)

    def _by_digest(self, value: dict[str, Any]) -> list[str]:
        """A list value read with its items inline, as a read by digest has it: its items
        cached under their digests, which it names instead. The digests."""
        encoded = [(item["type"], base64.b64decode(item["data"])) for item in value["items"]]
        digests = [item_digest(type_, data) for type_, data in encoded]
        self._cache_items(zip(digests, encoded))
        value["digests"], value["items"] = digests, None
        return digests

    def _known_seeds(self, name: str, ns: str, channels: Sequence[str]) -> list[str]:
        with self._lock:
            return [self._seeds[key][0] for key in ((name, ns, channel) for channel in channels)
                    if key in self._seeds]

    def _held_seeds(self, name: str, ns: str, found: dict[str, dict[str, Any]]) -> list[str]:
        """Puts the seeds `found` names by digest only (`seed: None` with a `seed_digest`)
        in place from what this saver holds; the channels whose seed it no longer holds."""
        lost = []
        with self._lock:
            for channel, history in found.items():
                if history["seed"] is not None or history.get("seed_digest") is None:
                    continue
                held = self._seeds.get((name, ns, channel))
                if held is not None and held[0] == history["seed_digest"]:
                    history["seed"] = held[1]
                else:
                    lost.append(channel)
        return lost

    def _keep_seed(self, name: str, ns: str, channel: str, history: dict[str, Any]) -> None:
        if history["seed"] is None or history.get("seed_digest") is None:
            return
        with self._lock:
            _keep_newest(self._seeds, (name, ns, channel),
                         (history["seed_digest"], history["seed"]))

    def _list_page(self, api: _Api, listing: _Listing) -> Op[list[CheckpointTuple]]:
        """The next page of `listing` (marked done after the last one)."""
        if listing.only:  # one checkpoint, as the other savers do
            listing.done = True
            found = yield from self._get_tuple(api, listing.config)
            return [found] if _kept(found, listing.filter) else []
        try:
            page = yield from _Api.list_checkpoints.steps(
                api, listing.name, cursor=listing.cursor, limit=min(_PAGE, listing.left or _PAGE),
                items="digests", **listing.params)
        except NotFound:
            listing.done = True
            return []
        items = yield from self._fill(api, listing.name, (
            value for body in page["data"] for value in body["values"].values()))
        if listing.left is not None:
            listing.left -= len(page["data"])
        listing.cursor = page["next_cursor"]
        listing.done = not page["has_more"] or listing.left == 0
        return [self._tuple(listing.thread_id, body, items) for body in page["data"]]

    def _write(self, api: _Api, name: str,
               entries: Sequence[_Entry]) -> Op[list[BaseException | None]]:
        """Store the entries (checkpoints and pending writes of one thread) in one request;
        each one's outcome. If a batch of several is refused (or its answer lost), each is
        sent alone, so that one entry's refusal is its own (a repeat is harmless: a stored
        checkpoint sent again is a replay, a stored write is ignored)."""
        if len(entries) > 1:
            try:
                yield from _Api.write_checkpoints.steps(
                    api, name, checkpoints=[e.checkpoint for e in entries if e.checkpoint],
                    writes=[e.writes for e in entries if e.writes])
            except AgentStateError:
                pass
            else:
                for entry in entries:
                    self._remember(name, entry.sent)
                return [None] * len(entries)
        outcomes: list[BaseException | None] = []
        for entry in entries:
            try:
                yield from self._write_one(api, name, entry)
            except AgentStateError as exc:
                outcomes.append(exc)
            else:
                outcomes.append(None)
        return outcomes

    def _write_one(self, api: _Api, name: str, entry: _Entry) -> Op[None]:
        try:
            yield from _Api.write_checkpoints.steps(
                api, name, checkpoints=[entry.checkpoint] if entry.checkpoint else [],
                writes=[entry.writes] if entry.writes else [])
        except CheckpointItemsMissing:  # pruned or deleted meanwhile: send everything
            if entry.resend is None:
                raise
            self._forget(name)
            entry.checkpoint, entry.sent = entry.resend()
            yield from _Api.write_checkpoints.steps(api, name, checkpoints=[entry.checkpoint])
        self._remember(name, entry.sent)

    def _store(self, api: _Api, name: str, entry: _Entry) -> Op[None]:
        """One entry alone; raises what refused it."""
        outcome, = yield from self._write(api, name, [entry])
        if outcome is not None:
            raise outcome

    def _drop_ahead(self, name: str) -> None:
        """A write to the thread: a delta history read ahead of it may be stale now."""
        with self._lock:
            self._delta_ahead.pop(name, None)

    def _checkpoint_entry(self, name: str, config: RunnableConfig, checkpoint: Checkpoint,
                          metadata: CheckpointMetadata, new_versions: ChannelVersions) -> _Entry:
        self._drop_ahead(name)
        body, sent = self._put_body(config, checkpoint, metadata, new_versions,
                                    self._known_for(name))
        return _Entry(checkpoint=body, sent=sent, resend=lambda: self._put_body(
            config, checkpoint, metadata, new_versions, set()))

    def _writes_entry(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                      task_id: str, task_path: str) -> _Entry:
        encoded = []
        for index, (channel, value) in enumerate(writes):
            type_, data = self.serde.dumps_typed(value)
            encoded.append({"idx": WRITES_IDX_MAP.get(channel, index), "channel": channel,
                            "type": type_, "data": _b64(data)})
        conf = config["configurable"]
        self._drop_ahead(encode_id(str(conf["thread_id"])))
        return _Entry(writes={"checkpoint_id": conf["checkpoint_id"],
                              "checkpoint_ns": conf.get("checkpoint_ns", ""),
                              "task_id": task_id, "task_path": task_path, "writes": encoded})

    def _delete_thread(self, api: _Api, thread_id: str) -> Op[None]:
        name = encode_id(str(thread_id))
        self._forget(name)
        try:
            yield from _Api.delete_checkpoints.steps(api, name)
        except NotFound:
            pass

    def _delete_for_runs(self, api: _Api, run_ids: Sequence[str]) -> Op[None]:
        if run_ids:
            yield from _Api.delete_checkpoint_runs.steps(api, [str(run_id) for run_id in run_ids])

    def _copy_thread(self, api: _Api, source_thread_id: str, target_thread_id: str) -> Op[None]:
        try:
            yield from _Api.copy_checkpoints.steps(api, encode_id(str(source_thread_id)),
                                                   encode_id(str(target_thread_id)))
        except NotFound:
            pass

    def _prune(self, api: _Api, thread_ids: Sequence[str], strategy: str) -> Op[None]:
        keep = _keep(strategy)
        for thread_id in thread_ids:
            try:
                yield from _Api.prune_checkpoints.steps(api, encode_id(str(thread_id)), keep)
            except NotFound:
                pass

    def _delta_history(self, api: _Api, config: RunnableConfig,
                       channels: Sequence[str]) -> Op[dict[str, DeltaChannelHistory]]:
        """One request per 32 channels (the server walks the parent chain in one statement)."""
        conf = config["configurable"]
        name = encode_id(str(conf["thread_id"]))
        ns, checkpoint_id = conf.get("checkpoint_ns", ""), get_checkpoint_id(config)
        wanted = list(dict.fromkeys(channels))
        with self._lock:
            # The first history this saver reads of the thread (a new process resuming it):
            # the seeds' items come inline, one request; later their digests, and only the
            # items the cache lacks are fetched.
            first = name not in self._delta_channels
            ahead = self._delta_ahead.get(name, {}).pop(ns, None)
            if len(wanted) <= _CHANNELS:
                self._delta_channels[name] = tuple(wanted)
                self._delta_channels.move_to_end(name)
                while len(self._delta_channels) > _KNOWN_THREADS:
                    self._delta_ahead.pop(self._delta_channels.popitem(last=False)[0], None)
        found: dict[str, dict[str, Any]] = {}
        if (ahead is not None and checkpoint_id is not None and ahead[0] == checkpoint_id
                and all(channel in ahead[1] for channel in wanted)):
            # Read with the checkpoint, in its transaction: no request of its own.
            found, wanted = {channel: ahead[1][channel] for channel in wanted}, []
        for known in (True, False):
            for start in range(0, len(wanted), _CHANNELS):
                part = wanted[start:start + _CHANNELS]
                try:
                    body = yield from _Api.get_delta_history.steps(
                        api, name, part, checkpoint_id, checkpoint_ns=ns,
                        items="data" if first else "digests",
                        known_seeds=self._known_seeds(name, ns, part) if known else ())
                except NotFound:  # as BaseCheckpointSaver's walk: nothing to replay
                    return {channel: {"writes": []} for channel in channels}
                found.update(body["channels"])
                checkpoint_id = body["checkpoint_id"]  # the next reads walk from it too
            # A seed named by its digest only that this saver no longer holds (another call
            # dropped it meanwhile) is asked for again, in full.
            wanted = self._held_seeds(name, ns, found)
        for channel, history in found.items():
            if history["seed"] is not None and history["seed"].get("items") is not None:
                self._by_digest(history["seed"])  # the next read names them by digest
            self._keep_seed(name, ns, channel, history)
        items = yield from self._fill(api, name, (
            h["seed"] for h in found.values() if h["seed"] is not None))
        out: dict[str, DeltaChannelHistory] = {}
        for channel in channels:
            history = found[channel]
            entry: DeltaChannelHistory = {"writes": [
                (w["task_id"], channel,
                 self.serde.loads_typed((w["type"], base64.b64decode(w["data"]))))
                for w in history["writes"]]}
            if history["seed"] is not None:
                entry["seed"] = self._decode(history["seed"], items)
            out[channel] = entry
        return out

    # --- blocking ------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._run(self._get_tuple, config)

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None,
             limit: int | None = None) -> Iterator[CheckpointTuple]:
        listing = self._listing(config, before, filter, limit)
        while not listing.done:
            yield from self._run(self._list_page, listing)

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        name = encode_id(str(config["configurable"]["thread_id"]))
        self._run(self._store, name,
                  self._checkpoint_entry(name, config, checkpoint, metadata, new_versions))
        return self._stored(config, checkpoint)

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        self._run(self._store, encode_id(str(config["configurable"]["thread_id"])),
                  self._writes_entry(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._run(self._delete_thread, thread_id)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._run(self._delete_for_runs, run_ids)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._run(self._copy_thread, source_thread_id, target_thread_id)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._run(self._prune, thread_ids, strategy)

    def get_delta_channel_history(self, *, config: RunnableConfig,
                                  channels: Sequence[str]) -> Mapping[str, DeltaChannelHistory]:
        """Per channel, the writes since the nearest stored value (`seed`) on the parent
        chain, and that value: one request, the server walks the chain (API.md 7a)."""
        return self._run(self._delta_history, config, channels) if channels else {}

    # --- asyncio -------------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._arun(self._get_tuple, config)

    async def alist(self, config: RunnableConfig | None, *,
                    filter: dict[str, Any] | None = None, before: RunnableConfig | None = None,
                    limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        listing = self._listing(config, before, filter, limit)
        while not listing.done:
            for found in await self._arun(self._list_page, listing):
                yield found

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata,
                   new_versions: ChannelVersions) -> RunnableConfig:
        name = encode_id(str(config["configurable"]["thread_id"]))
        await self._pipe().submit(
            name, self._checkpoint_entry(name, config, checkpoint, metadata, new_versions))
        return self._stored(config, checkpoint)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        await self._pipe().submit(encode_id(str(config["configurable"]["thread_id"])),
                                  self._writes_entry(config, writes, task_id, task_path))

    async def adelete_thread(self, thread_id: str) -> None:
        await self._arun(self._delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._arun(self._delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._arun(self._copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._arun(self._prune, thread_ids, strategy)

    async def aget_delta_channel_history(
            self, *, config: RunnableConfig,
            channels: Sequence[str]) -> Mapping[str, DeltaChannelHistory]:
        """As `get_delta_channel_history`."""
        return await self._arun(self._delta_history, config, channels) if channels else {}


@dataclass
class _Listing:
    """Where a `list` is: its thread, filters, what is left to yield, the next cursor."""

    thread_id: str
    name: str
    config: RunnableConfig
    filter: dict[str, Any] | None
    left: int | None
    only: bool
    params: dict[str, Any]
    cursor: str | None = None
    done: bool = False


@dataclass
class _Entry:
    """One write a saver call asked for: a checkpoint body (with what it sent and how to
    build it again sending every item) or a task's pending writes."""

    checkpoint: dict[str, Any] | None = None
    sent: _Sent | None = None
    resend: Callable[[], tuple[dict[str, Any], _Sent]] | None = None
    writes: dict[str, Any] | None = None
    done: asyncio.Future[None] | None = None


class _Pipe:
    """Group commit for one event loop: a saver call's write is queued for its thread, and
    whatever the thread's queue holds when its previous request is answered goes as one
    request (`POST .../checkpoints/batch`). A call returns once its own write is stored
    (or raises what refused it), as it would alone: nothing is acknowledged before it is
    committed. LangGraph issues a step's pending writes and the next checkpoint in the
    background, so they meet in the queue."""

    def __init__(self, saver: AgentStateSaver, api: AsyncAgentStateClient) -> None:
        self.saver = saver
        self.api = api
        self.queued: dict[str, list[_Entry]] = {}
        self.flushing: set[str] = set()
        self.tasks: set[asyncio.Task[None]] = set()

    async def submit(self, name: str, entry: _Entry) -> None:
        entry.done = asyncio.get_running_loop().create_future()
        self.queued.setdefault(name, []).append(entry)
        if name not in self.flushing:
            self.flushing.add(name)
            task = asyncio.create_task(self._flush(name))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        await entry.done

    async def _flush(self, name: str) -> None:
        batch: list[_Entry] = []
        try:
            while batch := self.queued.pop(name, []):
                for start in range(0, len(batch), _BATCH):
                    part = batch[start:start + _BATCH]
                    outcomes = await self.api._drive(self.saver._write(self.api, name, part))
                    for entry, outcome in zip(part, outcomes, strict=True):
                        _settle(entry, outcome)
                # The callers just answered run first: LangGraph issues the next checkpoint
                # when the previous one returns (two tasks later), and it should join what
                # else is queued instead of following it alone.
                for _ in range(_SETTLE_TICKS):
                    await asyncio.sleep(0)
        except BaseException as exc:  # not a refusal (those are outcomes): a bug, or the
            for entry in batch + self.queued.pop(name, []):  # loop is closing
                _settle(entry, exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self.flushing.discard(name)


def _keep_newest(cache: OrderedDict[Any, Any], key: Any, value: Any) -> None:
    """Put `value` under `key` as the newest entry; the oldest go past `_KEYS` entries."""
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > _KEYS:
        cache.popitem(last=False)


def _settle(entry: _Entry, outcome: BaseException | None) -> None:
    if entry.done is None or entry.done.done():
        return
    if outcome is None:
        entry.done.set_result(None)
    else:
        entry.done.set_exception(outcome)


@dataclass
class _Sent:
    """What one checkpoint sent: item digests, and the lists by (thread, namespace, channel)."""

    items: list[str] = field(default_factory=list)
    lists: dict[tuple[str, str, str], tuple[Any, list[str]]] = field(default_factory=dict)


def _keep(strategy: str) -> int:
    if strategy == "keep_latest":
        return 1
    if strategy == "delete":
        return 0
    raise ValueError(f"unknown prune strategy {strategy!r}: 'keep_latest' or 'delete'")


def thread_id_of(name: str) -> str:
    """The LangGraph thread id an agentstate thread id stands for."""
    return decode_id(name)
