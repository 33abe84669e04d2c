"""`agentstate backup PATH`: an online copy of the embedded SQLite database.

SQLite's backup API copies the database page by page from one read transaction. Done in one
step it is a consistent snapshot however busy the server is: in WAL mode the reader does
not block writers, and writers do not disturb the reader. (Copied in several steps, a write
from another connection between two steps restarts the copy, which under a steady stream
of writes might never finish.) The copy is made next to PATH, checked, and renamed into
place, so PATH is either the previous file or a complete backup.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import make_url


class BackupError(RuntimeError):
    """The backup could not be made; the message says why."""


@dataclass(frozen=True)
class BackupResult:
    path: Path
    pages: int
    bytes: int
    schema: str | None


def sqlite_path(database_url: str) -> Path:
    url = make_url(database_url)
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        raise BackupError("agentstate backup copies the SQLite database file; for Postgres use "
                          "pg_dump, or `agentstate copy` to another database.")
    return Path(url.database).expanduser()


def backup(database_url: str, target: Path) -> BackupResult:
    source_path = sqlite_path(database_url)
    if not source_path.exists():
        raise BackupError(f"{source_path} does not exist.")
    target = target.expanduser()
    if target.resolve() == source_path.resolve():
        raise BackupError("the backup must not overwrite the database itself.")
    partial = target.with_name(f".{target.name}.partial")
    partial.unlink(missing_ok=True)
    source = sqlite3.connect(source_path)
    try:
        source.execute("PRAGMA busy_timeout=30000")
        copy = sqlite3.connect(partial)
        try:
            source.backup(copy, pages=-1)  # one step: one read transaction, a consistent copy
            # The copy stands alone: no -wal file belongs to it.
            copy.execute("PRAGMA journal_mode=DELETE")
            check = copy.execute("PRAGMA integrity_check").fetchone()[0]
            if check != "ok":
                raise BackupError(f"the copy failed its integrity check: {check}")
            pages = copy.execute("PRAGMA page_count").fetchone()[0]
            has_version = copy.execute(
                "SELECT 1 FROM sqlite_master WHERE name = 'alembic_version'").fetchone()
            schema = (copy.execute("SELECT version_num FROM alembic_version").fetchone()[0]
                      if has_version else None)
        finally:
            copy.close()
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        source.close()
    os.chmod(partial, 0o600)  # as private as the database it copies
    os.replace(partial, target)
    return BackupResult(target, pages, target.stat().st_size, schema)
