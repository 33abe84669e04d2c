"""Baseline (b): the framework's limit. A FastAPI endpoint returning a small JSON body, served
by uvicorn with exactly the settings `agentstate serve` uses (app/cli.py)."""

from __future__ import annotations

import argparse

from fastapi import FastAPI

BODY = {"thread_id": "bench", "revision": 1, "state": {"status": "running"}, "metadata": {}}


def create_app() -> FastAPI:
    app = FastAPI()

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/hello")
    async def hello() -> dict[str, object]:
        return BODY

    return app


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    uvicorn.run("bench.minimal_app:create_app", factory=True, host="127.0.0.1", port=args.port,
                workers=args.workers, log_config=None, access_log=False,
                timeout_graceful_shutdown=30, timeout_keep_alive=30, server_header=False)


if __name__ == "__main__":
    main()
