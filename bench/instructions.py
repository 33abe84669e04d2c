"""Instructions per request, counted by valgrind's callgrind: bench.cpu_inproc's operations
(the ASGI application `agentstate serve` builds, called in-process, four requests in flight)
against bench/minimal_app.py's bare get thread, on one Postgres database. A machine's load
hardly moves an instruction count, so a change of a few percent shows between two builds
where CPU time swings by a quarter (docs/PERFORMANCE.md); it is not time: a cache miss or a
system call costs more than its instructions say. A write's count includes its share of
the feed's sequencing passes, which run by the clock, so it moves between runs: compare
builds run one after the other with the same options.

    .venv/bin/python -m bench.instructions [--requests 200] [--store] [--checkpoints]
                                           [--messages] [--lists]

Needs valgrind (Debian's package `valgrind`). The application runs under callgrind (about
fifty times slower: a minute or two in all); every operation is warmed up, then counted
between two dumps that `callgrind_control` asks of the running process, around `--requests`
requests. Prints instructions per request and the ratio to the floor.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.cpu_inproc import Slot, lifespan, load, setup
from bench.server import ROOT, create_postgres_database, drop_postgres_database, libpq_dsn, migrate

_TOTALS = re.compile(r"^(?:summary|totals): (\d+)", re.MULTILINE)


async def _dump(directory: Path) -> int:
    """Ask callgrind for a dump of the counts since the last one (it resets them) and return
    the instructions in it, once the file is written."""
    before = set(directory.iterdir())
    asker = await asyncio.create_subprocess_exec(
        "callgrind_control", "--dump", str(os.getpid()),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # callgrind acts on the request while this process runs: keep running until it has.
    while True:
        new = [path for path in set(directory.iterdir()) - before
               if _TOTALS.search(path.read_text(errors="replace"))]
        if new:
            break
        await asyncio.sleep(0.02)
    await asker.wait()
    found = _TOTALS.search(new[0].read_text(errors="replace"))
    assert found is not None
    return int(found.group(1))


async def _inner(args: argparse.Namespace, directory: Path) -> None:
    from app.main import serve_app
    from bench import minimal_app

    ours, floor = serve_app(), minimal_app.create_app()
    stop_ours, stop_floor = await lifespan(ours), await lifespan(floor)
    try:
        run = time.strftime("%H%M%S")
        slots = [await setup(ours, run, i, store=bool(args.store),
                             checkpoints=bool(args.checkpoints), messages=bool(args.messages))
                 for i in range(4)]
        own = [await setup(ours, run + "r", i) for i in range(4)]
        ops = ["get_thread", "floor", "state_replace", "append_1", *args.store,
               *args.checkpoints, *args.messages, *args.lists]
        counts: dict[str, float] = {}
        for op in ops:
            app = floor if op == "floor" else ours
            chosen: list[Slot] = own if op == "state_replace" else slots
            await load(app, op, chosen, 40)
            await _dump(directory)
            await load(app, op, chosen, args.requests, warm=0)
            counts[op] = await _dump(directory) / args.requests
    finally:
        await stop_ours()
        await stop_floor()
    for op, count in counts.items():
        print(f"{op:14} {count / 1000:9.0f} thousand instructions  "
              f"ratio to the floor: {count / counts['floor']:.2f}x", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--store", action="store_const", default=[],
                        const=["store_get", "store_put", "store_search"])
    parser.add_argument("--checkpoints", action="store_const", default=[],
                        const=["cp_latest", "cp_batch"])
    parser.add_argument("--messages", action="store_const", default=[],
                        const=["messages_page"])
    parser.add_argument("--lists", action="store_const", default=[], const=["threads_list"])
    parser.add_argument("--inner", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        asyncio.run(_inner(args, Path(args.inner)))
        return
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("bench.instructions needs valgrind: apt-get install valgrind")
    url = create_postgres_database()
    try:
        migrate(url)
        env = {**os.environ, "AGENTSTATE_DATABASE_URL": url, "AGENTSTATE_AUTO_MIGRATE": "false",
               "AGENTSTATE_LOG_LEVEL": "WARNING", "AGENTSTATE_BENCH_DSN": libpq_dsn(url)}
        with tempfile.TemporaryDirectory() as directory:
            subprocess.run(
                ["valgrind", "--tool=callgrind", "--dump-instr=no", "--collect-jumps=no",
                 f"--callgrind-out-file={directory}/callgrind.out.%p", "--quiet",
                 sys.executable, "-m", "bench.instructions", "--inner", directory,
                 *sys.argv[1:]], cwd=ROOT, env=env, check=True)
    finally:
        drop_postgres_database(url)


if __name__ == "__main__":
    main()
