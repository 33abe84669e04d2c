"""Prometheus metrics, one registry per application (no import-time globals).

Under `agentstate serve --workers N` the supervisor points PROMETHEUS_MULTIPROC_DIR at a
directory of its own (app/ops/listen.py), prometheus_client keeps every worker's values in files
there, and `/metrics` answers from all of them, whichever worker the scrape reaches.
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

# Marks a pool entry whose checkout `pool_in_use` counted.
_COUNTED = "agentstate_counted"

MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"


class Metrics:
    def __init__(self) -> None:
        self.multiprocess = MULTIPROCESS_DIR in os.environ
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "agentstate_http_requests", "HTTP requests by route and status.",
            ["method", "route", "status"], registry=self.registry,
        )
        self.latency = Histogram(
            "agentstate_http_request_duration_seconds", "HTTP request latency by route.",
            ["method", "route"], registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.conflicts = Counter(
            "agentstate_precondition_failures", "412 answers (lost optimistic races) by route.",
            ["route"], registry=self.registry,
        )
        self.pool_in_use = Gauge(
            "agentstate_db_pool_in_use", "Database connections checked out of the pool.",
            registry=self.registry, multiprocess_mode="livesum",
        )

    def watch_pool(self, engine: AsyncEngine) -> None:
        """Count checkouts and checkins (registered after the pre-ping, so a checkout that
        fails its ping and is retried is counted once)."""

        @event.listens_for(engine.sync_engine, "checkout")
        def _out(_dbapi_connection: Any, record: Any, _proxy: Any) -> None:
            record.info[_COUNTED] = True
            self.pool_in_use.inc()

        # A checkout that failed (its connect, its ping) checks its entry in uncounted.
        @event.listens_for(engine.sync_engine, "checkin")
        def _in(_dbapi_connection: Any, record: Any) -> None:
            if record.info.pop(_COUNTED, False):
                self.pool_in_use.dec()

    def exposition(self) -> bytes:
        if not self.multiprocess:
            return generate_latest(self.registry)
        merged = CollectorRegistry()
        MultiProcessCollector(merged)  # type: ignore[no-untyped-call]
        return generate_latest(merged)

    def close(self) -> None:
        """This worker's live values (the pool gauge) leave the sum when it stops."""
        if self.multiprocess:
            mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]
