"""A LangGraph checkpointer backed by agentstate: `AgentStateSaver`.

    from agentstate_client.langgraph import AgentStateSaver

    saver = AgentStateSaver(base_url="http://127.0.0.1:8080", api_key="agst_...")
    graph = builder.compile(checkpointer=saver)
    graph.invoke({"messages": [...]}, {"configurable": {"thread_id": "user/42/chat"}})

It implements langgraph-checkpoint's `BaseCheckpointSaver` in full, blocking and asyncio
(`put`, `put_writes`, `get_tuple`, `list`, `delete_thread`, `delete_for_runs`, `copy_thread`,
`prune` and their `a...` forms), over the checkpoint endpoints of the HTTP API (API.md 7a).
Install with `pip install 'agentstate-client[langgraph]'`.

- LangGraph thread ids of any string map onto agentstate thread ids with
  `agentstate_client.ids.encode_id` (`user/42/chat` is the thread `user@2F42@2Fchat`).
- Values are serialized by the saver's `serde` (LangGraph's `JsonPlusSerializer` by
  default) and travel as `{"type": tag, "data": base64}`. Only the channels whose version
  changed are sent with a checkpoint; the server keeps one value per channel version.
- A channel whose value is a plain `list` (a `MessagesState`'s `messages`) is sent item by
  item: the server stores each item once per thread, and the saver sends items it has
  already stored by their digest only. A 400-turn chat then stores each message once instead
  of once per version of the list.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import secrets
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        get_checkpoint_id,
        get_serializable_checkpoint_metadata,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("agentstate_client.langgraph needs langgraph-checkpoint: "
                      "pip install 'agentstate-client[langgraph]'") from exc

from agentstate_client._async import AsyncAgentStateClient
from agentstate_client._sync import AgentStateClient
from agentstate_client.errors import CheckpointItemsMissing, NotFound
from agentstate_client.ids import decode_id, encode_id

from agentstate_client._langgraph_store import AgentStateStore  # noqa: E402 - re-exported

__all__ = ["AgentStateSaver", "AgentStateStore"]

LIST_TYPE = "agentstate.list"  # the type tag of a value sent as its items
EMPTY_TYPE = "empty"  # a channel in new_versions that holds no value any more
_PAGE = 100  # the server's largest page
_KNOWN_THREADS = 256  # threads whose stored item digests the saver remembers
_FETCH = 5000  # items asked for in one request
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


class AgentStateSaver(BaseCheckpointSaver[str]):
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
        self._base_url, self._api_key, self._timeout = base_url, api_key, timeout
        self._client = client or AgentStateClient(base_url, api_key=api_key, timeout=timeout)
        self._async_client = async_client
        self._async_loop: asyncio.AbstractEventLoop | None = None
        self._owns_async = async_client is None
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
        self._lock = threading.Lock()

    @property
    def client(self) -> AgentStateClient:
        return self._client

    def _aclient(self) -> AsyncAgentStateClient:
        # An httpx.AsyncClient's connections belong to the event loop that opened them: a
        # saver used from another loop (a second asyncio.run) gets a client of its own.
        loop = asyncio.get_running_loop()
        if self._async_client is None or (self._owns_async and loop is not self._async_loop):
            self._async_client = AsyncAgentStateClient(self._base_url, api_key=self._api_key,
                                                       timeout=self._timeout)
            self._async_loop = loop
        return self._async_client

    def close(self) -> None:
        self._client.close()

    async def aclose(self) -> None:
        if self._owns_async and self._async_client is not None:
            await self._async_client.aclose()
            self._async_client = None

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
            for key in [key for key in self._lists if key[0] == thread]:
                del self._lists[key]

    def _value(self, where: tuple[str, str, str], version: Any, value: Any, known: set[str],
               sent: _Sent) -> dict[str, Any]:
        channel = where[2]
        if self._list_items and type(value) is list:
            encoded = [self.serde.dumps_typed(element) for element in value]
            digests = [item_digest(type_, data) for type_, data in encoded]
            self._cache_items(zip(digests, encoded))
            sent.items.extend(digests)
            sent.lists[where] = (version, digests)
            value_: dict[str, Any] = {"channel": channel, "version": version,
                                      "type": LIST_TYPE}
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

    def _remember(self, thread: str, sent: _Sent) -> None:
        with self._lock:
            self._known.setdefault(thread, set()).update(sent.items)
            for where, last in sent.lists.items():
                self._lists[where] = last
                self._lists.move_to_end(where)
            while len(self._lists) > 4 * _KNOWN_THREADS:
                self._lists.popitem(last=False)

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

    def _needed(self, bodies: Sequence[dict[str, Any]]) -> tuple[Items, list[str]]:
        """The items the bodies name that the cache holds, and the digests it lacks."""
        held: Items = {}
        missing: set[str] = set()
        with self._lock:
            for body in bodies:
                for value in body["values"].values():
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

    def _fill(self, name: str, bodies: Sequence[dict[str, Any]]) -> Items:
        held, missing = self._needed(bodies)
        for start in range(0, len(missing), _FETCH):
            self._keep_fetched(held, self._client.get_checkpoint_items(
                name, missing[start:start + _FETCH]))
        return held

    async def _afill(self, name: str, bodies: Sequence[dict[str, Any]]) -> Items:
        held, missing = self._needed(bodies)
        for start in range(0, len(missing), _FETCH):
            self._keep_fetched(held, await self._aclient().get_checkpoint_items(
                name, missing[start:start + _FETCH]))
        return held

    def _decode(self, value: dict[str, Any], items: Items) -> Any:
        if value.get("digests") is not None:
            return [self.serde.loads_typed(items[digest]) for digest in value["digests"]]
        if value.get("items") is not None:
            return [self.serde.loads_typed((item["type"], base64.b64decode(item["data"])))
                    for item in value["items"]]
        return self.serde.loads_typed((value["type"], base64.b64decode(value["data"] or "")))

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

    def _writes_body(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                     task_id: str, task_path: str) -> dict[str, Any]:
        encoded = []
        for index, (channel, value) in enumerate(writes):
            type_, data = self.serde.dumps_typed(value)
            encoded.append({"idx": WRITES_IDX_MAP.get(channel, index), "channel": channel,
                            "type": type_, "data": _b64(data)})
        return {"checkpoint_ns": config["configurable"].get("checkpoint_ns", ""),
                "task_id": task_id, "task_path": task_path, "writes": encoded}

    @staticmethod
    def _stored(config: RunnableConfig, checkpoint: Checkpoint) -> RunnableConfig:
        conf = config["configurable"]
        return {"configurable": {"thread_id": conf["thread_id"],
                                 "checkpoint_ns": conf.get("checkpoint_ns", ""),
                                 "checkpoint_id": checkpoint["id"]}}

    @staticmethod
    def _list_args(config: RunnableConfig | None, before: RunnableConfig | None,
                   filter: dict[str, Any] | None) -> tuple[str, str, dict[str, Any]]:
        if config is None or "thread_id" not in config.get("configurable", {}):
            raise ValueError("AgentStateSaver.list needs a config with a thread_id")
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        params: dict[str, Any] = {"checkpoint_ns": conf.get("checkpoint_ns"),
                                  "before": get_checkpoint_id(before) if before else None,
                                  "metadata": filter or None}
        if conf.get("checkpoint_id"):  # one checkpoint, as the other savers do
            params["only"] = conf["checkpoint_id"]
        return thread_id, encode_id(thread_id), params

    # --- blocking ------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        name = encode_id(thread_id)
        try:
            body = self._client.get_checkpoint(name, get_checkpoint_id(config),
                                               checkpoint_ns=conf.get("checkpoint_ns", ""),
                                               items="digests")
        except NotFound:
            return None
        return self._tuple(thread_id, body, self._fill(name, [body]))

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None,
             limit: int | None = None) -> Iterator[CheckpointTuple]:
        thread_id, name, params = self._list_args(config, before, filter)
        only = params.pop("only", None)
        if only is not None:
            found = self.get_tuple(config) if config else None
            if _kept(found, filter):
                yield found
            return
        left = limit
        cursor: str | None = None
        while left is None or left > 0:
            try:
                page = self._client.list_checkpoints(
                    name, cursor=cursor, limit=min(_PAGE, left or _PAGE), items="digests",
                    **params)
            except NotFound:
                return
            items = self._fill(name, page["data"])
            for body in page["data"]:
                yield self._tuple(thread_id, body, items)
            left = None if left is None else left - len(page["data"])
            if not page["has_more"]:
                return
            cursor = page["next_cursor"]

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        name = encode_id(str(config["configurable"]["thread_id"]))
        known = self._known_for(name)
        body, sent = self._put_body(config, checkpoint, metadata, new_versions, known)
        try:
            self._client.create_checkpoint(name, body)
        except CheckpointItemsMissing:  # pruned or deleted meanwhile: send everything
            self._forget(name)
            body, sent = self._put_body(config, checkpoint, metadata, new_versions, set())
            self._client.create_checkpoint(name, body)
        self._remember(name, sent)
        return self._stored(config, checkpoint)

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        conf = config["configurable"]
        self._client.put_checkpoint_writes(encode_id(str(conf["thread_id"])),
                                           conf["checkpoint_id"],
                                           self._writes_body(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        name = encode_id(str(thread_id))
        self._forget(name)
        try:
            self._client.delete_checkpoints(name)
        except NotFound:
            pass

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        if run_ids:
            self._client.delete_checkpoint_runs([str(run_id) for run_id in run_ids])

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        try:
            self._client.copy_checkpoints(encode_id(str(source_thread_id)),
                                          encode_id(str(target_thread_id)))
        except NotFound:
            pass

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        keep = _keep(strategy)
        for thread_id in thread_ids:
            try:
                self._client.prune_checkpoints(encode_id(str(thread_id)), keep)
            except NotFound:
                pass

    # --- asyncio -------------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        name = encode_id(thread_id)
        try:
            body = await self._aclient().get_checkpoint(
                name, get_checkpoint_id(config), checkpoint_ns=conf.get("checkpoint_ns", ""),
                items="digests")
        except NotFound:
            return None
        return self._tuple(thread_id, body, await self._afill(name, [body]))

    async def alist(self, config: RunnableConfig | None, *,
                    filter: dict[str, Any] | None = None, before: RunnableConfig | None = None,
                    limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        thread_id, name, params = self._list_args(config, before, filter)
        only = params.pop("only", None)
        if only is not None:
            found = await self.aget_tuple(config) if config else None
            if _kept(found, filter):
                yield found
            return
        left = limit
        cursor: str | None = None
        while left is None or left > 0:
            try:
                page = await self._aclient().list_checkpoints(
                    name, cursor=cursor, limit=min(_PAGE, left or _PAGE), items="digests",
                    **params)
            except NotFound:
                return
            items = await self._afill(name, page["data"])
            for body in page["data"]:
                yield self._tuple(thread_id, body, items)
            left = None if left is None else left - len(page["data"])
            if not page["has_more"]:
                return
            cursor = page["next_cursor"]

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata,
                   new_versions: ChannelVersions) -> RunnableConfig:
        name = encode_id(str(config["configurable"]["thread_id"]))
        known = self._known_for(name)
        body, sent = self._put_body(config, checkpoint, metadata, new_versions, known)
        try:
            await self._aclient().create_checkpoint(name, body)
        except CheckpointItemsMissing:  # pruned or deleted meanwhile: send everything
            self._forget(name)
            body, sent = self._put_body(config, checkpoint, metadata, new_versions, set())
            await self._aclient().create_checkpoint(name, body)
        self._remember(name, sent)
        return self._stored(config, checkpoint)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        conf = config["configurable"]
        await self._aclient().put_checkpoint_writes(
            encode_id(str(conf["thread_id"])), conf["checkpoint_id"],
            self._writes_body(config, writes, task_id, task_path))

    async def adelete_thread(self, thread_id: str) -> None:
        name = encode_id(str(thread_id))
        self._forget(name)
        try:
            await self._aclient().delete_checkpoints(name)
        except NotFound:
            pass

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        if run_ids:
            await self._aclient().delete_checkpoint_runs([str(run_id) for run_id in run_ids])

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        try:
            await self._aclient().copy_checkpoints(encode_id(str(source_thread_id)),
                                                   encode_id(str(target_thread_id)))
        except NotFound:
            pass

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        keep = _keep(strategy)
        for thread_id in thread_ids:
            try:
                await self._aclient().prune_checkpoints(encode_id(str(thread_id)), keep)
            except NotFound:
                pass


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
