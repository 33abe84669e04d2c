"""`agentstate_client.langgraph.AgentStateStore`, LangGraph's `BaseStore`, judged by
LangGraph's own `InMemoryStore` (differential, seeded random sequences), inside a real graph,
and against `PostgresStore` where the answers rightly differ (numeric filters). The async
path runs on the in-process app of each backend (the pgvector one too: tests/conftest.py);
the blocking one on a real server."""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
from datetime import UTC, datetime
from typing import Any

import pytest
from agentstate_client import AsyncAgentStateClient
from agentstate_client.langgraph import AgentStateStore
from langgraph.store.base import (
    GetOp,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchOp,
)
from langgraph.store.memory import InMemoryStore

from tests.support import ServerProcess

pytestmark = [pytest.mark.anyio, pytest.mark.pgvector]
DIMS = 16
WORDS = ["tea", "coffee", "paris", "rome", "cats", "dogs", "rain", "sun", "jazz", "chess"]
LABELS = ["users", "u/1", "ü 2", "notes", "x:y", "@home"]
KEYS = ["a", "b", "k/1", "key two", "é"]


def embed(texts: list[str]) -> list[list[float]]:
    """A deterministic fake embedding: each word adds to the dimensions its hash picks."""
    out = []
    for text in texts:
        vector = [0.0] * DIMS
        for word in text.lower().split():
            digest = hashlib.sha256(word.encode()).digest()
            vector[digest[0] % DIMS] += 1.0
            vector[digest[1] % DIMS] += 0.5
        out.append(vector)
    return out


def value(rng: random.Random) -> dict[str, Any]:
    return {"n": rng.randint(0, 20), "tag": rng.choice(["x", "y", "z"]),
            "text": " ".join(rng.sample(WORDS, 3)), "nested": {"m": rng.randint(0, 3)}}


def a_filter(rng: random.Random) -> dict[str, Any] | None:
    return rng.choice([
        None, {"tag": rng.choice(["x", "y"])}, {"n": {"$gte": rng.randint(0, 20)}},
        {"n": {"$lt": rng.randint(0, 20), "$gt": 2}}, {"tag": {"$ne": "z"}},
        {"nested": {"m": rng.randint(0, 3)}}, {"n": rng.randint(0, 20), "tag": "x"},
    ])


def as_tuple(item: Any) -> tuple[tuple[str, ...], str, dict[str, Any]] | None:
    return None if item is None else (tuple(item.namespace), item.key, item.value)


class Model:
    """What the reference lacks: recency (our order without a query) and time to live."""

    def __init__(self) -> None:
        self.written: dict[tuple[tuple[str, ...], str], int] = {}
        self.clock = 0

    def wrote(self, namespace: tuple[str, ...], key: str, deleted: bool) -> None:
        self.clock += 1
        if deleted:
            self.written.pop((namespace, key), None)
        else:
            self.written[(namespace, key)] = self.clock


def tidy(reference: InMemoryStore) -> None:
    """InMemoryStore lists the namespaces it has only looked up, or whose items all went (its
    `defaultdict`): a quirk of the reference, not store semantics. They are dropped."""
    for namespace in [ns for ns, items in reference._data.items() if not items]:
        del reference._data[namespace]


def expected_search(reference: InMemoryStore, model: Model, op: SearchOp) -> list[Any]:
    """The reference's matches (all of them), in our order without a query: most recent
    write first; then the page."""
    everything = reference.batch([op._replace(limit=10_000, offset=0)])[0]
    ordered = sorted(everything, key=lambda i: -model.written[(tuple(i.namespace), i.key)])
    return [as_tuple(i) for i in ordered[op.offset:op.offset + op.limit]]


