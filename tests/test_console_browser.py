"""The audit console in a real browser: Debian's chromium, driven by Playwright,
against a real `agentstate serve` on each backend with a seeded database.

Every page a test opens listens for dialogs (a hostile value that ran `alert`), uncaught
errors, console errors and Content-Security-Policy violations: any of them fails the test.
Screenshots of each view go to docs/console/ (taken on SQLite; docs/console.md shows them).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from agentstate_client.ids import encode_id
from playwright.sync_api import expect

from app.core.secretbox import new_key
from tests.console_support import keyed_context, launched, seed_messages
from tests.support import ROOT, ServerProcess, bearer, create_key

pytestmark = pytest.mark.slow

SHOTS = ROOT / "docs" / "console"
MAIN = "support-42"
FORK = "support-42-retry"
HOSTILE = "hostile"
FOREIGN = "other-tenant-thread"
LIVE = "live-tail"
BIG = "x" * (10 * 1024 * 1024)
SECRET = "s3cr3t-token-value-7f1c"
DEEP: dict[str, Any] = {"leaf": "bottom"}
for _level in range(50):
    DEEP = {f"level{_level}": DEEP}
U42 = ("users", "u/42")  # a label holding "/": written u@2F42 in URLs
EVIL_LABEL = "<script>alert(9)</script>\u202eu/1"
EVIL_KEY = "<script>alert(10)</script>"
WATCH_CSP = """
window.__violations = [];
document.addEventListener("securitypolicyviolation",
  (e) => window.__violations.push(e.violatedDirective + " " + (e.blockedURI || "inline")));
