"""Print the SQL the server issues for the operations baseline (a) replays, so the asyncpg
baseline in bench/sqlbaseline.py can be checked against the real thing:

    .venv/bin/python -m bench.sqlcapture

Runs the app in-process on a scratch Postgres database. BEGIN, COMMIT and the pool's
pre-ping do not pass through SQLAlchemy's cursor events and are not shown.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from sqlalchemy import event

from app.core.settings import Settings
from app.main import create_app
from bench.ops import message, run_state
from bench.server import create_postgres_database, drop_postgres_database, migrate

STEPS: list[tuple[str, str, str, Any, dict[str, str]]] = [
    ("state_replace", "PUT", "/v1/threads/cap", {"state": run_state(1)}, {"if-match": '"1"'}),
    ("append_1", "POST", "/v1/threads/cap/messages", message(1), {}),
    ("get_thread", "GET", "/v1/threads/cap", None, {}),
]


async def capture(url: str) -> dict[str, list[str]]:
    app = create_app(Settings(database_url=url, auto_migrate=False, _env_file=None))
    statements: list[str] = []
    out: dict[str, list[str]] = {}
    async with app.router.lifespan_context(app):
        @event.listens_for(app.state.db.engine.sync_engine, "before_cursor_execute")
        def _record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            statements.append(" ".join(statement.split()))

        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            await client.post("/v1/threads", json={"thread_id": "cap", "state": run_state(0)})
            for name, method, path, body, headers in STEPS:
                statements.clear()
                response = await client.request(method, path, json=body, headers=headers)
                response.raise_for_status()
                out[name] = list(statements)
    return out


def main() -> None:
    url = create_postgres_database()
    try:
        migrate(url)
        for name, statements in asyncio.run(capture(url)).items():
            print(f"-- {name}")
            for statement in statements:
                print(f"   {statement}")
    finally:
        drop_postgres_database(url)


if __name__ == "__main__":
    main()