async def run_sequence(seed: int, ours: AgentStateStore, root: str) -> int:
    rng = random.Random(seed)
    reference = InMemoryStore()
    model = Model()
    checked = 0
    for _step in range(60):
        batch = []
        for _ in range(rng.choice([1, 1, 1, 2, 3, 5])):
            namespace = (root, *rng.sample(LABELS, rng.randint(1, 2)))
            key = rng.choice(KEYS)
            kind = rng.random()
            if kind < 0.45:
                batch.append(PutOp(namespace, key, value(rng)))
            elif kind < 0.55:
                batch.append(PutOp(namespace, key, None))
            elif kind < 0.7:
                batch.append(GetOp(namespace, key, refresh_ttl=False))
            elif kind < 0.9:
                prefix = (root, *rng.sample(LABELS, rng.randint(0, 1)))
                batch.append(SearchOp(prefix, a_filter(rng), rng.choice([3, 10, 50]),
                                      rng.choice([0, 0, 2]), refresh_ttl=False))
            else:
                conditions = [MatchCondition("prefix", (root, *rng.sample(
                    [*LABELS, "*"], rng.randint(0, 1))))]
                if rng.random() < 0.3:
                    conditions.append(MatchCondition("suffix", (rng.choice(LABELS),)))
                batch.append(ListNamespacesOp(tuple(conditions), rng.choice([None, 2, 3]),
                                              rng.choice([2, 100]), rng.choice([0, 1])))
        # Reads see the store before the batch's writes, in both stores.
        expected: list[Any] = []
        tidy(reference)
        for op in batch:
            if isinstance(op, SearchOp):
                expected.append(expected_search(reference, model, op))
            elif isinstance(op, GetOp):
                expected.append(as_tuple(reference.batch([op])[0]))
            elif isinstance(op, ListNamespacesOp):
                expected.append(reference.batch([op])[0])
            else:
                expected.append(None)
        reference.batch(batch)
        for op in batch:
            if isinstance(op, PutOp):
                model.wrote(op.namespace, op.key, op.value is None)
        got = await ours.abatch(batch)
        for op, want, answer in zip(batch, expected, got, strict=True):
            if isinstance(op, SearchOp):
                answer = [as_tuple(i) for i in answer]
            elif isinstance(op, GetOp):
                answer = as_tuple(answer)
            assert answer == want, (seed, _step, op)
            checked += 1
        if rng.random() < 0.1:  # time to live: an item that expires, gone from every read
            namespace, key = (root, rng.choice(LABELS)), rng.choice(KEYS)
            await ours.aput(namespace, key, value(rng), ttl=0.001)  # 60 ms
            reference.delete(namespace, key)
            model.wrote(namespace, key, True)
            await asyncio.sleep(0.15)  # past its expiry: no timing assertion, only a wait
            assert await ours.aget(namespace, key) is None
            assert key not in {i.key for i in await ours.asearch(namespace, limit=100)
                               if tuple(i.namespace) == namespace}
            checked += 1
    return checked


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
async def test_differential_against_in_memory_store(api: AsyncAgentStateClient, uid: str,
                                                    seed: int) -> None:
    ours = AgentStateStore(async_client=api, text_query=False)
    assert await run_sequence(seed, ours, f"d-{uid}") > 60


async def test_vector_search_matches_in_memory_store(api: AsyncAgentStateClient,
                                                     uid: str) -> None:
    index = {"dims": DIMS, "embed": embed, "fields": ["text"]}
    reference = InMemoryStore(index=index)
    ours = AgentStateStore(async_client=api, index=index)
    rng = random.Random(7)
    root = f"v-{uid}"
    for n in range(25):
        namespace = (root, rng.choice(["a", "b"]))
        item = {"text": " ".join(rng.sample(WORDS, rng.randint(1, 4))), "n": n}
        reference.put(namespace, f"k{n}", item)
        await ours.aput(namespace, f"k{n}", item)
    await ours.aput((root, "a"), "plain", {"text": "tea", "n": 99}, index=False)
    reference.put((root, "a"), "plain", {"text": "tea", "n": 99}, index=False)
    for query, filter_ in (("tea coffee", None), ("rain in rome", {"n": {"$gte": 10}}),
                           ("jazz", None), ("cats and dogs", {"n": {"$lt": 5}})):
        want = reference.search((root,), query=query, filter=filter_, limit=100)
        got = await ours.asearch((root,), query=query, filter=filter_, limit=100)
        scores = {(tuple(i.namespace), i.key): i.score for i in want}
        assert {(tuple(i.namespace), i.key) for i in got} == set(scores), query
        for found in got:
            expected = scores[(tuple(found.namespace), found.key)]
            assert (found.score is None) == (expected is None), (query, found.key)
            if expected is not None:
                assert math.isclose(found.score, expected, abs_tol=1e-5), (query, found.key)
        ranked = [s for s in (i.score for i in got) if s is not None]
        assert ranked == sorted(ranked, reverse=True)
        top = await ours.asearch((root,), query=query, filter=filter_, limit=3)
        assert [i.score for i in top] == pytest.approx(
            sorted((s for s in scores.values() if s is not None), reverse=True)[:3], abs=1e-5)


async def test_ttl_config_and_refresh_on_read(api: AsyncAgentStateClient, uid: str) -> None:
    ours = AgentStateStore(async_client=api, ttl={"default_ttl": 10, "refresh_on_read": True})
    namespace = (f"t-{uid}",)
    await ours.aput(namespace, "k", {"v": 1})
    stored = await api.get_store_item(namespace, "k")
    assert stored.ttl_seconds == 600 and stored.expires_at is not None
    await asyncio.sleep(0.01)
    assert (await ours.aget(namespace, "k")).value == {"v": 1}
    refreshed = await api.get_store_item(namespace, "k")
    assert refreshed.expires_at > stored.expires_at, "a read restarted the time to live"
    assert refreshed.revision == stored.revision
    await ours.aget(namespace, "k", refresh_ttl=False)
    assert (await api.get_store_item(namespace, "k")).expires_at == refreshed.expires_at
    await ours.aput(namespace, "forever", {"v": 2}, ttl=None)
    assert (await api.get_store_item(namespace, "forever")).expires_at is None
    await ours.adelete(namespace, "missing")  # a no-op, as in LangGraph