"""


class Site:
    def __init__(self, server: ServerProcess, backend: str, key_a: str, key_b: str) -> None:
        self.server, self.backend, self.key_a, self.key_b = server, backend, key_a, key_b
        self.url = f"{server.base_url}/console"
        self.api = httpx.Client(base_url=server.base_url, headers=bearer(key_a), timeout=60)


def _put(api: httpx.Client, path: str, body: dict[str, Any], revision: int | None) -> None:
    headers = {"If-Match": f'"{revision}"'} if revision else {"If-None-Match": "*"}
    response = api.put(path, json=body, headers=headers)
    assert response.status_code in (200, 201), response.text


def seed(site: Site) -> None:
    api = site.api
    thread = f"/v1/threads/{MAIN}"
    _put(api, thread, {"state": {"step": "triage", "attempts": 0, "plan": ["search"]},
                       "metadata": {"team": "support", "tier": "gold"}}, None)
    _put(api, thread, {"state": {"step": "answer", "attempts": 1, "plan": ["search", "book"]},
                       "metadata": {"team": "support", "tier": "gold"}}, 1)
    response = api.patch(thread, json={"state": {"plan": None, "result": {"ok": True}},
                                       "metadata": {"tier": "platinum"}},
                         headers={"If-Match": '"2"'})
    assert response.status_code == 200, response.text
    seed_messages(api, MAIN, 120, "turn")
    page = api.get(f"{thread}/messages", params={"limit": 3, "after_seq": 9}).json()["data"]
    response = api.post(f"{thread}/compactions", json={
        "source_message_ids": [m["id"] for m in page],
        "summary": {"role": "system", "content": "Summary: the user asked about flights."},
        "reason": "context window", "model": "summariser-1"})
    assert response.status_code == 201, response.text
    removed = api.post(f"{thread}/messages:remove", json={"last": 1})
    assert removed.status_code == 200 and removed.json()["data"][0]["content"] == "turn 120"
    redacted = api.get(f"{thread}/messages", params={"limit": 1, "after_seq": 49}).json()["data"][0]
    response = api.patch(f"{thread}/messages/{redacted['id']}", json={"content": "[redacted]"})
    assert response.status_code == 200, response.text
    _put(api, f"{thread}/agents/planner/state", {"state": {"cursor": 2, "todo": ["pay"]}}, None)
    response = api.post(f"{thread}/fork", json={"thread_id": FORK, "revision": 2})
    assert response.status_code == 201, response.text
    checkpoint = {"v": 4, "ts": "2026-11-30T12:00:00+00:00", "versions_seen": {},
                  "channel_versions": {"messages": "1"}, "updated_channels": ["messages"]}
    value = [{"channel": "messages", "version": "1", "type": "agentstate.list",
              "items": [{"type": "msgpack", "data": "kQ=="}]}]
    for ns, cid, parent in (("", "ckpt-0001", None), ("", "ckpt-0002", "ckpt-0001"),
                            ("subgraph", "ckpt-0003", None)):
        response = api.post(f"{thread}/checkpoints", json={
            "checkpoint_ns": ns, "checkpoint_id": cid, "parent_checkpoint_id": parent,
            "checkpoint": checkpoint, "metadata": {"source": "loop", "step": int(cid[-1])},
            "values": value})
        assert response.status_code == 201, response.text
    response = api.post(f"{thread}/checkpoints/ckpt-0002/writes", json={
        "checkpoint_ns": "", "task_id": "task-7", "task_path": "~__pregel_pull, agent",
        "writes": [{"idx": 0, "channel": "messages", "type": "msgpack", "data": "kQ=="}]})
    assert response.status_code == 200, response.text
    for i in range(30):  # a search that needs two pages
        _put(api, f"/v1/threads/batch-{i:02d}", {"state": {"i": i},
                                                  "metadata": {"batch": "paging"}}, None)
    response = api.put("/v1/mcp-servers/search-broker", headers={"If-None-Match": "*"}, json={
        "server_type": "broker", "state": {"session": "s-1", "tools": ["search", "fetch"]},
        "secrets": {"token": SECRET}, "last_connected_at": datetime.now(UTC).isoformat()})
    assert response.status_code == 201, response.text

    hostile = "<img src=x onerror=alert(1)><script>alert(2)</script>"
    _put(api, f"/v1/threads/{HOSTILE}", {
        "state": {"html": hostile, "link": "javascript:alert(3)", hostile: "key with html",
                  "bidi": "abc\u202edcba\u2066x\u2069", "big": BIG, "deep": DEEP},
        "metadata": {"<b onmouseover=alert(4)>": "javascript:alert(5)"}}, None)
    response = api.post(f"/v1/threads/{HOSTILE}/messages", json={"messages": [
        {"role": "<svg onload=alert(6)>", "content": hostile, "name": "\u202eevil",
         "metadata": {"<script>": "</script><script>alert(7)</script>"}},
        {"role": "user", "content": [{"type": "text", "text": hostile, "url": "javascript:alert(8)"}]},
    ]})
    assert response.status_code == 201, response.text
    seed_messages(api, LIVE, 3, "before")
    other = httpx.Client(base_url=site.server.base_url, headers=bearer(site.key_b))
    _put(other, f"/v1/threads/{FOREIGN}", {"state": {"secret": "tenant b"}}, None)
    seed_store(api, other)


def item_url(namespace: tuple[str, ...], key: str) -> str:
    """A store item's path, its labels and key encoded as API.md section 7b says."""
    return "/v1/store/items/" + "/".join(encode_id(label) for label in (*namespace, key))


def memory_hash(namespace: tuple[str, ...], key: str | None = None) -> str:
    """The console's link to a namespace (or an item): the API's spelling as one segment."""
    path = quote("/".join(encode_id(label) for label in namespace), safe="")
    return f"#/memory/ns/{path}" + (f"/{quote(encode_id(key), safe='')}" if key else "")


def seed_store(api: httpx.Client, other: httpx.Client) -> None:
    """Memory items of tenant a (one hostile, one big), and tenant b's under the same names."""
    notes = [f"note {i}: " + "lorem ipsum " * 40 for i in range(300)]  # about 150 KB
    for client, namespace, key, body in (
        (api, (*U42, "prefs"), "theme", {"value": {"kind": "pref", "text": "Prefers dark mode and short answers"}, "ttl_seconds": 86400}),
        (api, ("users", "u7", "prefs"), "theme", {"value": {"kind": "pref", "text": "Prefers light mode"}}),
        (api, (*U42, "memories"), "trip-lisbon", {"value": {"kind": "episode", "text": "Booked a flight to Lisbon"}}),
        (api, (*U42, "memories"), "digest", {"value": {"kind": "digest", "notes": notes}, "index": False}),
        (api, (EVIL_LABEL, "a.b/c"), EVIL_KEY, {"value": {
            "kind": "pref", "text": "dark hostile", "link": "javascript:alert(13)",
            "html": "<script>alert(11)</script><img src=x onerror=alert(12)>"}}),
        (other, (*U42, "prefs"), "tenant-b-secret", {"value": {"kind": "pref", "text": "dark mode of tenant b"}}),
        (other, ("tenant-b-only",), "x", {"value": {"kind": "pref"}}),
    ):
        _put(client, item_url(namespace, key), body, None)
    for i in range(27):  # a namespace of two pages
        _put(api, item_url(("paging",), f"note-{i:02d}"), {"value": {"i": i}}, None)


