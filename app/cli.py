"""`agentstate`: serve, migrate, export, secrets."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING

from app.core.settings import Settings

if TYPE_CHECKING:
    from app.core.secretbox import SecretBox


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


async def _export(settings: Settings) -> int:
    from app.db.engine import Database
    from app.db.export import export

    db = Database(settings)
    try:
        return await export(db.engine, sys.stdout, sys.stderr)
    finally:
        await db.dispose()


def _run_export(args: argparse.Namespace) -> int:
    settings = Settings()
    print(f"exporting {settings.redacted_database_url()} ...", file=sys.stderr, flush=True)
    total = asyncio.run(_export(settings))
    print(f"exported {total} rows", file=sys.stderr)
    return 0


async def _rotate(settings: Settings, box: SecretBox) -> tuple[int, list[str]]:
    from app.db.engine import Database
    from app.mcp_servers.service import rotate_batch

    db = Database(settings)
    rotated, unreadable, after = 0, [], 0
    try:
        while True:
            # A transaction per batch: rotation is idempotent, so an interrupted run is
            # finished by running it again, and writers are never held up for long.
            async with db.write_sessions() as session, session.begin():
                last, count, failed = await rotate_batch(session, box, after, 500)
            if last is None:
                return rotated, unreadable
            rotated, after = rotated + count, last
            unreadable += failed
            print(f"re-encrypted {rotated} so far", file=sys.stderr, flush=True)
    finally:
        await db.dispose()


def _run_rotate(args: argparse.Namespace) -> int:
    from app.core.secretbox import SecretKeyError, load_secret_box

    settings = Settings()
    try:
        box = load_secret_box(settings)
    except SecretKeyError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if box is None:
        print("error: AGENTSTATE_SECRET_KEYS is not set; put the new key first, then the old "
              "ones, e.g. AGENTSTATE_SECRET_KEYS=<new>,<old>", file=sys.stderr)
        return 2
    rotated, unreadable = asyncio.run(_rotate(settings, box))
    print(f"re-encrypted the secrets of {rotated} MCP servers with the first key",
          file=sys.stderr)
    if unreadable:
        print(f"error: no configured key opens the secrets of {len(unreadable)} MCP servers: "
              + ", ".join(unreadable), file=sys.stderr)
        return 1
    return 0


def _run_new_key(args: argparse.Namespace) -> int:
    from app.core.secretbox import new_key

    print(new_key())
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

    export = sub.add_parser("export", help="write all tenant data to stdout as JSON lines "
                                           "(secrets as \"***\"); progress on stderr")
    export.set_defaults(func=_run_export)

    secrets = sub.add_parser("secrets", help="keys for MCP server secrets")
    secrets_sub = secrets.add_subparsers(dest="secrets_command", required=True)
    rotate = secrets_sub.add_parser(
        "rotate", help="re-encrypt every stored secret with the first key of "
                       "AGENTSTATE_SECRET_KEYS (the others only need to open the old ones)")
    rotate.set_defaults(func=_run_rotate)
    new_key = secrets_sub.add_parser("new-key", help="print a new key for AGENTSTATE_SECRET_KEYS")
    new_key.set_defaults(func=_run_new_key)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
