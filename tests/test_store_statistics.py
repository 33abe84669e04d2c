"""A vector search on store tables Postgres has never analyzed analyzes them first
(`StoreRepository.ensure_statistics`): without statistics Postgres planned the item-vector
join as a nested loop over every pair, and a search of 20,000 items loaded into a fresh
database ran into the statement timeout (docs/operations.md)."""

from __future__ import annotations

import pytest

from app.core.settings import Settings
from tests.conftest import http_client, running
from tests.support import pg_connect, statements

pytestmark = pytest.mark.anyio
ITEMS = 100


async def statistics_rows(url: str) -> int:
    connection = await pg_connect(url)
    try:
        return int(await connection.fetchval(
            "SELECT count(*) FROM pg_stats WHERE schemaname = current_schema() "
            "AND tablename IN ('store_items', 'store_vectors')"))
    finally:
        await connection.close()


@pytest.mark.postgres_only(reason="planner statistics are Postgres's")
async def test_a_vector_search_analyzes_tables_postgres_never_analyzed(fresh_url: str) -> None:
    connection = await pg_connect(fresh_url)
    try:  # autovacuum would analyze them in its own time: it must not, here
        for table in ("store_items", "store_vectors"):
            await connection.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    finally:
        await connection.close()
    settings = Settings(database_url=fresh_url, auto_migrate=False, _env_file=None)  # type: ignore[call-arg]
    vector = {"index": "e", "embedding": [1.0, 0.0, 0.0]}
    async with running(settings) as app, http_client(app) as client:
        done = await client.post("/v1/batch", json={"operations": [
            {"op": "store.put", "namespace": ["s"], "key": f"k{i}",
             "body": {"value": {"i": i}, "vectors": {"e": {"f": [1.0, i / ITEMS, 0.0]}}}}
            for i in range(ITEMS)]})
        assert done.status_code == 200, done.text
        assert await statistics_rows(fresh_url) == 0
        with statements(app) as heard:
            first = await client.post("/v1/store/items/search",
                                      json={"vector": vector, "limit": 3})
            second = await client.post("/v1/store/items/search",
                                       json={"vector": vector, "limit": 3})
    assert first.status_code == second.status_code == 200, first.text
    assert [item["key"] for item in first.json()["data"]] == ["k0", "k1", "k2"]
    assert second.json() == first.json()
    analyzed = [s.sql for s in heard if s.sql.startswith("ANALYZE")]
    assert analyzed == ["ANALYZE store_items, store_vectors"], analyzed  # once, not twice
    assert await statistics_rows(fresh_url) > 0