@pytest.fixture(scope="module")
def site(secured_database_url: str) -> Iterator[Site]:
    """One server per backend, with keys (tenant a and tenant b) and the seeded data."""
    key_a = create_key(secured_database_url, "tenant-a", "read,write", "console")
    key_b = create_key(secured_database_url, "tenant-b", "read,write", "other")
    env = {"AGENTSTATE_SECRET_KEYS": new_key(), "AGENTSTATE_MAX_BODY_BYTES": str(16 * 1024 * 1024)}
    with ServerProcess(secured_database_url, env=env) as server:
        backend = "sqlite" if secured_database_url.startswith("sqlite") else "postgres"
        built = Site(server, backend, key_a, key_b)
        seed(built)
        yield built


@pytest.fixture(scope="module")
def browser(site: Site) -> Iterator[Any]:
    """One chromium per module instance, started after the server and the seeding: the
    Playwright sync API runs an event loop in this thread while it is open, so the fixtures
    that call asyncio.run (the databases) must be done first."""
    with launched() as launched_browser:
        yield launched_browser


class Watched:
    """A page whose dialogs, uncaught errors, console errors and CSP violations are kept."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.problems: list[str] = []
        self.allowed: list[str] = []  # console errors a test expects (a 404 it asked for)
        self.requests: list[Any] = []
        page.on("dialog", self._dialog)
        page.on("pageerror", lambda error: self.problems.append(f"page error: {error}"))
        page.on("console", self._console)
        page.on("request", lambda request: self.requests.append(request))

    def _dialog(self, dialog: Any) -> None:
        self.problems.append(f"a dialog opened: {dialog.message!r}")
        dialog.dismiss()

    def _console(self, message: Any) -> None:
        if message.type == "error" and not any(a in message.text for a in self.allowed):
            self.problems.append(f"console error: {message.text}")

    def check(self) -> None:
        violations = self.page.evaluate("window.__violations || []")
        assert not violations, violations
        assert not self.problems, self.problems


@pytest.fixture
def open_page(browser: Any, site: Site) -> Iterator[Callable[..., Watched]]:
    """Opens console pages with tenant a's key (or another, or none); checks each at the end."""
    opened: list[tuple[Any, Watched]] = []

    def open_(hash_: str = "#/threads", *, token: str | None = site.key_a,
              width: int = 1280) -> Watched:
        context = keyed_context(browser, token, viewport={"width": width, "height": 900})
        context.add_init_script(WATCH_CSP)
        watched = Watched(context.new_page())
        opened.append((context, watched))
        watched.page.goto(site.url + hash_)
        return watched

    yield open_
    try:
        for _, watched in opened:
            watched.check()
    finally:
        for context, _ in opened:
            context.close()


def shot(site: Site, watched: Watched, name: str, full: bool = False) -> None:
    """A screenshot for docs/console.md (one backend's: they look the same)."""
    if site.backend == "sqlite":
        SHOTS.mkdir(parents=True, exist_ok=True)
        watched.page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=full)


def texts(page: Any, selector: str) -> list[str]:
    return [t.strip() for t in page.locator(selector).all_text_contents()]


def test_a_key_is_asked_for_and_kept_out_of_urls_and_the_page(site: Site, open_page: Callable[..., Watched]) -> None:
    watched = open_page("#/threads", token=None)
    watched.allowed.append("401")
    page = watched.page
    page.get_by_role("heading", name="API key").wait_for()
    assert page.locator("table").count() == 0
    shot(site, watched, "key")
    page.get_by_label("Key").fill(site.key_a)
    page.get_by_role("button", name="Use this key").click()
    page.get_by_role("heading", name="Threads").wait_for()
    page.get_by_role("link", name=LIVE, exact=True).wait_for()  # the newest thread
    assert page.evaluate("sessionStorage.getItem('agentstate.console.key')") == site.key_a
    assert site.key_a not in page.content()
    api = [r for r in watched.requests if "/v1/" in r.url]
    assert api and all(site.key_a not in r.url for r in watched.requests)
    assert api[-1].headers.get("authorization") == f"Bearer {site.key_a}"
    page.get_by_role("button", name="Forget key").click()
    assert page.evaluate("sessionStorage.getItem('agentstate.console.key')") is None


