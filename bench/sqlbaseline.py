"""Baseline (a): the database's limit for the work. The same SQL transactions the server issues
for an operation (read from the repositories; compare with `python -m bench.sqlcapture`), sent
directly with asyncpg over N connections, one transaction per operation.

`python -m bench.sqlbaseline '<json spec>'` prints one JSON result, like bench.loadgen.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from typing import Any

import asyncpg

from bench.loadgen import cpu_seconds, main
from bench.ops import TEXT, run_state
from bench.stats import summarise

TENANT, ACTOR = "default", "anonymous"
THREAD_COLUMNS = ("id, tenant_id, thread_id, revision, state, metadata, created_at, updated_at, "
                  "deleted_at, last_seq, message_count")
EVENT_COLUMNS = "(tenant_id, actor, type, resource, revision, thread_id, at)"
EVENT_VALUES = "$1, $2, $3, $4, $5, $6, $7"
# The server takes the per-tenant event lock in the INSERT itself (app/events/service.py).
EVENT_INSERT = ("WITH event_lock AS MATERIALIZED (SELECT pg_advisory_xact_lock(1634169716, "
                f"hashtext($1)) AS held) INSERT INTO events {EVENT_COLUMNS} "
                f"SELECT {EVENT_VALUES} FROM event_lock")
EVENT_INSERT_UNLOCKED = f"INSERT INTO events {EVENT_COLUMNS} VALUES ({EVENT_VALUES})"


def now() -> datetime:
    return datetime.now(UTC)


async def record_event(conn: asyncpg.Connection, type: str, thread: str, revision: int,
                       lock: bool = True) -> None:
    await conn.execute(EVENT_INSERT if lock else EVENT_INSERT_UNLOCKED, TENANT, ACTOR, type,
                       f"/v1/threads/{thread}", revision, thread, now())


async def create_thread(conn: asyncpg.Connection, thread: str, state: dict[str, Any]) -> int:
    at = now()
    row = await conn.fetchrow(
        "INSERT INTO threads (tenant_id, thread_id, revision, state, metadata, created_at, "
        "updated_at, last_seq, message_count) VALUES ($1, $2, 1, $3::json, $4::json, $5, $5, 0, 0) "
        f"ON CONFLICT (tenant_id, thread_id) DO NOTHING RETURNING {THREAD_COLUMNS}",
        TENANT, thread, json.dumps(state), json.dumps({"team": "bench"}), at)
    await record_event(conn, "thread.created", thread, row["revision"])
    return int(row["revision"])


class Slot:
    def __init__(self, thread: str) -> None:
        self.thread = thread
        self.revision = 1
        self.counter = 0


async def op_create_thread(conn: asyncpg.Connection, slot: Slot) -> None:
    async with conn.transaction():
        await create_thread(conn, f"{slot.thread}-{slot.counter}", run_state(0))


async def op_state_replace(conn: asyncpg.Connection, slot: Slot, lock: bool = True) -> None:
    """PUT /v1/threads/{id} with If-Match: ThreadRepository.advance, then the event."""
    async with conn.transaction():
        row = await conn.fetchrow(
            "UPDATE threads SET revision = revision + 1, state = $2::json, updated_at = $1, "
            "last_seq = last_seq + 0, message_count = message_count + 0 WHERE tenant_id = $3 "
            "AND thread_id = $4 AND deleted_at IS NULL AND revision IN ($5) "
            f"RETURNING {THREAD_COLUMNS}",
            now(), json.dumps(run_state(slot.counter)), TENANT, slot.thread, slot.revision)
        slot.revision = row["revision"]
        await record_event(conn, "thread.updated", slot.thread, slot.revision, lock)


async def op_state_replace_no_event_lock(conn: asyncpg.Connection, slot: Slot) -> None:
    """Not a baseline for any request: the same transaction without the per-tenant lock that
    orders event commits, to show what that lock costs when every writer is one tenant."""
    await op_state_replace(conn, slot, lock=False)


async def op_get_thread(conn: asyncpg.Connection, slot: Slot) -> None:
    await conn.fetchrow(f"SELECT {THREAD_COLUMNS} FROM threads WHERE tenant_id = $1 AND "
                        "thread_id = $2", TENANT, slot.thread)


async def op_append_1(conn: asyncpg.Connection, slot: Slot) -> None:
    """POST /v1/threads/{id}/messages, one message: revision and seq bumped in one UPDATE
    (which also holds the row against a concurrent delete), the message, the event."""
    async with conn.transaction():
        row = await conn.fetchrow(
            "UPDATE threads SET revision = revision + 1, updated_at = $1, last_seq = last_seq + 1, "
            "message_count = message_count + 1 WHERE tenant_id = $2 AND thread_id = $3 AND "
            "deleted_at IS NULL RETURNING id, thread_id, revision, last_seq",
            now(), TENANT, slot.thread)
        seq = row["last_seq"]
        await conn.execute(
            "INSERT INTO messages (thread_pk, seq, tenant_id, message_id, position, role, content, "
            "name, tool_calls, tool_call_id, agent_name, metadata, created_at, status, "
            "compacted_by, summary_of) VALUES ($1, $2, $3, $4, $2, 'user', $5::json, NULL, NULL, "
            "NULL, NULL, '{}'::json, $6, 'live', NULL, NULL)",
            row["id"], seq, TENANT, f"msg_{slot.thread}_{seq}",
            json.dumps(f"{slot.counter}: {TEXT}"), now())
        await record_event(conn, "message.appended", slot.thread, row["revision"])


OPS = {"create_thread": op_create_thread, "state_replace": op_state_replace,
       "get_thread": op_get_thread, "append_1": op_append_1,
       "state_replace_no_event_lock": op_state_replace_no_event_lock}


async def worker(conn: asyncpg.Connection, op: Any, slot: Slot, stop_at: float,
                 latencies: list[float]) -> None:
    while time.perf_counter() < stop_at:
        started = time.perf_counter()
        await op(conn, slot)
        latencies.append(time.perf_counter() - started)
        slot.counter += 1


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    op = OPS[spec["op"]]
    conns = [await asyncpg.connect(spec["dsn"]) for _ in range(spec["connections"])]
    try:
        slots = [Slot(f"sql-{spec['run_id']}-{spec['op']}-{i}") for i in range(len(conns))]
        for conn, slot in zip(conns, slots):
            async with conn.transaction():
                slot.revision = await create_thread(conn, slot.thread, run_state(0))
        warm_until = time.perf_counter() + spec.get("warmup", 0.0)
        await asyncio.gather(*(worker(c, op, s, warm_until, []) for c, s in zip(conns, slots)))
        latencies: list[float] = []
        cpu_before, started = cpu_seconds(), time.perf_counter()
        stop_at = started + spec["duration"]
        await asyncio.gather(*(worker(c, op, s, stop_at, latencies) for c, s in zip(conns, slots)))
        seconds = time.perf_counter() - started
        cpu = cpu_seconds() - cpu_before
    finally:
        for conn in conns:
            await conn.close()
    return summarise(latencies, seconds, errors=0, client_cpu=round(cpu / seconds, 3))


if __name__ == "__main__":
    main(run)
