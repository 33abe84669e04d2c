"""The markdown report: every figure beside its baseline, and the targets of the issue."""

from __future__ import annotations

from math import prod
from typing import Any


def _find(results: dict[str, Any], target: str, op: str, backend: str | None = None,
          workers: int | None = None) -> dict[str, Any] | None:
    for row in results["load"]:
        if (row["target"] == target and row["op"] == op
                and (backend is None or row["backend"] == backend)
                and (workers is None or row["workers"] == workers) and row.get("requests")):
            return row
    return None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def _baseline(results: dict[str, Any], row: dict[str, Any]) -> tuple[str, float | None]:
    """The baseline an operation is compared with: the same SQL through asyncpg where we
    have it, the minimal FastAPI endpoint (same workers) for reads without one."""
    sql = _find(results, "asyncpg", row["op"])
    if sql and row["backend"] == "postgres":
        return "asyncpg", _ratio(row["throughput"], sql["throughput"])
    hello = _find(results, "fastapi", "hello", workers=row["workers"])
    if hello:
        return "FastAPI", _ratio(row["throughput"], hello["throughput"])
    return "-", None


def load_table(results: dict[str, Any]) -> list[str]:
    lines = [("| target | backend | workers | operation | req/s | p50 ms | p99 ms | server RSS MB "
             "| server CPU | client CPU | ratio to baseline |"),
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in results["load"]:
        if "failed" in row:
            lines.append(f"| {row['target']} | {row['backend']} | {row['workers']} | {row['op']} "
                         f"| failed: {row['failed'][:120]} | | | | | | |")
            continue
        base, ratio = _baseline(results, row) if row["target"] == "agentstate" else ("", None)
        errors = f" ({row['errors']} errors)" if row.get("errors") else ""
        lines.append(
            f"| {row['target']} | {row['backend']} | {row['workers'] or '-'} | {row['op']}{errors} "
            f"| {_fmt(row['throughput'])} | {_fmt(row['p50_ms'])} | {_fmt(row['p99_ms'])} "
            f"| {_fmt(row.get('server_rss_mb'))} | {_fmt(row.get('server_cpu'))} "
            f"| {_fmt(row['client_cpu'])} | {f'{ratio:g}x {base}' if ratio else '-'} |")
    return lines


def targets(results: dict[str, Any]) -> list[tuple[str, float | None, float, str]]:
    """(target, measured ratio, threshold, how it was measured)."""
    out: list[tuple[str, float | None, float, str]] = []
    for op in ("state_replace", "append_1"):
        ours = _find(results, "agentstate", op, "postgres", 1)
        sql = _find(results, "asyncpg", op, "postgres")
        out.append((f"{op} over HTTP, 1 worker, Postgres, vs the same SQL through asyncpg (a)",
                    _ratio(ours and ours["throughput"], sql and sql["throughput"]), 0.5,
                    "throughput ratio"))
    for backend in ("postgres", "sqlite"):
        ours = _find(results, "agentstate", "get_thread", backend, 1)
        hello = _find(results, "fastapi", "hello", workers=1)
        out.append((f"get thread ({backend}, 1 worker) vs minimal FastAPI (b)",
                    _ratio(ours and ours["throughput"], hello and hello["throughput"]), 0.5,
                    "throughput ratio"))
    for backend, chat in results["conversation"].items():
        if "aisuite" in chat and "agentstate" in chat:
            out.append(((f"state save at turn {chat['turns']}: aisuite in-process / agentstate "
                        f"over HTTP ({backend})"),
                        _ratio(chat["aisuite"]["late_ms"], chat["agentstate"]["late_ms"]), 5.0,
                        "latency ratio, medians of the last 10 turns"))
    scaling_ratios = []
    for backend, scale in results["scaling"].items():
        if "failed" in scale:
            continue
        sizes = list(scale["append_1"])
        small, mid, big = sizes[0], sizes[min(1, len(sizes) - 1)], sizes[-1]
        for name, base in (("append_1", small), ("page_10", small), ("page_100", mid)):
            ratio = _ratio(scale[name][big], scale[name][base])
            scaling_ratios.append(ratio)
            out.append((f"{name} latency at {big} messages / at {base} ({backend})", ratio,
                        1.25, "lower is better"))
    writes = [(_find(results, "agentstate", op, "postgres", 1),
               _find(results, "agentstate", op, "postgres", 2))
              for op in ("create_thread", "state_replace", "append_1", "append_10",
                         "agent_state_replace")]
    ratios = [r2["throughput"] / r1["throughput"] for r1, r2 in writes if r1 and r2]
    if ratios:
        out.append((("write throughput, 2 workers / 1 worker, Postgres (geometric mean of "
                    f"{len(ratios)} write operations)"),
                    round(prod(ratios) ** (1 / len(ratios)), 2), 1.6, "throughput ratio"))
    return out


def render(results: dict[str, Any]) -> str:
    machine = results["machine"]
    pg = machine.get("postgres", {})
    lines = [
        f"Command: `{results['command']}`",
        "",
        (f"Machine: {machine['nproc']} cores ({machine['cpu']}), {machine['memory']} RAM, "
        f"Python {machine['python']}, PostgreSQL {pg.get('server_version', '?')} "
        f"(fsync={pg.get('fsync', '?')}, synchronous_commit={pg.get('synchronous_commit', '?')}), "
        f"commit {machine['commit']}, {machine['date']}, load average before "
        f"{machine['loadavg'][0]:.2f}, after {machine.get('loadavg_after', [0])[0]:.2f}."),
        (f"Load: {results['connections']} keep-alive connections, {results['duration']} s per "
        "operation; client CPU = cores the load generator used (1.0 = one full core)."),
        "",
        "## Throughput and latency",
        "",
        *load_table(results),
        "",
    ]
    if results["scaling"]:
        lines += ["## Latency against thread length (median ms, one client)", "",
                  "| backend | operation | " + " | ".join(
                      f"{s} msgs" for s in next((v["append_1"] for v in
                                                 results["scaling"].values()
                                                 if "append_1" in v), {})) + " |"]
        lines.append("|---|---|" + "---|" * max(
            (len(v["append_1"]) for v in results["scaling"].values() if "append_1" in v),
            default=0))
        for backend, scale in results["scaling"].items():
            if "failed" in scale:
                lines.append(f"| {backend} | failed: {scale['failed']} |")
                continue
            for name, by_size in scale.items():
                lines.append(f"| {backend} | {name} | "
                             + " | ".join(_fmt(v) for v in by_size.values()) + " |")
        lines.append("")
    if results["conversation"]:
        lines += ["## A growing conversation: one save per turn (state + 2 messages), one client",
                  "", ("Medians over the first and the last 10 turns of each of "
                  f"{next(iter(results['conversation'].values())).get('chats', 1)} conversations, "
                  "their turns interleaved with aisuite's."),
                  "", ("| backend | system | turns 1-10 ms | last 10 turns ms | growth "
                  "| load all messages ms |"), "|---|---|---|---|---|---|"]
        for backend, chat in results["conversation"].items():
            if "failed" in chat:
                lines.append(f"| {backend} | failed: {chat['failed']} | | | | |")
                continue
            for system in ("agentstate", "aisuite"):
                if system in chat:
                    c = chat[system]
                    lines.append(f"| {backend} | {system} | {c['early_ms']} | {c['late_ms']} "
                                 f"| {c['growth']}x | {c['load_ms']} |")
        if any("aisuite" not in chat for chat in results["conversation"].values()):
            lines.append("aisuite runs on Postgres only, and only with the bench extra "
                         "installed (`pip install -e '.[bench]'`).")
        lines.append("")
    lines += ["## Targets", "", "| target | measured | needed | met |", "|---|---|---|---|"]
    for name, ratio, threshold, how in targets(results):
        lower_better = how == "lower is better"
        met = ratio is not None and (ratio <= threshold if lower_better else ratio >= threshold)
        need = f"<= {threshold}x" if lower_better else f">= {threshold}x"
        lines.append(f"| {name} | {_fmt(ratio)}{'x' if ratio else ''} | {need} | "
                     f"{'yes' if met else 'no'} |")
    lines += floors(results)
    return "\n".join(lines) + "\n"


def floors(results: dict[str, Any]) -> list[str]:
    """What the get-thread target is measured against, put in context: the same GET as a bare
    FastAPI endpoint with one asyncpg SELECT, and agentstate's own stack with no database."""
    hello = _find(results, "fastapi", "hello", workers=1)
    floor = _find(results, "fastapi+asyncpg", "get_thread", "postgres", 1)
    ours = _find(results, "agentstate", "get_thread", "postgres", 1)
    stack = _find(results, "agentstate", "healthz", "postgres", 1)
    if not (hello and floor):
        return []
    lines = ["", (f"Get thread in context (1 worker, Postgres, req/s): minimal FastAPI "
                  f"{_fmt(hello['throughput'])}; a bare FastAPI endpoint doing the one SELECT "
                  f"through asyncpg {_fmt(floor['throughput'])} "
                  f"({_fmt(_ratio(floor['throughput'], hello['throughput']))}x of minimal)")]
    if stack:
        lines[-1] += (f"; agentstate's stack with no database (`/healthz`) "
                      f"{_fmt(stack['throughput'])} "
                      f"({_fmt(_ratio(stack['throughput'], hello['throughput']))}x)")
    if ours:
        lines[-1] += (f"; agentstate get thread {_fmt(ours['throughput'])} "
                      f"({_fmt(_ratio(ours['throughput'], floor['throughput']))}x of the bare "
                      "endpoint).")
    return lines