def test_a_foreign_tenants_thread_is_a_404_page(site: Site, open_page: Callable[..., Watched]) -> None:
    watched = open_page(f"#/threads/{FOREIGN}")
    watched.allowed.append("404")
    page = watched.page
    page.get_by_role("heading", name="404 · Not found").wait_for()
    assert "tenant b" not in page.content()
    shot(site, watched, "not-found")
    # Tenant b's own key reads it.
    mine = open_page(f"#/threads/{FOREIGN}", token=site.key_b)
    mine.page.get_by_role("heading", name=FOREIGN).wait_for()


def test_threads_are_searched_by_metadata_and_id_and_paged(site: Site, open_page: Callable[..., Watched]) -> None:
    watched = open_page(f"#/threads?order_by=updated_at&thread_id={MAIN},batch-00,batch-29")
    page = watched.page
    page.get_by_role("heading", name="Threads").wait_for()
    assert texts(page, "tbody tr td:first-child") == ["batch-29", "batch-00", MAIN]  # by activity
    page.goto(f"{site.url}#/threads")
    page.get_by_role("link", name=LIVE, exact=True).wait_for()  # newest created first
    shot(site, watched, "threads")
    page.get_by_label("Metadata contains").fill('{"batch": "paging"}')
    page.get_by_role("button", name="Search").click()
    expect(page.locator("tbody tr")).to_have_count(25)
    one = texts(page, "tbody tr td:first-child")
    page.get_by_role("link", name="Next page →").click()
    expect(page.locator("tbody tr")).to_have_count(5)
    two = texts(page, "tbody tr td:first-child")
    assert sorted(one + two) == [f"batch-{i:02d}" for i in range(30)]
    assert page.get_by_role("link", name="Next page →").count() == 0
    page.go_back()
    expect(page.locator("tbody tr")).to_have_count(25)
    page.get_by_label("Metadata contains").fill("")
    page.get_by_label("Thread id").fill(f"{FORK}, {MAIN}")
    page.get_by_role("button", name="Search").click()
    expect(page.locator("tbody tr")).to_have_count(2)
    assert sorted(texts(page, "tbody tr td:first-child")) == [MAIN, FORK]


def test_state_and_the_diff_between_two_revisions(site: Site, open_page: Callable[..., Watched]) -> None:
    watched = open_page(f"#/threads/{MAIN}")
    page = watched.page
    page.get_by_role("heading", name="State", exact=True).wait_for()
    assert "platinum" in page.locator(".two").inner_text()
    shot(site, watched, "thread-state")
    page.goto(f"{site.url}#/threads/{MAIN}/revisions?a=1&b=3")
    page.get_by_role("heading", name=re.compile(r"Revision 1 → 3")).wait_for()
    rows = page.locator(".diff tbody tr")
    got = [(r.locator("td").nth(0).inner_text(), r.locator("td").nth(1).inner_text(),
            " ".join(r.locator("td").nth(2).inner_text().split()),
            " ".join(r.locator("td").nth(3).inner_text().split())) for r in rows.all()]
    assert got == [
        ("/state/step", "changed", "“triage”", "“answer”"),
        ("/state/attempts", "changed", "0", "1"),
        ("/state/result", "added", "—", "{ ok: true }"),
        ("/state/plan", "removed", "[ 0: “search” ]", "—"),
        ("/metadata/tier", "changed", "“gold”", "“platinum”"),
    ]
    shot(site, watched, "revision-diff")
    # The diff of two neighbours, from the list's link; a shareable URL either way.
    page.get_by_role("link", name="diff with 2").click()
    page.get_by_role("heading", name=re.compile(r"Revision 2 → 3: 3 changes")).wait_for()
    assert page.url.endswith("#/threads/support-42/revisions?a=2&b=3")


