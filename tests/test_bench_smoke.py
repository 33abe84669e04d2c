"""The benchmark harness runs end to end in its tiny mode (no timing assertions: speed is
measured by `bench/run.py` itself, not by tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.conversation import aisuite_installed

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = [b for b in os.environ.get("AGENTSTATE_TEST_BACKENDS", "sqlite,postgres").split(",")
            if b]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_quick_bench_produces_every_figure(backend: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "bench/run.py", "--quick", "--backend", backend, "--workers", "1",
         "--connections", "4", "--duration", "0.3", "--ops", "state_replace,append_1,get_thread",
         "--turns", "11", "--sizes", "10,120", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [path] = tmp_path.glob("bench-*.json")
    results = json.loads(path.read_text())

    ours = {row["op"]: row for row in results["load"] if row["target"] == "agentstate"}
    assert set(ours) == {"state_replace", "append_1", "get_thread"}
    for row in ours.values():
        assert "failed" not in row and row["errors"] == 0, row
        assert row["requests"] > 0 and row["server_rss_mb"] > 0 and row["p99_ms"] >= row["p50_ms"]
    assert [row["op"] for row in results["load"] if row["target"] == "fastapi"] == ["hello"]

    scale = results["scaling"][backend]
    assert set(scale) == {"append_1", "page_10", "page_100"}
    assert all(set(by_size) == {"10", "120"} for by_size in scale.values())
    chat = results["conversation"][backend]
    assert chat["messages"] == 22 and chat["agentstate"]["late_ms"] > 0
    if backend == "postgres":
        sql = {row["op"]: row for row in results["load"] if row["target"] == "asyncpg"}
        assert all(row.get("requests") for row in sql.values()), sql
        if aisuite_installed():
            assert chat["aisuite"]["late_ms"] > 0
    assert "| target | measured | needed | met |" in path.with_suffix(".md").read_text()
    assert str(path) in done.stdout
