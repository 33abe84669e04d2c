"""Baseline (b): the framework's limit. A FastAPI endpoint returning a small JSON body, served
by uvicorn with exactly the settings `agentstate serve` uses (app/ops/commands.py).

With AGENTSTATE_BENCH_DSN set it also answers `GET /v1/threads/{id}` the barest way there is:
one asyncpg SELECT of the row from a pool, returned as JSON with no key check, no log line and
no response model. That is the most any FastAPI endpoint that reads the thread from Postgres
can reach on this machine, the floor under agentstate's get thread.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Request

BODY = {"thread_id": "bench", "revision": 1, "state": {"status": "running"}, "metadata": {}}
ROW = ("SELECT thread_id, revision, state, metadata, created_at, updated_at, message_count "
       "FROM threads WHERE tenant_id = 'default' AND thread_id = $1 AND deleted_at IS NULL")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    dsn = os.environ.get("AGENTSTATE_BENCH_DSN")
    if dsn is None:
        yield
        return
    import asyncpg

    async def keep(_connection: Any) -> None:
        """No reset query on release (asyncpg's default sends one): nothing here needs it."""

    app.state.pool = await asyncpg.create_pool(dsn, min_size=20, max_size=20, reset=keep)
    try:
        yield
    finally:
        await app.state.pool.close()


def create_app() -> FastAPI:
    app = FastAPI(lifespan=lifespan)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/hello")
    async def hello() -> dict[str, object]:
        return BODY

    @app.get("/v1/threads/{thread_id}")
    async def thread(thread_id: str, request: Request) -> dict[str, Any]:
        row = await request.app.state.pool.fetchrow(ROW, thread_id)
        if row is None:
            raise HTTPException(404)
        return {**row, "state": json.loads(row["state"]), "metadata": json.loads(row["metadata"])}

    return app


def main() -> None:
    from app.ops.listen import run_uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    run_uvicorn("bench.minimal_app:create_app", factory=True, host="127.0.0.1", port=args.port,
                workers=args.workers, log_config=None, access_log=False,
                timeout_graceful_shutdown=30, timeout_keep_alive=30, server_header=False)


if __name__ == "__main__":
    main()