def test_the_timeline_pages_folds_compactions_and_marks_removals(site: Site, open_page: Callable[..., Watched]) -> None:
    watched = open_page(f"#/threads/{MAIN}/messages?live=0")
    page = watched.page
    page.locator("article.message").first.wait_for()
    cards = page.locator(".timeline > article.message")
    assert cards.count() == 50
    assert cards.last.locator(".seq").inner_text() == "#119"  # turn 120 (seq 120) was removed
    page.locator(".marker.removed").wait_for()
    assert "turn 120" not in page.content()
    shot(site, watched, "timeline")
    for expected in (100, 117):  # 116 live messages + the summary, in three pages
        page.get_by_role("button", name="Load older messages").click()
        expect(page.locator(".timeline > .message")).to_have_count(expected)
    assert page.get_by_role("button", name="Load older messages").is_hidden()
    seqs = [int(s.lstrip("#")) for s in texts(page, ".timeline > article.message > header .seq")]
    assert seqs[:12] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 121, 13, 14]  # 10-12 behind the summary
    summary = page.locator("article.message", has_text="Summary: the user asked")
    summary.locator("details.fold > summary").click()
    summary.locator("article.message").nth(2).wait_for()
    assert texts(page, "article.message article.message .content") == ["turn 10", "turn 11", "turn 12"]
    redacted = page.locator("article.message[data-seq='50']")
    assert "[redacted]" in redacted.inner_text() and redacted.locator(".marker.redacted").count() == 1
    # The full view folds the compacted run in place, before its summary.
    page.goto(f"{site.url}#/threads/{MAIN}/messages?view=full&live=0")
    for expected in (100, 120):  # 116 live, 3 compacted, the summary
        page.get_by_role("button", name="Load older messages").click()
        expect(page.locator(".timeline > .message, .timeline > .fold .message")).to_have_count(expected)
    fold = page.locator("details.fold.compacted")
    assert fold.locator("summary").inner_text().startswith("3 compacted messages")


def test_the_live_tail_shows_what_is_written_after_the_page_opened(site: Site, open_page: Callable[..., Watched]) -> None:
    events = open_page(f"#/threads/{LIVE}/events")
    messages = open_page(f"#/threads/{LIVE}/messages")
    feed = open_page("#/events?type=message.appended")
    for watched in (events, messages, feed):
        watched.page.locator(".live-state.on").wait_for()
    before = events.page.locator("tbody tr").count()
    marker = f"written after the page opened {time.time_ns()}"
    response = site.api.post(f"/v1/threads/{LIVE}/messages", json={"role": "user", "content": marker})
    assert response.status_code == 201, response.text
    messages.page.locator("article.message", has_text=marker).wait_for()
    expect(events.page.locator("tbody tr")).to_have_count(before + 1)
    newest = events.page.locator("tbody tr").first
    assert "message.appended" in newest.inner_text()
    feed.page.locator("tbody tr").first.filter(has_text=LIVE).wait_for()
    shot(site, events, "thread-events")
    shot(site, feed, "feed")
    # An event's own page, reached from the row's link: a shareable URL.
    seq = newest.get_attribute("data-seq")
    newest.get_by_role("link", name=seq, exact=True).click()
    events.page.get_by_role("heading", name=f"Event {seq}").wait_for()
    assert events.page.url.endswith(f"#/events/{seq}")


def test_agent_states_compactions_checkpoints_and_lineage(site: Site, open_page: Callable[..., Watched]) -> None:
    watched = open_page(f"#/threads/{MAIN}/agents")
    page = watched.page
    page.get_by_role("heading", name="planner").wait_for()
    shot(site, watched, "agents")
    page.goto(f"{site.url}#/threads/{MAIN}/compactions")
    page.get_by_text("Summary: the user asked about flights.").wait_for()
    page.get_by_text("Show the 3 messages it replaced").click()
    page.locator("details.fold article.message").nth(2).wait_for()
    shot(site, watched, "compactions")
    page.goto(f"{site.url}#/threads/{MAIN}/checkpoints")
    page.locator("tbody tr").nth(2).wait_for()
    assert texts(page, "tbody tr td:first-child") == ["ckpt-0003", "ckpt-0002", "ckpt-0001"]
    shot(site, watched, "checkpoints")
    page.get_by_label("Namespace", exact=True).fill("subgraph")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("tbody tr")).to_have_count(1)
    page.goto(f"{site.url}#/threads/{MAIN}/checkpoints/ckpt-0002?ns=")
    page.get_by_role("heading", name="Checkpoint ckpt-0002").wait_for()
    assert "task-7" in page.locator("table").nth(1).inner_text()  # its pending write
    page.get_by_role("link", name="ckpt-0001").click()  # the parent link
    page.get_by_role("heading", name="Checkpoint ckpt-0001").wait_for()
    shot(site, watched, "checkpoint")
    page.goto(f"{site.url}#/threads/{FORK}/lineage")
    page.get_by_text("Made by a fork at revision").wait_for()
    shot(site, watched, "lineage")


