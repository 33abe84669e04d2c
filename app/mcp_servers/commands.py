"""`agentstate secrets rotate | new-key`: the keys that seal MCP server secrets."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING, Any

from app.core.settings import Settings

if TYPE_CHECKING:
    from app.core.secretbox import SecretBox


def register(sub: Any) -> None:
    """Add `secrets` to `agentstate`'s subparsers."""
    secrets = sub.add_parser("secrets", help="keys for MCP server secrets")
    secrets_sub = secrets.add_subparsers(dest="secrets_command", required=True)
    rotate = secrets_sub.add_parser(
        "rotate", help="re-encrypt every stored secret with the first key of "
                       "AGENTSTATE_SECRET_KEYS (the others only need to open the old ones)")
    rotate.set_defaults(func=_run_rotate)
    new_key = secrets_sub.add_parser("new-key", help="print a new key for AGENTSTATE_SECRET_KEYS")
    new_key.set_defaults(func=_run_new_key)


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
