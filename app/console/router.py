"""`/console`: the audit console's page and its static assets (docs/console.md).

The page is a client of the public API like any other (it holds no data and needs no key to
load); everything it shows comes from `/v1` with the caller's own key. Its files ship in the
package (`app/console/static/`), so it works offline with no build step. Every answer carries
a strict Content-Security-Policy: scripts and styles only from this origin, no inline script
or style, Trusted Types required (a string can never reach `innerHTML`), no framing, and
requests only to this origin.
"""

from __future__ import annotations

from importlib.resources import as_file, files
from pathlib import Path

from starlette.responses import FileResponse, Response

from app.core.errors import NotFound
from app.http.routing import DomainRouter

router = DomainRouter(prefix="/console", include_in_schema=False)

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; "
    "require-trusted-types-for 'script'; trusted-types 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    # Revalidated on every load (ETag), so an upgraded server's page is never mixed with old
    # modules from the cache.
    "Cache-Control": "no-cache",
}
MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
               ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}


def _assets() -> dict[str, Path]:
    """Every shipped file by its path under static/ (the only names `/console/assets/`
    answers: nothing from a request reaches the file system)."""
    with as_file(files("app.console") / "static") as root:
        return {path.relative_to(root).as_posix(): path for path in sorted(root.rglob("*"))
                if path.is_file() and path.suffix in MEDIA_TYPES}


ASSETS = _assets()


def _file(name: str) -> Response:
    path = ASSETS[name]
    return FileResponse(path, media_type=MEDIA_TYPES[path.suffix], headers=HEADERS)


@router.get("")
async def console_page() -> Response:
    return _file("index.html")


@router.get("/assets/{name:path}")
async def console_asset(name: str) -> Response:
    if name not in ASSETS or name == "index.html":  # the page itself is /console
        raise NotFound(f"The console has no asset {name[:200]!r}.")
    return _file(name)