def test_a_fork_links_to_its_source_and_the_source_lists_its_forks(site: Site, open_page: Callable[..., Watched]) -> None:
    watched = open_page(f"#/threads/{FORK}")
    page = watched.page
    origin = page.locator("p.forked-from")
    expect(origin).to_have_text(f"Forked from {MAIN} at revision 2")
    origin.get_by_role("link", name="revision 2").click()  # the source as it was then
    page.get_by_role("heading", name=re.compile(r"At revision 2 ")).wait_for()
    assert page.url.endswith(f"#/threads/{MAIN}/revisions?show=2")
    assert page.locator("p.forked-from").count() == 0, "the source is no fork"
    page.get_by_role("link", name="Lineage", exact=True).click()
    forks = page.locator("table", has=page.get_by_role("columnheader", name="Fork", exact=True))
    expect(forks.locator("tbody tr")).to_have_count(1)
    shot(site, watched, "forks")
    assert " ".join(forks.locator("tbody tr").inner_text().split()[:2]) == f"{FORK} 2"
    forks.get_by_role("link", name=FORK, exact=True).click()
    page.get_by_role("heading", name=FORK).wait_for()
    assert page.url.endswith(f"#/threads/{FORK}")


def test_mcp_servers_never_show_or_ask_for_secrets(site: Site, open_page: Callable[..., Watched]) -> None:
    watched = open_page("#/mcp-servers")
    page = watched.page
    page.get_by_role("link", name="search-broker").click()
    page.get_by_role("heading", name="search-broker").wait_for()
    assert "token" in page.inner_text("dl") and SECRET not in page.content()
    assert not [r.url for r in watched.requests if "include_secrets" in r.url]
    shot(site, watched, "mcp-server")


def test_hostile_values_render_inert_and_legible(site: Site, open_page: Callable[..., Watched]) -> None:
    watched = open_page(f"#/threads/{HOSTILE}")
    page = watched.page
    page.get_by_role("heading", name="State", exact=True).wait_for()
    state = page.locator(".two section").first
    assert "<img src=x onerror=alert(1)><script>alert(2)</script>" in state.inner_text()
    assert "U+202E" in state.inner_text() and "U+2066" in state.inner_text()
    assert "10.0 MB in all" in state.inner_text()
    assert len(page.evaluate("document.body.innerText")) < 100_000
    assert page.locator("details[open] details[open] details[open] details[open]").count() == 0
    shot(site, watched, "hostile")
    page.goto(f"{site.url}#/threads/{HOSTILE}/messages?live=0")
    page.locator("article.message").nth(1).wait_for()
    assert "<svg onload=alert(6)>" in page.locator("article.message").first.inner_text()
    page.goto(f"{site.url}#/threads?order_by=updated_at")
    page.locator("tbody tr").first.wait_for()
    for view in (f"#/threads/{HOSTILE}", f"#/threads/{HOSTILE}/messages?view=full&live=0"):
        page.goto(site.url + view)
        page.locator(".tab-body > *").first.wait_for()
        page.locator("details:not([open]) > summary").evaluate_all("els => els.forEach(e => e.click())")
        # Nothing the agent stored became markup: only the console's own elements, links,
        # scripts and handlers exist.
        assert page.evaluate("""() => [
          document.querySelectorAll('img, svg, iframe, object, embed, b, form:not(.filters):not(.key-form)').length,
          [...document.scripts].filter(s => !s.src.endsWith('/console/assets/main.js')).length,
          [...document.querySelectorAll('*')].filter(e => [...e.attributes].some(a => a.name.startsWith('on'))).length,
          [...document.querySelectorAll('a')].filter(a => !a.getAttribute('href').startsWith('#')).length,
        ]""") == [0, 0, 0, 0]


