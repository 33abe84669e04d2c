"""`agentstate`: serve, migrate."""

from __future__ import annotations

import argparse
import asyncio
import sys

from app.core.settings import Settings


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.core.logging import configure_logging

    settings = Settings()
    configure_logging(settings.log_level, settings.log_format)
    uvicorn.run(
        "app.main:serve_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_config=None,
        access_log=False,
        proxy_headers=args.proxy_headers,
        timeout_graceful_shutdown=args.graceful_timeout,
        timeout_keep_alive=args.keep_alive,
        server_header=False,
    )
    return 0


async def _migrate(settings: Settings, revision: str) -> tuple[str | None, str | None]:
    from app.db import migrate
    from app.db.engine import Database

    db = Database(settings)
    try:
        before = await migrate.current_revision(db.engine)
        await migrate.upgrade(db.engine, revision)
        return before, await migrate.current_revision(db.engine)
    finally:
        await db.dispose()


def _run_migrate(args: argparse.Namespace) -> int:
    settings = Settings()
    print(f"migrating {settings.redacted_database_url()} ...", file=sys.stderr, flush=True)
    before, after = asyncio.run(_migrate(settings, args.revision))
    if before == after:
        print(f"already at {after}", file=sys.stderr)
    else:
        print(f"migrated from {before or 'an empty database'} to {after}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentstate", description="The state service AI agents keep their memory in."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the HTTP API")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--workers", type=int, default=1)
    serve.add_argument("--proxy-headers", action="store_true",
                       help="trust X-Forwarded-* from the proxy in front")
    serve.add_argument("--graceful-timeout", type=int, default=30,
                       help="seconds in-flight requests get to finish on SIGTERM")
    serve.add_argument("--keep-alive", type=int, default=30,
                       help="seconds an idle keep-alive connection stays open")
    serve.set_defaults(func=_serve)

    migrate = sub.add_parser("migrate", help="upgrade the database schema (alembic upgrade)")
    migrate.add_argument("revision", nargs="?", default="head")
    migrate.set_defaults(func=_run_migrate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
