"""How fast does `agentstate copy` move a database from SQLite to Postgres, and does its
memory stay flat as the database grows?

For each size (messages in the database), with `--per-thread` messages of about 300
characters per thread:

1. write an export file of that many messages (synthetic, in the format of
   docs/export-format.md) and `agentstate import` it into a fresh SQLite file;
2. `agentstate copy --from <that file> --to <a fresh Postgres database> --no-verify`,
   timed, with the peak RSS of the copy process (wait4's ru_maxrss);
3. the same copy again into the now full database: every thread compares equal, which is
   what a resumed copy pays for the part already done, plus the verification pass.

Prints a markdown table. Every command runs as an operator runs it (`python -m app.cli`).

    .venv/bin/python bench/portability.py --sizes 100000,1000000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POSTGRES_ADMIN = os.environ.get("AGENTSTATE_BENCH_POSTGRES_URL",
                                "postgresql://postgres@127.0.0.1:5432/postgres")
TEXT = ("The risk manager reviewed the position and found the exposure acceptable, but asked "
        "for a tighter stop; the technical analyst agreed and noted the RSI divergence on the "
        "hourly chart, while the portfolio manager wanted the sizing capped at five percent "
        "of the book until earnings are out next week, pending review.")
NOW = "2026-12-01T10:00:00.000000Z"


def write_export(path: Path, messages: int, per_thread: int) -> None:
    """A valid export of `messages` messages in threads of `per_thread`, streamed to disk."""
    from app.db import migrate

    threads = -(-messages // per_thread)
    total = 0
    with path.open("w") as out:
        out.write(json.dumps({"format": "agentstate-export", "version": 1,
                              "schema": migrate.head_revision(), "secrets": "ciphertext"}) + "\n")
        for n in range(threads):
            count = min(per_thread, messages - n * per_thread)
            key = {"tenant_id": "default", "thread_id": f"thread-{n:07d}"}
            out.write(json.dumps({
                "kind": "thread", **key, "revision": count + 1, "state": {"turn": count},
                "metadata": {"bench": True}, "created_at": NOW, "updated_at": NOW,
                "deleted_at": None, "last_seq": count, "message_count": count,
                "history_limit": None}) + "\n")
            out.write(json.dumps({"kind": "thread_revision", **key, "revision": 1,
                                  "state": {"turn": 0}, "metadata": {"bench": True},
                                  "updated_at": NOW}) + "\n")
            for seq in range(1, count + 1):
                out.write(json.dumps({
                    "kind": "message", **key, "seq": seq, "message_id": f"m{seq}",
                    "position": seq, "role": "user" if seq % 2 else "assistant",
                    "content": TEXT, "name": None, "tool_calls": None, "tool_call_id": None,
                    "agent_name": None if seq % 2 else "analyst", "metadata": {},
                    "created_at": NOW, "status": "live", "compacted_by": None,
                    "summary_of": None, "revision": seq + 1}) + "\n")
            out.write(json.dumps({"kind": "thread_end", **key, "records": {
                "thread": 1, "thread_revision": 1, "message": count}}) + "\n")
            total += count + 2
        out.write(json.dumps({"kind": "end", "records": total}) + "\n")


def run(args: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Run `agentstate ARGS`: (seconds, peak RSS in MiB, stderr's last lines). The CPU
    seconds the process used (user + system) go to CPU[-1]: on a shared machine they say
    more than the wall time."""
    started = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        process = subprocess.Popen([sys.executable, "-m", "app.cli", *args], cwd=ROOT,
                                   env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                                   stderr=err)
        _, status, usage = os.wait4(process.pid, 0)
        elapsed = time.perf_counter() - started
        err.seek(0)
        tail = err.read().decode(errors="replace")[-600:]
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"agentstate {' '.join(args)} failed:\n{tail}")
    CPU.append(usage.ru_utime + usage.ru_stime)
    return elapsed, usage.ru_maxrss / 1024, tail


CPU: list[float] = []


def admin(sql: str) -> None:
    import asyncio

    import asyncpg

    async def go() -> None:
        connection = await asyncpg.connect(POSTGRES_ADMIN)
        try:
            await connection.execute(sql)
        finally:
            await connection.close()

    asyncio.run(go())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000",
                        help="messages in the database, comma-separated")
    parser.add_argument("--per-thread", type=int, default=1000)
    parser.add_argument("--workdir", default=None, help="where the files go (default: a "
                        "temporary directory, removed after)")
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="agentstate-copy-bench-"))
    env = {"AGENTSTATE_AUTO_MIGRATE": "true", "AGENTSTATE_LOG_LEVEL": "WARNING"}
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        export = workdir / f"export-{size}.jsonl"
        source = workdir / f"source-{size}.db"
        source.unlink(missing_ok=True)
        write_export(export, size, args.per_thread)
        source_url = f"sqlite+aiosqlite:///{source}"
        imported, import_rss, _ = run(["import", str(export)],
                                      {**env, "AGENTSTATE_DATABASE_URL": source_url})
        export.unlink()
        name = f"agentstate_copy_bench_{uuid.uuid4().hex[:8]}"
        admin(f'CREATE DATABASE "{name}"')
        target = POSTGRES_ADMIN.rsplit("/", 1)[0] + f"/{name}"
        try:
            copied, copy_rss, tail = run(["copy", "--from", source_url, "--to", target,
                                          "--no-verify"], env)
            copy_cpu = CPU[-1]
            threads = -(-size // args.per_thread)
            records = size + 2 * threads
            assert f"threads: {threads} created" in tail, tail
            again, again_rss, tail = run(["copy", "--from", source_url, "--to", target], env)
            assert f"verified: {threads} threads" in tail, tail
        finally:
            admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            source.unlink(missing_ok=True)
        rows.append((size, records, imported, import_rss, copied, copy_rss, copy_cpu, again,
                     again_rss))
        print(f"{size} messages: copy {copied:.1f} s ({records / copied:,.0f} rows/s, "
              f"{copy_cpu:.1f} s CPU), peak RSS {copy_rss:.0f} MiB; load {os.getloadavg()}",
              file=sys.stderr, flush=True)
    print("| messages | rows | import into SQLite | copy to Postgres | rows/s (wall) "
          "| rows per CPU-second | copy peak RSS | copy again + verify | its peak RSS |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (size, records, imported, import_rss, copied, copy_rss, copy_cpu, again,
         again_rss) in rows:
        print(f"| {size:,} | {records:,} | {imported:.1f} s ({records / imported:,.0f} rows/s, "
              f"{import_rss:.0f} MiB) | {copied:.1f} s | {records / copied:,.0f} | "
              f"{records / copy_cpu:,.0f} | {copy_rss:.0f} MiB | {again:.1f} s | "
              f"{again_rss:.0f} MiB |")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
