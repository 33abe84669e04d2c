"""The console's page and assets as HTTP resources (the browser tests are in
tests/test_console_browser.py): served with a strict policy, shipped in the wheel, off when
the setting says so, behind the Host allow-list like every path."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from html.parser import HTMLParser

import httpx
import pytest

from app.console.router import ASSETS, CSP
from app.core.settings import Settings
from app.http.posture import install_posture
from app.main import create_app
from tests.conftest import http_client, running
from tests.support import ROOT

pytestmark = pytest.mark.anyio
STATIC = ROOT / "app" / "console" / "static"
POLICY = {
    "content-security-policy": CSP,
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


def test_the_policy_allows_nothing_inline_and_no_other_origin() -> None:
    directives = dict(part.split(" ", 1) for part in CSP.split("; "))
    assert directives["default-src"] == "'none'"
    for name in ("script-src", "style-src", "img-src", "connect-src"):
        assert directives[name] == "'self'", name
    assert directives["frame-ancestors"] == "'none'"
    assert directives["require-trusted-types-for"] == "'script'"
    assert "unsafe" not in CSP


async def test_the_page_and_every_asset_carry_the_policy(client: httpx.AsyncClient) -> None:
    page = await client.get("/console")
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert {k: page.headers[k] for k in POLICY} == POLICY
    assert len(ASSETS) >= 10
    for name in sorted(set(ASSETS) - {"index.html"}):
        response = await client.get(f"/console/assets/{name}")
        assert response.status_code == 200, name
        assert {k: response.headers[k] for k in POLICY} == POLICY, name
        assert response.content == (STATIC / name).read_bytes()
    assert (await client.get("/console/assets/main.js")).headers["content-type"].startswith(
        "text/javascript")
    head = await client.head("/console")
    assert head.status_code == 200 and head.content == b""


@pytest.mark.parametrize("path", [
    "/console/assets/index.html", "/console/assets/../router.py", "/console/assets/nope.js",
    "/console/assets/%2e%2e/router.py", "/console/", "/console/assets/views",
])
async def test_only_shipped_assets_are_answered(client: httpx.AsyncClient, path: str) -> None:
    response = await client.get(path)
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"


async def test_the_setting_turns_the_console_off(settings: Settings) -> None:
    off = settings.model_copy(update={"console_enabled": False})
    async with running(off) as app, http_client(app) as client:
        for path in ("/console", "/console/assets/main.js"):
            response = await client.get(path)
            assert response.status_code == 404, path
            assert response.json()["code"] == "not_found"
        assert (await client.get("/healthz")).status_code == 200


async def test_the_host_allow_list_applies_to_the_console(settings: Settings) -> None:
    app = create_app(settings)
    install_posture(app, settings)  # as `agentstate serve` does
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as ok:
            assert (await ok.get("/console")).status_code == 200
        async with httpx.AsyncClient(transport=transport,
                                     base_url="http://rebound.example") as evil:
            refused = await evil.get("/console")
            assert refused.status_code == 400
            assert refused.json()["code"] == "host_not_allowed"


def test_every_asset_is_shipped_in_the_wheel() -> None:
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["app.console"]
    for path in STATIC.rglob("*"):
        if path.is_file():
            relative = path.relative_to(STATIC.parent).as_posix()
            assert any(fnmatch.fnmatch(relative, g) and relative.count("/") == g.count("/")
                       for g in globs), f"{relative} is not in pyproject's package-data"
            assert path.relative_to(STATIC).as_posix() in ASSETS, relative


class _Inline(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = {name for name, _ in attrs}
        if tag == "style" or "style" in names or any(n.startswith("on") for n in names):
            self.found.append(f"<{tag} {sorted(names)}>")
        if tag == "script":
            self._in_script = True
            if "src" not in names:
                self.found.append("<script> without src")

    def handle_endtag(self, tag: str) -> None:
        self._in_script = self._in_script and tag != "script"

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.found.append("inline script")


def test_nothing_is_inline_and_no_code_builds_markup_from_strings() -> None:
    parser = _Inline()
    parser.feed((STATIC / "index.html").read_text())
    assert parser.found == []
    sinks = re.compile(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|"
                       r"new Function|\.style\.|setAttribute\(\"(style|on)|include_secrets")
    for path in STATIC.rglob("*.js"):
        code = [line for line in path.read_text().splitlines()
                if not line.lstrip().startswith(("//", "*", "/**"))]
        found = [line for line in code if sinks.search(line)]
        assert found == [], f"{path.name}: {found}"


def test_every_module_is_preloaded() -> None:
    """The page names every module at once (no round trip per import level); a view added
    without its preload line would still work, only slower: this keeps the list whole."""
    page = (STATIC / "index.html").read_text()
    preloaded = set(re.findall(r'<link rel="modulepreload" href="/console/assets/([^"]+)">', page))
    modules = {p.relative_to(STATIC).as_posix() for p in STATIC.rglob("*.js")} - {"main.js"}
    assert preloaded == modules
