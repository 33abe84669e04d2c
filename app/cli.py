"""`agentstate`: serve, migrate, keys, secrets; export, import, copy, backup."""

from __future__ import annotations

import argparse
import asyncio
import errno
import ipaddress
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from app.core.settings import Settings

if TYPE_CHECKING:
    from app.core.secretbox import SecretBox
    from app.db.engine import Database
    from app.ops.startup import StartupError

T = TypeVar("T")


def _serve(args: argparse.Namespace) -> int:
    from app.core.logging import configure_logging
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
    listener = _listen(args.host, args.port, args.workers)
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
        if not is_loopback(host) and not await _keys_exist(settings, db):
            raise StartupError(
                f"refusing to listen on {host}: no API keys exist, and without keys the "
                "server is open to anyone who can reach it. Create a key first:\n"
                "  agentstate keys create --tenant <tenant> --name <name>\n"
                "or listen on a loopback address (--host 127.0.0.1). Exiting with status 2: "
                "a restart cannot fix this.")
    finally:
        await db.dispose()


def _listen(host: str, port: int, workers: int) -> socket.socket:
    """The listening socket, or StartupError when another process holds the port.

    With more than one worker each worker listens on a socket of its own (SO_REUSEPORT, see
    WorkerSocket). The kernel lets any process of the same user join such a group, so a
    second server would silently take half the connections; a plain bind first proves the
    port is free (it fails while any socket, SO_REUSEPORT or not, is bound there).
    """
    if workers > 1 and hasattr(socket, "SO_REUSEPORT"):
        _bind(host, port, socket.socket, reuseport=False).close()
        return _reuseport_socket(host, port, WorkerSocket)
    sock = _bind(host, port, socket.socket, reuseport=False)
    sock.listen(2048)
    return sock


def run_uvicorn(app: str, listener: socket.socket | None = None, **options: Any) -> bool:
    """uvicorn.run on `listener` (with a listening socket per worker, see WorkerSocket).

    Returns whether the server started (False: its lifespan refused, and said why).
    """
    import uvicorn

    workers = options.get("workers", 1)
    config = uvicorn.Config(app, **options)
    if listener is None:
        listener = _listen(config.host, config.port, workers)
    if workers > 1 and isinstance(listener, WorkerSocket):
        from uvicorn.supervisors import Multiprocess

        from app.core.metrics import MULTIPROCESS_DIR

        logging.getLogger("agentstate.serve").info(
            "listening on %s:%d with %d workers, a socket each (SO_REUSEPORT)",
            config.host, listener.getsockname()[1], workers)
        # The workers' metrics, summed by whichever worker a scrape reaches (app/core/metrics.py).
        metrics_dir = tempfile.mkdtemp(prefix="agentstate-metrics-")
        os.environ[MULTIPROCESS_DIR] = metrics_dir
        try:
            Multiprocess(config, sockets=[listener]).run()
        finally:
            shutil.rmtree(metrics_dir, ignore_errors=True)
        return True
    server = uvicorn.Server(config)
    server.run(sockets=[listener])
    return bool(server.started)


