"""The load generator: its own process, one asyncio loop, N keep-alive connections.

`python -m bench.loadgen '<json spec>'` prints one JSON result. Setup requests run before the
clock starts; the clock covers only the measured requests, and the process's own CPU time over
that window is reported so a saturated generator is visible (cpu_share near 1.0 = one core).
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench.http1 import Connection
from bench.ops import OPS, Op, Slot
from bench.stats import summarise


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def worker(op: Op, conn: Connection, slot: Slot, stop_at: float,
                 latencies: list[float], errors: list[str]) -> None:
    while time.perf_counter() < stop_at and not op.exhausted(slot):
        method, path, body, headers = op.build(slot)
        started = time.perf_counter()
        status, response_headers, payload = await conn.request(method, path, body, headers)
        elapsed = time.perf_counter() - started
        if status not in op.expect:
            errors.append(f"{method} {path} -> {status} {payload[:200]!r}")
            if len(errors) > 20:  # a broken operation should fail fast, not spin
                return
            continue
        latencies.append(elapsed)
        op.done(slot, response_headers)


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    op = OPS[spec["op"]](spec["run_id"], spec.get("params", {}))
    conns = [await Connection(spec["base_url"]).connect() for _ in range(spec["connections"])]
    try:
        slots = [await op.setup(conn, i) for i, conn in enumerate(conns)]
        warmup = 0.0 if op.finite else spec.get("warmup", 0.0)
        if warmup:
            stop_at = time.perf_counter() + warmup
            await asyncio.gather(*(worker(op, c, s, stop_at, [], []) for c, s in zip(conns, slots)))
        latencies: list[float] = []
        errors: list[str] = []
        cpu_before, started = cpu_seconds(), time.perf_counter()
        stop_at = started + spec["duration"]
        await asyncio.gather(*(worker(op, c, s, stop_at, latencies, errors)
                               for c, s in zip(conns, slots)))
        seconds = time.perf_counter() - started
        cpu = cpu_seconds() - cpu_before
    finally:
        for conn in conns:
            await conn.close()
    return summarise(latencies, seconds, errors=len(errors), error_sample=errors[:3],
                     client_cpu=round(cpu / seconds, 3) if seconds else 0.0)


def main(run: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]) -> None:
    """Run `run(<json spec from argv>)` on uvloop when installed; print its JSON result."""
    try:
        import uvloop
    except ImportError:
        uvloop = None
    spec = json.loads(sys.argv[1])
    result = uvloop.run(run(spec)) if uvloop else asyncio.run(run(spec))
    print(json.dumps(result))


if __name__ == "__main__":
    main(run)
