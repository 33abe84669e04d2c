"""The browser the console's tests drive: Debian's chromium through Playwright, and a
seeded `agentstate serve` to point it at (tests/test_console_browser.py, bench/console.py)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from tests.support import ROOT

# Flags that let chromium run here: no sandbox (root in a container), no GPU, and nothing
# that reaches out to the network on its own.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]
KEY_STORAGE = "agentstate.console.key"


def chromium_path() -> str:
    """Debian's chromium, installed by scripts/ensure-chromium when missing."""
    done = subprocess.run([str(ROOT / "scripts" / "ensure-chromium")], stdout=subprocess.PIPE,
                          text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError("scripts/ensure-chromium could not provide chromium (its message "
                           "is above)")
    return done.stdout.strip().splitlines()[-1]


@contextmanager
def launched() -> Iterator[Any]:
    """One headless chromium (a Playwright `Browser`) for the caller's whole session."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(),
                                             args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()


def keyed_context(browser: Any, token: str | None, **options: Any) -> Any:
    """A fresh browser context (its own sessionStorage) that starts with `token` as the
    console's key, as if the user had pasted it once."""
    context = browser.new_context(**options)
    if token:
        context.add_init_script(f"sessionStorage.setItem({KEY_STORAGE!r}, {token!r})")
    return context


def seed_messages(client: httpx.Client, thread_id: str, count: int, text: str = "message") -> None:
    for start in range(0, count, 100):
        batch = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{text} {i + 1}"}
                 for i in range(start, min(count, start + 100))]
        response = client.post(f"/v1/threads/{thread_id}/messages", json={"messages": batch})
        assert response.status_code == 201, response.text
