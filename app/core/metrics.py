"""Prometheus metrics, one registry per application (no import-time globals)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector


class _PoolCollector(Collector):
    def __init__(self, checked_out: Callable[[], int]) -> None:
        self._checked_out = checked_out

    def collect(self) -> Iterable[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "agentstate_db_pool_in_use", "Database connections checked out of the pool.",
            value=self._checked_out(),
        )


class Metrics:
    def __init__(self) -> None:
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

    def watch_pool(self, checked_out: Callable[[], int]) -> None:
        self.registry.register(_PoolCollector(checked_out))
