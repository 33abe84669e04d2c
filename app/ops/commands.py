"""`agentstate serve` and `agentstate migrate`."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import TYPE_CHECKING, Any

from app.core.settings import Settings

if TYPE_CHECKING:
    from app.db.engine import Database


def register(sub: Any) -> None:
    """Add `serve` and `migrate` to `agentstate`'s subparsers."""
    serve = sub.add_parser(
        "serve", help="run the HTTP API", epilog=SERVE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default: %(default)s); off loopback the "
                            "server refuses to start until an API key exists")
    serve.add_argument("--port", type=int, default=8080, help="(default: %(default)s)")
    serve.add_argument("--workers", type=int, default=1,
                       help="processes, each with its own socket (default: %(default)s)")
    serve.add_argument("--proxy-headers", action="store_true",
                       help="trust X-Forwarded-* from the proxy in front")
    serve.add_argument("--graceful-timeout", type=int, default=30,
                       help="seconds in-flight requests get to finish on SIGTERM "
                            "(default: %(default)s)")
    serve.add_argument("--keep-alive", type=int, default=30,
                       help="seconds an idle keep-alive connection stays open "
                            "(default: %(default)s)")
    serve.add_argument("--limit-concurrency", type=_at_least_one, default=None,
                       help="requests at once per worker (streams and long polls "
                            "included); one more gets 503 `overloaded`. Sets "
                            "AGENTSTATE_MAX_REQUESTS_IN_FLIGHT (default 1000)")
    serve.add_argument("--http", choices=["httptools", "h11"], default="httptools",
                       help="HTTP parser (default: %(default)s, the fastest); h11 also refuses "
                            "a request head that grows past AGENTSTATE_MAX_HEADER_BYTES while "
                            "it arrives (docs/operations.md)")
    serve.set_defaults(func=_serve)

    migrate = sub.add_parser("migrate", help="upgrade the database schema (alembic upgrade)")
    migrate.add_argument("revision", nargs="?", default="head")
    migrate.set_defaults(func=_run_migrate)


def _serve(args: argparse.Namespace) -> int:
    from app.core.logging import configure_logging
    from app.ops.listen import is_loopback, listen, run_uvicorn
    from app.ops.startup import EXIT_MISCONFIGURED, LISTEN_ADDRESS, StartupError

    settings = Settings()
    configure_logging(settings.log_level, settings.log_format)
    if not is_loopback(args.host):
        # Workers build their settings from the environment: they must never run open either.
        os.environ["AGENTSTATE_REQUIRE_API_KEYS"] = "true"
    if args.limit_concurrency is not None:
        os.environ["AGENTSTATE_MAX_REQUESTS_IN_FLIGHT"] = str(args.limit_concurrency)
    # Everything a request would trip over, found before the port is taken.
    asyncio.run(_preflight(settings, args.host))
    # Bound (and listening) before the lifespan runs, so its "ready" line is true when logged,
    # and a port another server holds is refused before anything else happens.
    listener = listen(args.host, args.port, args.workers)
    host, port = listener.getsockname()[:2]
    os.environ[LISTEN_ADDRESS] = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    try:
        started = run_uvicorn(
            "app.main:serve_app",
            listener,
            factory=True,
            host=args.host,
            port=args.port,
            workers=args.workers,
            log_config=None,
            access_log=False,
            proxy_headers=args.proxy_headers,
            timeout_graceful_shutdown=args.graceful_timeout,
            timeout_keep_alive=args.keep_alive,
            # Bounded by the application instead (app/http/posture.py, problem+json).
            limit_concurrency=None,
            h11_max_incomplete_event_size=settings.max_header_bytes,
            http=args.http,
            server_header=False,
        )
    finally:
        listener.close()
    if not started:
        raise StartupError("the server did not start; the lines above say why",
                           EXIT_MISCONFIGURED)
    return 0


