"""The audit console's cost to open: page weight, and the time to open a thread
of 100,000 messages against one of 10.

Starts a real `agentstate serve` on a fresh database, fills one thread with `--small`
messages and one with `--large` (batch appends of about 300 characters each), then drives
Debian's chromium (scripts/ensure-chromium) through Playwright:

- page weight: the bytes received (headers and bodies, as the browser counts them) to open
  `/console` on a cold cache, split into the console's own files and the API answers;
- open time: from navigation to the first message on screen, for the messages tab of each
  thread (live updates on, as a user opens it), `--repeats` times each, alternating, in
  fresh pages of one warm context. The number that matters is the ratio: large / small,
  measured in the same run.

    .venv/bin/python bench/console.py --backend sqlite
    .venv/bin/python bench/console.py --backend postgres --large 100000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
TEXT = ("The risk manager reviewed the position and found the exposure acceptable, but asked "
        "for a tighter stop; the technical analyst agreed and noted the RSI divergence on the "
        "hourly chart, while the portfolio manager wanted the sizing capped at five percent "
        "of the book until earnings are out next week, pending review.")
BATCH = 1000


def fill(client: httpx.Client, thread_id: str, count: int) -> None:
    for start in range(0, count, BATCH):
        batch = [{"role": "user" if i % 2 else "assistant", "content": f"{i + 1}: {TEXT}"}
                 for i in range(start, min(count, start + BATCH))]
        response = client.post(f"/v1/threads/{thread_id}/messages", json={"messages": batch})
        response.raise_for_status()
        if start and start % 20_000 == 0:
            print(f"  {thread_id}: {start:,} messages", file=sys.stderr, flush=True)


def weight(browser: Any, url: str) -> dict[str, int]:
    """Bytes received to open `url` in a fresh context (a cold cache)."""
    context = browser.new_context()
    page = context.new_page()
    finished: list[Any] = []
    page.on("requestfinished", lambda request: finished.append(request))
    page.goto(url)
    page.locator("main h1").first.wait_for()
    page.wait_for_load_state("networkidle")
    totals = {"console files": 0, "API": 0, "requests": len(finished)}
    for request in finished:
        sizes = request.sizes()
        received = sizes["responseBodySize"] + sizes["responseHeadersSize"]
        totals["API" if "/v1/" in request.url else "console files"] += received
    context.close()
    return totals


def open_time(context: Any, url: str) -> tuple[float, float]:
    """Seconds from the navigation's start (the page's own clock) to the first message on
    screen, and of those the seconds the page of messages took to arrive (its request's
    resource timing)."""
    page = context.new_page()
    page.goto(url, wait_until="commit")
    page.locator("article.message").first.wait_for()
    elapsed = float(page.evaluate("performance.now()")) / 1000
    fetched = float(page.evaluate(
        "performance.getEntriesByType('resource').filter(e => e.name.includes('/messages?'))"
        ".map(e => e.responseEnd - e.startTime)[0]")) / 1000
    page.close()
    return elapsed, fetched


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--small", type=int, default=10)
    parser.add_argument("--large", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()

    from bench.server import (
        agentstate_server,
        create_postgres_database,
        drop_postgres_database,
        migrate,
    )
    from tests.console_support import launched

    scratch = tempfile.TemporaryDirectory()
    url = (create_postgres_database() if args.backend == "postgres"
           else f"sqlite+aiosqlite:///{Path(scratch.name) / 'console.db'}")
    try:
        migrate(url)
        server = agentstate_server(url, 1)
        server.env.update({"AGENTSTATE_MAX_BATCH_MESSAGES": str(BATCH),
                           "AGENTSTATE_MAX_BODY_BYTES": str(8 * 1024 * 1024)})
        with server, httpx.Client(base_url=server.base_url, timeout=120) as client:
            started = time.perf_counter()
            fill(client, "small", args.small)
            fill(client, "large", args.large)
            print(f"filled in {time.perf_counter() - started:.0f} s", file=sys.stderr)
            console = f"{server.base_url}/console"
            with launched() as browser:
                opened = weight(browser, f"{console}#/threads")
                large_tab = weight(browser, f"{console}#/threads/large/messages?live=0")
                context = browser.new_context()
                open_time(context, f"{console}#/threads/small/messages")  # warm-up
                times: dict[str, list[tuple[float, float]]] = {"small": [], "large": []}
                for i in range(args.repeats):
                    for name in (("small", "large") if i % 2 == 0 else ("large", "small")):
                        times[name].append(
                            open_time(context, f"{console}#/threads/{name}/messages"))
                context.close()
    finally:
        if args.backend == "postgres":
            drop_postgres_database(url)
        scratch.cleanup()

    print(f"## Console ({args.backend}, {args.repeats} opens each, alternating)\n")
    print("| opened | requests | console files | API answers |")
    print("|---|---|---|---|")
    for label, totals in (("/console#/threads (cold cache)", opened),
                          ((f"messages tab of the {args.large:,}-message thread (cold, "
                            "live updates off)"),
                           large_tab)):
        print(f"| {label} | {totals['requests']} | {totals['console files']:,} B | "
              f"{totals['API']:,} B |")
    def median(name: str, which: int) -> float:
        return statistics.median(t[which] for t in times[name])

    print("\n| thread | open: navigation to first message, median | p90 | of which the "
          "page of messages, median |")
    print("|---|---|---|---|")
    for name, size in (("small", args.small), ("large", args.large)):
        ordered = sorted(t[0] for t in times[name])
        print(f"| {size:,} messages | {median(name, 0) * 1000:.0f} ms | "
              f"{ordered[int(len(ordered) * 0.9) - 1] * 1000:.0f} ms | "
              f"{median(name, 1) * 1000:.0f} ms |")
    print(f"\nratio large/small: open {median('large', 0) / median('small', 0):.2f}, "
          f"page of messages {median('large', 1) / median('small', 1):.2f}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
