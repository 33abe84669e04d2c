"""`agentstate export`: every tenant data table as JSON lines, for backups and audits.

Generic over `Base.metadata`, so tables added by any slice are included as long as they have
a `tenant_id` column. Columns marked `info={"secret": True}` are written as "***": an export
never carries secrets, not even encrypted.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, TextIO

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import Base

REDACTED = "***"


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    raise TypeError(f"cannot export {type(value).__name__}")


async def export(engine: AsyncEngine, out: TextIO, progress: TextIO) -> int:
    """Write `{"table": ..., "row": {...}}` lines in primary-key order; returns the row count.
    One read transaction (REPEATABLE READ on Postgres), so the tables agree with each other."""
    tables = [t for t in Base.metadata.sorted_tables if "tenant_id" in t.c]
    total = 0
    async with engine.connect() as connection:
        if engine.dialect.name == "postgresql":
            await connection.execution_options(isolation_level="REPEATABLE READ")
        for table in tables:
            secret = {column.name for column in table.c if column.info.get("secret")}
            count = 0
            rows = await connection.stream(select(table).order_by(*table.primary_key.columns))
            async for row in rows:
                record = {key: REDACTED if key in secret and value is not None else value
                          for key, value in row._mapping.items()}
                out.write(json.dumps({"table": table.name, "row": record},
                                     ensure_ascii=False, default=_json_default) + "\n")
                count += 1
            total += count
            print(f"exported {count} rows of {table.name}", file=progress, flush=True)
    return total