async def _preflight(settings: Settings, host: str) -> None:
    """The start-up checks of the lifespan (app/ops/startup.py), run once before uvicorn."""
    from app.core.secretbox import SecretKeyError, load_secret_box
    from app.db.engine import Database
    from app.ops.listen import is_loopback
    from app.ops.startup import StartupError, check_schema, schema_revision

    try:
        load_secret_box(settings)  # a malformed key is a line here, not a traceback later
    except SecretKeyError as error:
        raise StartupError(str(error)) from None
    db = Database(settings)
    try:
        if settings.should_auto_migrate:
            await schema_revision(db, settings)  # reachable; the lifespan migrates
        else:
            await check_schema(db, settings)  # the lifespan checks the secrets key
        if not is_loopback(host) and not await _keys_exist(db):
            raise StartupError(
                f"refusing to listen on {host}: no API keys exist, and without keys the "
                "server is open to anyone who can reach it. Create a key first:\n"
                "  agentstate keys create --tenant <tenant> --name <name>\n"
                "or listen on a loopback address (--host 127.0.0.1). Exiting with status 2: "
                "a restart cannot fix this.")
    finally:
        await db.dispose()


async def _keys_exist(db: Database) -> bool:
    """Whether any key exists (False on a database not migrated yet)."""
    from app.auth.repository import ApiKeyRepository

    async with db.engine.connect() as connection:
        if not await ApiKeyRepository(connection).table_exists():
            return False
    async with db.read() as connection:
        return await ApiKeyRepository(connection).any_exist()


async def _migrate(settings: Settings,
                   revision: str) -> tuple[str | None, str | None, list[tuple[str, str]]]:
    from app.db import migrate
    from app.db.engine import Database

    db = Database(settings)
    try:
        before = await migrate.current_revision(db.engine)
        again = await migrate.upgrade(db.engine, revision)
        return before, await migrate.current_revision(db.engine), again
    finally:
        await db.dispose()


def migration_settings(settings: Settings) -> Settings:
    """The settings `agentstate migrate` runs with: Postgres itself, never a transaction
    pooler. A migration is one transaction of DDL under exclusive locks, run once by an
    operator: it does not belong on a server connection the fleet's requests queue for."""
    if not settings.pooled:
        return settings
    if settings.direct_database_url is None:
        from app.ops.startup import StartupError

        raise StartupError(
            "AGENTSTATE_DATABASE_URL goes through a transaction pooler "
            "(AGENTSTATE_DATABASE_POOLER=transaction): migrate Postgres itself, with "
            "AGENTSTATE_DIRECT_DATABASE_URL set to its URL")
    return settings.model_copy(update={"database_url": settings.direct_database_url,
                                       "database_pooler": "none"})


def _run_migrate(args: argparse.Namespace) -> int:
    settings = migration_settings(Settings())
    print(f"migrating {settings.redacted_database_url()} ...", file=sys.stderr, flush=True)
    before, after, again = asyncio.run(_migrate(settings, args.revision))
    if before == after:
        print(f"already at {after}", file=sys.stderr)
    else:
        print(f"migrated from {before or 'an empty database'} to {after}", file=sys.stderr)
    for revision, message in again:
        print(f"applied {revision} again, now that the database allows it: {message}",
              file=sys.stderr)
    return 0


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"a whole number of at least 1, not {text!r}")
    return value


SERVE_EPILOG = """\
environment (see docs/operations.md for all):
  AGENTSTATE_DATABASE_URL      postgresql://user:pass@host/db[?sslmode=...] or sqlite:///path
                               (default: sqlite in $XDG_DATA_HOME/agentstate/state.db)
  AGENTSTATE_SECRET_KEYS       keys for MCP secrets (default on SQLite: secret.key beside the
                               database; on Postgres: none, secret writes are refused)
  AGENTSTATE_AUTO_MIGRATE      migrate at start (default: on for SQLite, off for Postgres)
  AGENTSTATE_ALLOWED_HOSTS     Host names an open server answers besides loopback ones
  AGENTSTATE_MAX_HEADER_BYTES  largest request header fields; larger get 431 (default: 16384)
  AGENTSTATE_DATABASE_TIMEOUT  seconds before a silent database is answered 503 (default: 10)
  AGENTSTATE_LOG_LEVEL, AGENTSTATE_LOG_FORMAT   INFO, json (default)
"""
