"""`agentstate keys create | list | revoke`: API keys, managed from the host."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from app.core.settings import Settings

T = TypeVar("T")


def register(sub: Any) -> None:
    """Add `keys` to `agentstate`'s subparsers."""
    from app.auth.service import DEFAULT_SCOPES

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