class WorkerSocket(socket.socket):
    """The listening address, handed to each worker as a socket of its own.

    uvicorn's workers accept from one shared socket, and the first awake takes the waiting
    connections: 16 keep-alive clients split 14/2 between two workers, so one worker was
    saturated while the other idled. With SO_REUSEPORT the kernel spreads new connections
    over one listening socket per worker. uvicorn hands its sockets to the workers it spawns
    by pickling them, and this one unpickles as a new socket bound to the same address. The
    supervisor's own is bound, to hold the port, but never listens, so it is never given a
    connection.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        host, port = self.getsockname()[:2]
        return _reuseport_socket, (host, port)


def _reuseport_socket(host: str, port: int,
                      cls: type[socket.socket] = socket.socket) -> socket.socket:
    return _bind(host, port, cls, reuseport=True)


def _bind(host: str, port: int, cls: type[socket.socket], *, reuseport: bool) -> socket.socket:
    from app.ops.startup import StartupError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = cls(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuseport:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {host}:{port}: {(exc.strerror or str(exc)).lower()}"
                           + (" (another server runs there?)"
                              if exc.errno == errno.EADDRINUSE else "")) from None
    sock.set_inheritable(True)
    return sock


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
    from app.db.migrate import migration_settings

    settings = migration_settings(Settings())
    print(f"migrating {settings.redacted_database_url()} ...", file=sys.stderr, flush=True)
    before, after = asyncio.run(_migrate(settings, args.revision))
    if before == after:
        print(f"already at {after}", file=sys.stderr)
    else:
        print(f"migrated from {before or 'an empty database'} to {after}", file=sys.stderr)
    return 0


async def _rotate(settings: Settings, box: SecretBox) -> tuple[int, list[str]]:
    from app.db.engine import Database
    from app.mcp_servers.service import rotate_batch

    db = Database(settings)
    rotated, after = 0, 0
    unreadable: list[str] = []
    try:
        while True:
            # A transaction per batch: rotation is idempotent, so an interrupted run is
            # finished by running it again, and writers are never held up for long.
            async with db.write() as connection:
                last, count, failed = await rotate_batch(connection, box, after, 500)
                await connection.commit()
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


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # any other host name may resolve to a public address


async def _keys_exist(settings: Settings, db: Database) -> bool:
    """Whether any key exists (False on a database not migrated yet)."""
    from sqlalchemy import inspect

    from app.auth.repository import ApiKeyRepository

    async with db.engine.connect() as connection:
        if not await connection.run_sync(lambda sync: inspect(sync).has_table("api_keys")):
            return False
    async with db.read() as connection:
        return await ApiKeyRepository(connection).any_exist()


async def _in_keys_session(settings: Settings, use: Callable[[Any], Awaitable[T]]) -> T:
    """Run `use(ApiKeyService)` in one committed transaction on a migrated database."""
    from app.auth.service import ApiKeyService
    from app.core.errors import ServiceUnavailable
    from app.db import migrate
    from app.db.engine import Database

    db = Database(settings)
    try:
        if settings.should_auto_migrate:
            await migrate.upgrade(db.engine)
        elif await migrate.current_revision(db.engine) != migrate.head_revision():
            raise ServiceUnavailable(
                "The database schema is not current; run `agentstate migrate`.")
        async with db.write() as connection:
            result = await use(ApiKeyService(connection))
            await connection.commit()
            return result
    finally:
        await db.dispose()


def _run_keys(args: argparse.Namespace) -> int:
    from app.auth.service import parse_scopes
    from app.core.errors import AppError

    settings = Settings()
    try:
        if args.keys_command == "create":
            scopes = parse_scopes(args.scopes)
            key, token = asyncio.run(_in_keys_session(
                settings, lambda keys: keys.create(args.tenant, args.name, scopes)))
            print(token, flush=True)
            print(f"created key {key.key_id} ({key.name!r}) for tenant {key.tenant_id!r} with "
                  f"scopes {','.join(key.scopes)}.\nThe token above is shown only this once; "
                  "send it as Authorization: Bearer <token>.", file=sys.stderr)
        elif args.keys_command == "list":
            keys = asyncio.run(_in_keys_session(settings, lambda svc: svc.list(args.tenant)))
            _print_keys(keys, as_json=args.json)
        else:
            revoked = asyncio.run(_in_keys_session(settings, lambda svc: svc.revoke(args.key_id)))
            print(f"key {args.key_id} {'revoked' if revoked else 'was already revoked'}; running "
                  f"servers refuse it within {settings.auth_cache_seconds:g} s.", file=sys.stderr)
    except AppError as error:
        print(f"agentstate: {error.detail}", file=sys.stderr)
        return 1
    return 0


def _print_keys(keys: list[Any], *, as_json: bool) -> None:
    rows = [
        {"key_id": key.key_id, "tenant_id": key.tenant_id, "name": key.name,
         "scopes": ",".join(key.scopes),
         "created_at": key.created_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
         "revoked_at": key.revoked_at.strftime("%Y-%m-%dT%H:%M:%SZ") if key.revoked_at else None}
        for key in keys
    ]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    columns = ["key_id", "tenant_id", "name", "scopes", "created_at", "revoked_at"]
    table = [columns] + [[str(row[c] or "-") for c in columns] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    for line in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"a whole number of at least 1, not {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from app import __version__
    from app.auth.service import DEFAULT_SCOPES

    parser = argparse.ArgumentParser(
        prog="agentstate", description="The state service AI agents keep their memory in."
    )
    parser.add_argument("--version", action="version", version=f"agentstate {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of an error (also AGENTSTATE_LOG_LEVEL=DEBUG)")
    sub = parser.add_subparsers(dest="command", required=True)

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

    from app.portability.commands import register as register_portability

    register_portability(sub)  # export, import, copy, backup

    # Retention (issue 18): `agentstate gc [--dry-run]`.
    from app.retention.commands import register as register_retention

    register_retention(sub)

    secrets = sub.add_parser("secrets", help="keys for MCP server secrets")
    secrets_sub = secrets.add_subparsers(dest="secrets_command", required=True)
    rotate = secrets_sub.add_parser(
        "rotate", help="re-encrypt every stored secret with the first key of "
                       "AGENTSTATE_SECRET_KEYS (the others only need to open the old ones)")
    rotate.set_defaults(func=_run_rotate)
    new_key = secrets_sub.add_parser("new-key", help="print a new key for AGENTSTATE_SECRET_KEYS")
    new_key.set_defaults(func=_run_new_key)

    keys = sub.add_parser("keys", help="create, list and revoke API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_sub.add_parser("create", help="create a key; prints its token once on stdout")
    create.add_argument("--tenant", default="default",
                        help="the tenant the key belongs to (default: default, the tenant "
                             "an open server uses)")
    create.add_argument("--name", required=True, help="a label, e.g. who or what uses the key")
    create.add_argument("--scopes", default=",".join(DEFAULT_SCOPES),
                        help="comma-separated: read, write, secrets:read, admin "
                             "(default: read,write)")
    listing = keys_sub.add_parser("list", help="list keys (never their tokens)")
    listing.add_argument("--tenant", help="only this tenant's keys")
    listing.add_argument("--json", action="store_true", help="JSON instead of a table")
    revoke = keys_sub.add_parser("revoke", help="revoke a key for good")
    revoke.add_argument("key_id")
    keys.set_defaults(func=_run_keys)
    return parser


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


def main(argv: list[str] | None = None) -> int:
    """Run a command; an error is one line on stderr and a non-zero status, the traceback
    only with --debug or AGENTSTATE_LOG_LEVEL=DEBUG."""
    from pydantic import ValidationError

    from app.core.settings import describe_settings_error
    from app.ops.startup import EXIT_MISCONFIGURED, StartupError

    args = build_parser().parse_args(argv)
    debug = args.debug or os.environ.get("AGENTSTATE_LOG_LEVEL", "").strip().upper() == "DEBUG"
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except StartupError as error:
        if debug:
            raise
        print(f"agentstate: {error}", file=sys.stderr)
        return error.exit_code
    except ValidationError as error:
        if debug or error.title != "Settings":
            raise
        for line in describe_settings_error(error).splitlines():
            print(f"agentstate: {line}", file=sys.stderr)
        return EXIT_MISCONFIGURED
    except Exception as error:
        if debug:
            raise
        described = _describe(error)
        print(f"agentstate: {described}", file=sys.stderr)
        return described.exit_code


def _describe(error: Exception) -> StartupError:
    """One line for an unexpected error: the database's cause when it is one."""
    from app.ops.startup import EXIT_FAILED, StartupError, database_error

    try:
        settings: Settings | None = Settings()
    except ValueError:  # pydantic's ValidationError
        settings = None
    found = database_error(error, settings) if settings is not None else None
    if found is not None:
        return found
    text = str(error).splitlines()[0] if str(error) else ""
    return StartupError(f"{type(error).__name__}: {text} (run with --debug for the traceback)"
                        if text else f"{type(error).__name__} (run with --debug for the "
                        "traceback)", EXIT_FAILED)


if __name__ == "__main__":
    raise SystemExit(main())