async def test_a_batch_is_one_request(app: Any, uid: str) -> None:
    import httpx

    sent: list[str] = []

    class Counting(httpx.ASGITransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            sent.append(f"{request.method} {request.url.path}")
            return await super().handle_async_request(request)

    async with AsyncAgentStateClient("http://agentstate.test",
                                     transport=Counting(app=app)) as api:
        ours = AgentStateStore(async_client=api)
        namespace = (f"b-{uid}", "x")
        results = await ours.abatch([
            PutOp(namespace, "a", {"n": 1}), PutOp(namespace, "b", {"n": 2}),
            GetOp(namespace, "a"), SearchOp((f"b-{uid}",), None, 10, 0),
            ListNamespacesOp((MatchCondition("prefix", (f"b-{uid}",)),), None, 10, 0),
            PutOp(namespace, "a", {"n": 3}), PutOp(namespace, "gone", None)])
        assert sent == ["POST /v1/batch"]
        assert results[2] is None and results[3] == [] and results[4] == [], \
            "reads see the store before the batch's writes"
        assert (await ours.aget(namespace, "a")).value == {"n": 3}, "the last put wins"


@pytest.mark.postgres_only(reason="PostgresStore, LangGraph's reference that compares "
                                  "numbers as text, runs on Postgres only")
async def test_numeric_filters_are_numeric_unlike_postgres_store(
        api: AsyncAgentStateClient, database_url: str, uid: str) -> None:
    from langgraph.store.postgres import PostgresStore

    from tests.support import create_postgres_database, drop_postgres_database

    ours = AgentStateStore(async_client=api)
    namespace = (f"num-{uid}",)
    url = await asyncio.to_thread(create_postgres_database)
    try:
        plain = url.replace("postgresql+asyncpg://", "postgresql://")
        with PostgresStore.from_conn_string(plain) as theirs:
            theirs.setup()
            for key, n in (("nine", 9), ("ten", 10), ("eleven", 11)):
                theirs.put(namespace, key, {"n": n})
                await ours.aput(namespace, key, {"n": n})
            their_keys = {i.key for i in theirs.search(namespace, filter={"n": {"$gte": 10}})}
            our_keys = {i.key for i in await ours.asearch(namespace,
                                                          filter={"n": {"$gte": 10}})}
    finally:
        await asyncio.to_thread(drop_postgres_database, url)
    # PostgresStore compares value->>'n' >= '10' as text: "9" >= "10" (langgraph #7684).
    assert their_keys == {"nine", "ten", "eleven"}
    assert our_keys == {"ten", "eleven"}


async def test_a_graph_remembers_across_threads(api: AsyncAgentStateClient, uid: str) -> None:
    from langgraph.graph import END, START, StateGraph
    from langgraph.runtime import Runtime
    from typing_extensions import TypedDict

    class State(TypedDict):
        user: str
        said: str
        recalled: list[str]

    async def remember(state: State, runtime: Runtime[None]) -> dict[str, Any]:
        store = runtime.store
        assert store is not None
        namespace = ("memories", state["user"])
        found = await store.asearch(namespace, query=state["said"], limit=2)
        if state["said"].startswith("remember "):
            fact = state["said"].removeprefix("remember ")
            await store.aput(namespace, hashlib.sha256(fact.encode()).hexdigest()[:8],
                             {"text": fact, "at": datetime.now(UTC).isoformat()})
        return {"recalled": [item.value["text"] for item in found]}

    builder = StateGraph(State)
    builder.add_node("remember", remember)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", END)
    store = AgentStateStore(async_client=api,
                            index={"dims": DIMS, "embed": embed, "fields": ["text"]})
    graph = builder.compile(store=store)
    user = f"user/{uid}"
    for fact in ("remember tea with lemon", "remember jazz on sunday", "remember rain in rome"):
        await graph.ainvoke({"user": user, "said": fact, "recalled": []})
    answer = await graph.ainvoke({"user": user, "said": "jazz on sunday again?", "recalled": []})
    assert answer["recalled"][0] == "jazz on sunday"
    other = await graph.ainvoke({"user": f"other-{uid}", "said": "jazz", "recalled": []})
    assert other["recalled"] == [], "memories are per namespace"


@pytest.mark.slow
def test_the_blocking_store_over_a_real_server(server: ServerProcess, uid: str) -> None:
    store = AgentStateStore(base_url=server.base_url,
                            index={"dims": DIMS, "embed": embed, "fields": ["text"]})
    namespace = (f"sync-{uid}", "u")
    store.put(namespace, "a", {"text": "tea and cats"})
    store.put(namespace, "b", {"text": "jazz"}, ttl=None)
    assert store.get(namespace, "a").value == {"text": "tea and cats"}
    assert [i.key for i in store.search(namespace, query="jazz", limit=1)] == ["b"]
    assert store.list_namespaces(prefix=(f"sync-{uid}",)) == [namespace]
    results = store.batch([GetOp(namespace, "a"), PutOp(namespace, "a", None)])
    assert results[0].key == "a" and store.get(namespace, "a") is None
    store.delete(namespace, "never")
    store.close()
