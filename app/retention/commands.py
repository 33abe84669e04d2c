"""`agentstate gc [--dry-run]`: one retention sweep now (what `serve` does every
`AGENTSTATE_SWEEP_INTERVAL_SECONDS`), or only what it would remove."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any


def register(sub: Any) -> None:
    gc = sub.add_parser(
        "gc", help="remove what retention allows now: expired threads and store items "
                   "(ttl_seconds), and events, tombstones and idempotency records older "
                   "than their retention")
    gc.add_argument("--dry-run", action="store_true",
                    help="only count what would be removed")
    gc.set_defaults(func=_run_gc)


def _run_gc(args: argparse.Namespace) -> int:
    return asyncio.run(_gc(args))


async def _gc(args: argparse.Namespace) -> int:
    from app.core.settings import Settings
    from app.db.engine import Database
    from app.db.tenancy import install_tenant_guard
    from app.retention.service import Retention

    settings = Settings()
    db = Database(settings)
    install_tenant_guard(db.engine)
    try:
        retention = Retention(db, settings)
        report = await (retention.count() if args.dry_run else retention.sweep())
    finally:
        await db.dispose()
    print(json.dumps({"dry_run": bool(args.dry_run), **report.as_dict()}))
    return 0