def test_csp_violations_are_blocked_and_reported(site: Site, open_page: Callable[..., Watched]) -> None:
    watched = open_page("#/threads")
    page = watched.page
    page.get_by_role("heading", name="Threads").wait_for()
    # The policy forbids a string reaching innerHTML (Trusted Types) and any other origin.
    refused = page.evaluate("""() => { try { document.body.innerHTML = '<b>x</b>'; return false; }
                                       catch (e) { return e instanceof TypeError; } }""")
    assert refused
    page.evaluate("""() => { const i = document.createElement('img');
                             i.src = 'http://example.invalid/x.png'; document.body.append(i); }""")
    deadline = time.monotonic() + 10
    while page.evaluate("window.__violations.length") < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    violations = page.evaluate("window.__violations")
    assert any(v.startswith("require-trusted-types-for") for v in violations), violations
    assert any(v.startswith("img-src") for v in violations), violations
    assert any("Content-Security-Policy violation" in p for p in watched.problems), watched.problems
    watched.problems.clear()
    page.evaluate("window.__violations.length = 0")


def test_keyboard_and_narrow_screens(site: Site, open_page: Callable[..., Watched]) -> None:
    watched = open_page(f"#/threads/{MAIN}/revisions", width=390)
    page = watched.page
    page.get_by_role("heading", name=re.compile(r"Revision 2 → 3")).wait_for()
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    shot(site, watched, "narrow-revisions", full=True)
    page.goto(f"{site.url}#/threads")
    page.get_by_role("heading", name="Threads").wait_for()
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    # "/" jumps to the search field; Enter searches; Tab reaches the first thread link.
    page.keyboard.press("/")
    page.keyboard.type(MAIN)
    page.keyboard.press("Enter")
    expect(page.locator("tbody tr")).to_have_count(1)
    link = page.get_by_role("link", name=MAIN, exact=True)
    focused = "e => e === document.activeElement"
    for _ in range(20):
        page.keyboard.press("Tab")
        if link.evaluate(focused):
            break
    assert link.evaluate(focused), page.evaluate("document.activeElement.outerHTML.slice(0, 200)")
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(rf"#/threads/{MAIN}$"))
    page.get_by_role("heading", name=MAIN).wait_for()
    assert link.count() == 0


INERT = """() => [
  document.querySelectorAll('img, svg, iframe, object, embed, b, form:not(.filters):not(.key-form)').length,
  [...document.scripts].filter(s => !s.src.endsWith('/console/assets/main.js')).length,
  [...document.querySelectorAll('*')].filter(e => [...e.attributes].some(a => a.name.startsWith('on'))).length,
  [...document.querySelectorAll('a')].filter(a => !a.getAttribute('href').startsWith('#')).length,
]"""


def test_memory_namespaces_items_search_and_an_item(site: Site, open_page: Callable[..., Watched]) -> None:
    watched = open_page("#/memory")
    page = watched.page
    page.get_by_role("heading", name="Memory", exact=True).wait_for()
    rows = page.locator("tbody tr")
    expect(rows).to_have_count(5)  # tenant a's namespaces, in label order
    assert "<script>alert(9)</script>" in rows.first.inner_text() and "U+202E" in rows.first.inner_text()
    assert [r.locator(".ns-label").all_inner_texts() for r in rows.all()][1:] == [
        ["paging"], [*U42, "memories"], [*U42, "prefs"], ["users", "u7", "prefs"]]
    assert "tenant-b-only" not in page.content()
    shot(site, watched, "memory")
    # A prefix of labels, one holding "/": typed as JSON; the link is the API's spelling.
    page.get_by_label("Namespace starts with").fill('["users", "u/42"]')
    page.get_by_role("button", name="Filter").click()
    expect(rows).to_have_count(2)
    page.get_by_role("link", name=re.compile("memories")).click()
    page.get_by_role("heading", name=re.compile("memories")).wait_for()
    assert page.url.endswith(memory_hash((*U42, "memories")))
    assert texts(page, "tbody tr td:first-child") == ["digest", "trip-lisbon"]  # newest first
    shot(site, watched, "memory-namespace")
    # The big value: its array folded, with its size.
    page.get_by_role("link", name="digest", exact=True).click()
    page.get_by_role("heading", name="digest").wait_for()
    value = page.locator(".json")
    assert re.search(r"300 items, 1\d\d\.\d KB", value.inner_text()), value.inner_text()
    assert value.locator("details[open] details").count() == 1
    assert value.locator("details[open] details[open]").count() == 0
    assert "never" in page.locator("dl").inner_text()  # expires_at null
    # Lexical search with a filter: the two-word match first, each with its score; the
    # episode that names Lisbon is filtered out, tenant b's match is not there.
    page.goto(f"{site.url}#/memory")
    page.get_by_label("Search text").fill("dark mode Lisbon")
    page.get_by_label("Filter (JSON)").fill('{"kind": "pref"}')
    page.get_by_role("button", name="Search").click()
    page.get_by_role("heading", name="Search memory").wait_for()
    expect(rows).to_have_count(3)
    assert sorted(texts(page, "tbody tr td:first-child")) == sorted([EVIL_KEY, "theme", "theme"])
    assert rows.first.locator(".ns-label").all_inner_texts() == [*U42, "prefs"]
    assert [float(score) > 0 for score in texts(page, "tbody td.score")] == [True] * 3
    assert "tenant b" not in page.content()
    shot(site, watched, "memory-search")
    # An item: facts and value, its hash a shareable link; nothing hostile became markup.
    rows.first.get_by_role("link", name="theme").click()
    page.get_by_role("heading", name="theme").wait_for()
    facts = page.locator("dl").inner_text()
    assert re.search(r"Revision\s+1\s", facts) and "86,400 s after its last write" in facts
    assert "Prefers dark mode and short answers" in page.locator(".json").inner_text()
    assert page.url.endswith(memory_hash((*U42, "prefs"), "theme"))
    shot(site, watched, "memory-item")
    hostile = open_page(memory_hash((EVIL_LABEL, "a.b/c"), EVIL_KEY))
    page = hostile.page
    page.get_by_role("heading", name=EVIL_KEY).wait_for()
    assert "javascript:alert(13)" in page.locator(".json").inner_text()
    assert "U+202E" in page.locator(".crumbs").inner_text()
    assert page.evaluate(INERT) == [0, 0, 0, 0]
    page.goto(f"{site.url}#/memory/search?q=hostile")
    page.get_by_role("link", name=EVIL_KEY).wait_for()
    assert page.evaluate(INERT) == [0, 0, 0, 0]


