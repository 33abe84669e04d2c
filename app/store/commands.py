"""`agentstate reindex [--dry-run]`: rebuild the store's HNSW indexes built with other
parameters than AGENTSTATE_STORE_HNSW_M and AGENTSTATE_STORE_HNSW_EF_CONSTRUCTION
(app/store/pgvector.py), searches using the old ones until the new ones are valid."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any


def register(sub: Any) -> None:
    about = ("rebuild the store's HNSW indexes built with other parameters than "
             "AGENTSTATE_STORE_HNSW_M and AGENTSTATE_STORE_HNSW_EF_CONSTRUCTION (Postgres with "
             "pgvector); searches use the old index until the new one is valid; progress on "
             "stderr, what was found as JSON on stdout")
    reindex = sub.add_parser("reindex", help=about, description=about)
    reindex.add_argument("--dry-run", action="store_true",
                         help="only list the indexes that would be rebuilt")
    reindex.set_defaults(func=_run_reindex)


def _run_reindex(args: argparse.Namespace) -> int:
    return asyncio.run(_reindex(args))


async def _reindex(args: argparse.Namespace) -> int:
    from app.core.settings import Settings
    from app.db.listener import session_url
    from app.ops.startup import EXIT_MISCONFIGURED, StartupError
    from app.store import pgvector

    settings = Settings()
    url = None if settings.is_sqlite else session_url(settings)
    if url is None and not settings.is_sqlite:
        raise StartupError("reindex needs Postgres itself: AGENTSTATE_DATABASE_URL goes "
                           "through a transaction pooler; set AGENTSTATE_DIRECT_DATABASE_URL",
                           EXIT_MISCONFIGURED)
    found = None if url is None else await pgvector.reindex(
        url, pgvector.build_options(settings), dry_run=args.dry_run,
        report=lambda line: print(line, file=sys.stderr, flush=True))
    if found is None:
        print("nothing to rebuild: this database has no HNSW indexes (SQLite, or Postgres "
              "without pgvector: docs/operations.md)", file=sys.stderr)
    print(json.dumps({"dry_run": bool(args.dry_run), "indexes": found or []}))
    return 0
