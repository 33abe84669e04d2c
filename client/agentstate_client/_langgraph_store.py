"""LangGraph's `BaseStore` over agentstate's store (API.md 7b): `AgentStateStore`.

    from agentstate_client.langgraph import AgentStateStore

    store = AgentStateStore(base_url="http://127.0.0.1:8080", api_key="agst_...",
                            index={"dims": 384, "embed": embed, "fields": ["text"]},
                            ttl={"default_ttl": 60 * 24 * 30, "refresh_on_read": True})
    graph = builder.compile(store=store)  # nodes reach it as `runtime.store`

- `batch`/`abatch` take all four operation kinds (`GetOp`, `SearchOp`, `PutOp`,
  `ListNamespacesOp`) and send them as ONE request: a single operation to its own endpoint,
  several as one `POST /v1/batch` (in one transaction). As in LangGraph's own stores, the
  reads of a batch see the store as it was before the batch's writes, and of several puts to
  one item the last wins. Batches of more than 100 operations are sent 100 at a time.
- `index={"dims", "embed", "fields"}`: the embed function runs here, in the client, as in
  `PostgresStore`; the vectors of each put travel with it, in a vector index named after
  the dimension (`langgraph-384`, or `index_name=`), so a store with another model writes
  beside it instead of breaking it. A `query` is then a vector search (`hybrid=True` fuses it
  with the server's full-text ranking). Without `index`, a `query` is a full-text search on
  the server (`text_query=False` ignores it, as `InMemoryStore` does).
- `ttl={"default_ttl", "refresh_on_read"}` (minutes, as LangGraph counts them): the server
  expires items and never returns an expired one, swept or not; reads restart the time to
  live as `refresh_on_read` (or each call's `refresh_ttl`) says.
- Namespaces and keys of any string are addressed as `agentstate_client.ids.encode_id`
  writes them. Filters compare by JSON type: numbers numerically (LangGraph's PostgresStore
  compares them as text).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, Literal

try:
    from langgraph.store.base import (
        BaseStore,
        GetOp,
        IndexConfig,
        Item,
        ListNamespacesOp,
        Op,
        PutOp,
        Result,
        SearchItem,
        SearchOp,
        TTLConfig,
    )
    from langgraph.store.base.embed import ensure_embeddings, get_text_at_path, tokenize_path
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("agentstate_client.langgraph needs langgraph: "
                      "pip install 'agentstate-client[langgraph]'") from exc

from agentstate_client._adapters import ClientPair
from agentstate_client._api import (
    OVERWRITE,
    store_item_body,
    store_namespaces_body,
    store_search_body,
)
from agentstate_client._async import AsyncAgentStateClient
from agentstate_client._sync import AgentStateClient
from agentstate_client.errors import NotFound, RevisionMismatch
from agentstate_client.models import StoreItem

__all__ = ["AgentStateStore"]

MAX_BATCH = 100  # operations of one POST /v1/batch
# The field paths the server reads for full-text search; others ({a,b}, a.*) fall back to
# the whole value there (their vectors are computed here, in LangGraph's own syntax).
_SERVER_PATH = re.compile(r"^(\$|[^.\[\]{}*]+(\.[^.\[\]{}*]+|\[(\*|-?\d+)\])*)$")
Vectors = dict[str, dict[str, list[float]]]


def _item(stored: StoreItem) -> Item:
    return Item(value=stored.value, key=stored.key, namespace=stored.namespace,
                created_at=stored.created_at, updated_at=stored.updated_at)


def _searched(stored: StoreItem) -> SearchItem:
    return SearchItem(namespace=stored.namespace, key=stored.key, value=stored.value,
                      created_at=stored.created_at, updated_at=stored.updated_at,
                      score=stored.score)


def _conditions(op: ListNamespacesOp) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for condition in op.match_conditions or ():
        if condition.match_type in found:
            raise ValueError(f"one {condition.match_type} condition per listing")
        found[condition.match_type] = list(condition.path)
    return found


class AgentStateStore(ClientPair, BaseStore):
    """LangGraph's `BaseStore` (blocking and asyncio) over agentstate's store."""

    supports_ttl = True

    def __init__(self, base_url: str | None = None, *, api_key: str | None = None,
                 client: AgentStateClient | None = None,
                 async_client: AsyncAgentStateClient | None = None,
                 index: IndexConfig | None = None, ttl: TTLConfig | None = None,
                 index_name: str | None = None,
                 metric: Literal["cosine", "inner_product", "l2"] = "cosine",
                 hybrid: bool = False, text_query: bool = True, timeout: float = 30.0) -> None:
        self._use_clients(base_url, api_key, timeout, client, async_client)
        self.ttl_config = ttl
        self.index_config = index
        self.embeddings = ensure_embeddings(index.get("embed")) if index else None
        self._fields: list[str] = list((index or {}).get("fields") or ["$"])
        self._index_name = index_name or (f"langgraph-{index['dims']}" if index else None)
        self._metric, self._hybrid, self._text_query = metric, hybrid, text_query

    def _texts(self, ops: Sequence[PutOp]) -> list[tuple[int, str, str]]:
        """(op position, field name, text) of every text to embed, LangGraph's way: a path
        that yields several texts names them `path.0`, `path.1`, ..."""
        if self.embeddings is None:
            return []
        out: list[tuple[int, str, str]] = []
        for position, op in enumerate(ops):
            if op.value is None or op.index is False:
                continue
            for path in (self._fields if op.index is None else op.index):
                texts = get_text_at_path(op.value, path if path == "$" else tokenize_path(path))
                if len(texts) == 1:
                    out.append((position, path, texts[0]))
                else:
                    out.extend((position, f"{path}.{i}", text) for i, text in enumerate(texts))
        return out

    def _put_body(self, op: PutOp, vectors: Vectors | None) -> dict[str, Any]:
        assert op.value is not None
        lexical: list[str] | Literal[False]
        if op.index is False:
            lexical = False
        else:
            fields = self._fields if op.index is None else op.index
            lexical = list(fields) if all(map(_SERVER_PATH.match, fields)) else ["$"]
        ttl = None if op.ttl is None else float(op.ttl) * 60
        return store_item_body(dict(op.value), lexical, ttl, vectors)

    def _vectors(self, ops: Sequence[PutOp], texts: list[tuple[int, str, str]],
                 embedded: Sequence[Sequence[float]]) -> list[Vectors | None]:
        per_op: list[Vectors | None] = [None] * len(ops)
        assert self._index_name is not None or not texts
        for (position, field, _), vector in zip(texts, embedded, strict=True):
            fields = (per_op[position] or {}).get(self._index_name or "", {})
            fields[field] = [float(x) for x in vector]
            per_op[position] = {self._index_name or "": fields}
        return per_op

    # --- what a search sends ------------------------------------------------------------

    def _search_args(self, op: SearchOp, vector: Sequence[float] | None) -> dict[str, Any]:
        """`search_store`'s arguments for the operation (`store_search_body`'s too)."""
        query = op.query if (vector is None and self._text_query) or (
            vector is not None and self._hybrid) else None
        return {"namespace_prefix": op.namespace_prefix, "filter": op.filter, "query": query,
                "vector": vector, "metric": self._metric, "limit": op.limit,
                "offset": op.offset, "refresh_ttl": bool(op.refresh_ttl),
                "vector_index": self._index_name if vector is not None else None}

    # --- one request per batch ----------------------------------------------------------

    @staticmethod
    def _order(ops: list[Op]) -> tuple[list[int], list[int]]:
        """The reads, then the writes (the last put of an item only), by position."""
        reads = [i for i, op in enumerate(ops) if not isinstance(op, PutOp)]
        last: dict[tuple[tuple[str, ...], str], int] = {}
        for i, op in enumerate(ops):
            if isinstance(op, PutOp):
                last.pop((op.namespace, op.key), None)
                last[(op.namespace, op.key)] = i
        return reads, list(last.values())

    def _batch_op(self, op: Op, vectors: Vectors | None,
                  query_vector: Sequence[float] | None) -> dict[str, Any]:
        if isinstance(op, GetOp):
            return {"op": "store.get", "namespace": list(op.namespace), "key": op.key,
                    "refresh_ttl": bool(op.refresh_ttl)}
        if isinstance(op, SearchOp):
            return {"op": "store.search",
                    "body": store_search_body(**self._search_args(op, query_vector))}
        if isinstance(op, ListNamespacesOp):
            return {"op": "store.list_namespaces",
                    "body": store_namespaces_body(**self._namespaces_args(op))}
        assert isinstance(op, PutOp)
        if op.value is None:
            return {"op": "store.delete", "namespace": list(op.namespace), "key": op.key,
                    "if_match": "*", "missing_ok": True}
        return {"op": "store.put", "namespace": list(op.namespace), "key": op.key,
                "if_none_match": OVERWRITE["If-None-Match"], "body": self._put_body(op, vectors)}

    @staticmethod
    def _namespaces_args(op: ListNamespacesOp) -> dict[str, Any]:
        conditions = _conditions(op)
        return {"prefix": conditions.get("prefix"), "suffix": conditions.get("suffix"),
                "max_depth": op.max_depth, "limit": op.limit, "offset": op.offset}

    @staticmethod
    def _batch_result(op: Op, result: dict[str, Any]) -> Result:
        if isinstance(op, GetOp):
            return _item(StoreItem.from_json(result["body"])) if result["status"] == 200 \
                else None
        if isinstance(op, SearchOp):
            return [_searched(StoreItem.from_json(found)) for found in result["body"]["data"]]
        if isinstance(op, ListNamespacesOp):
            return [tuple(namespace) for namespace in result["body"]["data"]]
        return None

    def _prepare(self, ops: list[Op]) -> tuple[list[int], list[PutOp], list[tuple[int, str, str]],
                                               list[tuple[int, str]]]:
        """What to send in order, the puts and their texts to embed, the queries to embed."""
        reads, writes = self._order(ops)
        puts = [op for i in writes if isinstance(op := ops[i], PutOp)]
        queries = [(i, op.query) for i in reads if isinstance(op := ops[i], SearchOp)
                   and op.query and self.embeddings is not None]
        return reads + writes, puts, self._texts(puts), queries

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        order, puts, texts, queries = self._prepare(ops)
        embedded = self.embeddings.embed_documents([t for _, _, t in texts]) \
            if texts and self.embeddings else []
        query_vectors = {i: self.embeddings.embed_query(q) for i, q in queries} \
            if self.embeddings else {}
        vectors = dict(zip((id(op) for op in puts), self._vectors(puts, texts, embedded),
                           strict=True))
        results: list[Result] = [None] * len(ops)
        if len(order) == 1:
            i = order[0]
            results[i] = self._single(ops[i], vectors.get(id(ops[i])), query_vectors.get(i))
            return results
        for start in range(0, len(order), MAX_BATCH):
            chunk = order[start:start + MAX_BATCH]
            answers = self.client.batch(
                [self._batch_op(ops[i], vectors.get(id(ops[i])), query_vectors.get(i))
                 for i in chunk], keyed=False)
            for i, answer in zip(chunk, answers, strict=True):
                results[i] = self._batch_result(ops[i], answer)
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        order, puts, texts, queries = self._prepare(ops)
        embedded = await self.embeddings.aembed_documents([t for _, _, t in texts]) \
            if texts and self.embeddings else []
        query_vectors = {}
        if self.embeddings is not None:
            for i, query in queries:
                query_vectors[i] = await self.embeddings.aembed_query(query)
        vectors = dict(zip((id(op) for op in puts), self._vectors(puts, texts, embedded),
                           strict=True))
        results: list[Result] = [None] * len(ops)
        client = self._aclient()
        if len(order) == 1:
            i = order[0]
            results[i] = await self._asingle(client, ops[i], vectors.get(id(ops[i])),
                                             query_vectors.get(i))
            return results
        for start in range(0, len(order), MAX_BATCH):
            chunk = order[start:start + MAX_BATCH]
            answers = await client.batch(
                [self._batch_op(ops[i], vectors.get(id(ops[i])), query_vectors.get(i))
                 for i in chunk], keyed=False)
            for i, answer in zip(chunk, answers, strict=True):
                results[i] = self._batch_result(ops[i], answer)
        return results

    # --- a single operation: its own endpoint -------------------------------------------

    def _single(self, op: Op, vectors: Vectors | None,
                query_vector: Sequence[float] | None) -> Result:
        client = self.client
        if isinstance(op, GetOp):
            try:
                found = client.get_store_item(op.namespace, op.key,
                                              refresh_ttl=bool(op.refresh_ttl))
            except NotFound:
                return None
            return _item(found)
        if isinstance(op, SearchOp):
            page = client.search_store(**self._search_args(op, query_vector))
            return [_searched(found) for found in page.data]
        if isinstance(op, ListNamespacesOp):
            return list(client.list_store_namespaces(**self._namespaces_args(op)))
        assert isinstance(op, PutOp)
        if op.value is None:
            try:
                client.delete_store_item(op.namespace, op.key, if_match="*")
            except (NotFound, RevisionMismatch):  # nothing there: a no-op, as in LangGraph
                pass
            return None
        body = self._put_body(op, vectors)
        client.put_store_item(op.namespace, op.key, body["value"], index=body.get("index"),
                              ttl_seconds=body.get("ttl_seconds"), vectors=body.get("vectors"),
                              overwrite=True)
        return None

    async def _asingle(self, client: AsyncAgentStateClient, op: Op, vectors: Vectors | None,
                       query_vector: Sequence[float] | None) -> Result:
        if isinstance(op, GetOp):
            try:
                found = await client.get_store_item(op.namespace, op.key,
                                                    refresh_ttl=bool(op.refresh_ttl))
            except NotFound:
                return None
            return _item(found)
        if isinstance(op, SearchOp):
            page = await client.search_store(**self._search_args(op, query_vector))
            return [_searched(found) for found in page.data]
        if isinstance(op, ListNamespacesOp):
            return list(await client.list_store_namespaces(**self._namespaces_args(op)))
        assert isinstance(op, PutOp)
        if op.value is None:
            try:
                await client.delete_store_item(op.namespace, op.key, if_match="*")
            except (NotFound, RevisionMismatch):
                pass
            return None
        body = self._put_body(op, vectors)
        await client.put_store_item(op.namespace, op.key, body["value"],
                                    index=body.get("index"), ttl_seconds=body.get("ttl_seconds"),
                                    vectors=body.get("vectors"), overwrite=True)
        return None