def test_memory_items_are_paged(site: Site, open_page: Callable[..., Watched]) -> None:
    watched = open_page(memory_hash(("paging",)))
    page = watched.page
    rows = page.locator("tbody tr")
    expect(rows).to_have_count(25)
    one = texts(page, "tbody tr td:first-child")
    page.get_by_role("link", name="Next page →").click()
    expect(rows).to_have_count(2)
    two = texts(page, "tbody tr td:first-child")
    assert one + two == [f"note-{i:02d}" for i in reversed(range(27))]  # newest first, no gap
    assert page.get_by_role("link", name="Next page →").count() == 0
    page.get_by_role("link", name="← Previous page").click()
    expect(rows).to_have_count(25)
    assert texts(page, "tbody tr td:first-child") == one


def test_memory_of_another_tenant_is_not_shown(site: Site, open_page: Callable[..., Watched]) -> None:
    foreign = memory_hash((*U42, "prefs"), "tenant-b-secret")
    watched = open_page(foreign)
    watched.allowed.append("404")
    page = watched.page
    page.get_by_role("heading", name="404 · Not found").wait_for()
    assert "tenant b" not in page.content()
    page.goto(f"{site.url}#/memory/search?q=tenant")
    page.get_by_text("Nothing matches.").wait_for()
    # Tenant b's own key reads it, and sees only its own namespaces.
    mine = open_page(foreign, token=site.key_b)
    mine.page.get_by_role("heading", name="tenant-b-secret").wait_for()
    mine.page.goto(f"{site.url}#/memory")
    expect(mine.page.locator("tbody tr")).to_have_count(2)


def test_open_mode_on_loopback_needs_no_key(browser: Any, tmp_path: Any) -> None:
    database = f"sqlite+aiosqlite:///{tmp_path / 'open.db'}"  # no key: open on loopback
    with ServerProcess(database, env={"AGENTSTATE_AUTO_MIGRATE": "true"}) as server:
        httpx.put(f"{server.base_url}/v1/threads/open-mode-thread", json={"state": {}},
                  headers={"If-None-Match": "*"})
        context = keyed_context(browser, None)
        try:
            context.add_init_script(WATCH_CSP)
            watched = Watched(context.new_page())
            watched.page.goto(f"{server.base_url}/console#/threads?thread_id=open-mode-thread")
            watched.page.get_by_role("link", name="open-mode-thread").wait_for()
            assert watched.page.get_by_role("link", name="Enter API key").is_visible()
            watched.check()
        finally:
            context.close()
