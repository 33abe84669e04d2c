"""Percentiles and the one shape every measurement is reported in."""

from __future__ import annotations

import math
from statistics import median
from typing import Any


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (q in 0..100)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def summarise(latencies: list[float], seconds: float, **extra: Any) -> dict[str, Any]:
    """Throughput and latency (ms) of `latencies` (seconds) completed in `seconds`."""
    values = sorted(latencies)
    return {
        "requests": len(values),
        "seconds": round(seconds, 3),
        "throughput": round(len(values) / seconds, 1) if seconds > 0 else 0.0,
        "p50_ms": round(percentile(values, 50) * 1000, 3),
        "p99_ms": round(percentile(values, 99) * 1000, 3),
        "median_ms": round(median(values) * 1000, 3) if values else math.nan,
        **extra,
    }
