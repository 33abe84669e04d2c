"""`agentstate export | import | copy | backup`: arguments, progress and summaries.

Thin: each command builds its settings and databases, calls one use case (`export.py`,
`importer.py`, `copy.py`, or `app/db/backup.py`), and reports. Exit status 0 when
everything was done, 1 when something was refused, differs or stopped the command, 2 when
the command could not start (bad arguments, a schema that is not current, no keys).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.core.settings import Settings

if TYPE_CHECKING:
    from app.portability.importer import Summary

FORMATS = ("agentstate", "aisuite-files", "aisuite-postgres", "colosseum")


def register(sub: Any) -> None:
    """Add the commands to `agentstate`'s subparsers."""
    export = sub.add_parser(
        "export", help="write every tenant's data as a versioned JSON-lines file "
                       "(docs/export-format.md); progress on stderr")
    export.add_argument("-o", "--output", help="the file to write (default: stdout)")
    sealed = export.add_mutually_exclusive_group()
    sealed.add_argument("--secrets-passphrase-file", metavar="FILE",
                        help="re-seal MCP server secrets under the passphrase in FILE, so "
                             "they can be restored where other keys are configured")
    sealed.add_argument("--redact-secrets", action="store_true",
                        help="leave MCP server secrets out (a file to share)")
    export.set_defaults(func=_run_export)

    imp = sub.add_parser(
        "import", help="import an export (or another store's data) into the database; "
                       "idempotent, one transaction per thread")
    imp.add_argument("source", help="the file ('-': stdin); for --format aisuite-files a "
                                    "directory, aisuite-postgres a database URL, colosseum a "
                                    "SQLite file or database URL")
    imp.add_argument("--format", choices=FORMATS, default="agentstate")
    imp.add_argument("--on-conflict", choices=("skip", "fail", "replace"), default="fail",
                     help="a thread or resource stored with other content: leave it, stop "
                          "(default), or replace it with the imported one")
    imp.add_argument("--secrets-passphrase-file", metavar="FILE",
                     help="the passphrase of an export made with --secrets-passphrase-file")
    imp.add_argument("--tenant", default="default",
                     help="the tenant that data from another store goes to (default: default)")
    imp.set_defaults(func=_run_import)

    copy = sub.add_parser(
        "copy", help="copy every tenant's data from one database to another (SQLite to "
                     "Postgres or back), then verify; run it again to resume")
    copy.add_argument("--from", dest="source", required=True, metavar="URL")
    copy.add_argument("--to", dest="target", required=True, metavar="URL")
    copy.add_argument("--on-conflict", choices=("skip", "fail", "replace"), default="fail")
    copy.add_argument("--no-verify", action="store_true",
                      help="skip the verification pass (counts and a checksum per thread)")
    copy.set_defaults(func=_run_copy)

    backup = sub.add_parser(
        "backup", help="an online, consistent copy of the SQLite database (SQLite's backup "
                       "API), safe while the server runs")
    backup.add_argument("path", help="the backup file to write (replaced atomically)")
    backup.set_defaults(func=_run_backup)


def _settings(**values: Any) -> Settings:
    # A long export or copy is one read transaction: no statement timeout for it.
    return Settings(**values, statement_timeout_ms=0)


def _fail(message: str, status: int = 2) -> int:
    print(f"agentstate: {message}", file=sys.stderr)
    return status


async def _check_schema(db: Any, settings: Settings, *, role: str, migrate_empty: bool) -> None:
    from app.db import migrate

    current, head = await migrate.current_revision(db.engine), migrate.head_revision()
    if current == head:
        return
    if settings.should_auto_migrate or (migrate_empty and current is None):
        await migrate.upgrade(db.engine)
        return
    raise SystemExit(_fail(f"the {role} database's schema is at {current or 'nothing'}, not "
                           f"{head}; run `agentstate migrate` on it first."))


# --- export ------------------------------------------------------------------------------


def _run_export(args: argparse.Namespace) -> int:
    return asyncio.run(_export(args))


async def _export(args: argparse.Namespace) -> int:
    from app.core.secretbox import SecretKeyError, load_secret_box
    from app.db import migrate
    from app.db.engine import Database
    from app.portability.copy import count_records
    from app.portability.export import export
    from app.portability.format import Header
    from app.portability.progress import progress_bar
    from app.portability.secrets import SecretsError, SecretsOut, new_kdf, read_passphrase

    settings = _settings()
    try:
        box = load_secret_box(settings)
        if args.secrets_passphrase_file:
            kdf = new_kdf()
            header = Header(schema=None, secrets="passphrase", kdf=kdf)
            secrets = SecretsOut("passphrase", box, read_passphrase(
                args.secrets_passphrase_file), kdf)
        else:
            header = Header(schema=None, secrets="redacted" if args.redact_secrets
                            else "ciphertext")
            secrets = SecretsOut(header.secrets, box)
    except (SecretKeyError, SecretsError, OSError) as exc:
        return _fail(str(exc))
    db = Database(settings)
    try:
        await _check_schema(db, settings, role="source", migrate_empty=False)
        header.schema = await migrate.current_revision(db.engine)
        print(f"exporting {settings.redacted_database_url()} ...", file=sys.stderr, flush=True)
        total = await count_records(db)
        # A CLI writing one file: blocking writes are what it waits for anyway.
        out = (open(args.output, "w", encoding="utf-8")  # noqa: ASYNC230, SIM115
               if args.output else sys.stdout)
        try:
            with progress_bar("export", total) as advance:
                written = await export(db, out, header, secrets, advance)
        except SecretsError as exc:
            return _fail(str(exc), 1)
        finally:
            if out is not sys.stdout:
                out.close()
    finally:
        await db.dispose()
    print(f"exported {written} records", file=sys.stderr)
    return 0


# --- import ------------------------------------------------------------------------------


def _run_import(args: argparse.Namespace) -> int:
    return asyncio.run(_import(args))


async def _import(args: argparse.Namespace) -> int:
    from app.core.secretbox import FROM_SQLITE, SecretKeyError, keys_source, load_secret_box
    from app.db.engine import Database
    from app.portability.foreign import foreign_source
    from app.portability.format import Header
    from app.portability.importer import Importer
    from app.portability.progress import progress_bar
    from app.portability.reader import ImportStopped, Item, from_sync, read_header, read_items
    from app.portability.secrets import SecretsError, SecretsIn, read_passphrase

    settings = _settings()
    stream = None
    notes: list[str] = []
    try:
        items: AsyncIterator[Item]
        if args.format == "agentstate":
            stream = (sys.stdin.buffer if args.source == "-"
                      else open(args.source, "rb"))  # noqa: ASYNC230, SIM115
            header = read_header(stream)
            items = from_sync(read_items(stream, settings))
        else:
            header = Header(schema=None)
            foreign = foreign_source(args.format, args.source, args.tenant)
            items, notes = foreign.items, foreign.notes
        passphrase = (read_passphrase(args.secrets_passphrase_file)
                      if args.secrets_passphrase_file else None)
        secrets = SecretsIn(header.secrets, load_secret_box(settings), passphrase, header.kdf)
    except ImportStopped as exc:
        return _fail(f"{args.source}: {exc}", 1)
    except (SecretKeyError, SecretsError, OSError) as exc:
        return _fail(str(exc))
    db = Database(settings)
    try:
        await _check_schema(db, settings, role="target", migrate_empty=False)
        print(f"importing into {settings.redacted_database_url()} ...", file=sys.stderr,
              flush=True)
        importer = Importer(db, settings, secrets, args.on_conflict)
        stopped = None
        with progress_bar("import", None) as advance:
            importer.progress = advance
            try:
                summary = await importer.run(items)
            except ImportStopped as exc:
                summary, stopped = importer.summary, exc
            except (OSError, ValueError, KeyError, TypeError) as exc:
                # Another store's data that is not what its library writes.
                summary, stopped = importer.summary, ImportStopped(args.source, repr(exc))
    finally:
        await db.dispose()
        if stream is not None and stream is not sys.stdin.buffer:
            stream.close()
    for line in summary.lines():
        print(line, file=sys.stderr)
    for key_id, count in sorted(summary.unreadable.items()):
        key = f"key {key_id}" if key_id != "?" else "a key"
        print(f"warning: the secrets of {count} MCP servers are sealed with {key}, which "
              f"{keys_source(settings)} does not open: put that key in AGENTSTATE_SECRET_KEYS "
              f"(after the current one) to read them ({FROM_SQLITE} they were exported from)",
              file=sys.stderr)
    for line in summary.refused:
        print(f"refused: {line}", file=sys.stderr)
    for line in notes:
        print(f"not imported: {line}", file=sys.stderr)
    if stopped is not None:
        print(f"stopped at {stopped}", file=sys.stderr)
    return 1 if summary.refused or notes or stopped is not None else 0


# --- copy --------------------------------------------------------------------------------


def _run_copy(args: argparse.Namespace) -> int:
    return asyncio.run(_copy(args))


async def _copy(args: argparse.Namespace) -> int:
    from app.db.engine import Database
    from app.portability.copy import copy, count_records, verify
    from app.portability.progress import progress_bar
    from app.portability.reader import ImportStopped

    source_settings, target_settings = (_settings(database_url=args.source),
                                        _settings(database_url=args.target))
    if source_settings.database_url == target_settings.database_url:
        return _fail("--from and --to name the same database.")
    source, target = Database(source_settings), Database(target_settings)
    try:
        await _check_schema(source, source_settings, role="source", migrate_empty=False)
        await _check_schema(target, target_settings, role="target", migrate_empty=True)
        print(f"copying {source_settings.redacted_database_url()} to "
              f"{target_settings.redacted_database_url()} ...", file=sys.stderr, flush=True)
        total = await count_records(source)
        try:
            with progress_bar("copy", total) as advance:
                summary = await copy(source, target, target_settings, args.on_conflict,
                                     advance)
        except ImportStopped as exc:
            return _fail(f"stopped at {exc}", 1)
        for line in summary.lines():
            print(line, file=sys.stderr)
        for line in _sealed_elsewhere(summary, source_settings, target_settings):
            print(f"warning: {line}", file=sys.stderr)
        for line in summary.refused:
            print(f"refused: {line}", file=sys.stderr)
        if args.no_verify:
            return 1 if summary.refused else 0
        print("verifying ...", file=sys.stderr, flush=True)
        result = await verify(source, target)
    finally:
        await source.dispose()
        await target.dispose()
    for line in result.differences:
        print(f"differs: {line}", file=sys.stderr)
    if result.differences:
        print(f"verification failed: {len(result.differences)} differences", file=sys.stderr)
        return 1
    print(f"verified: {result.threads} threads and {result.records} records are the same in "
          "both databases (counts and a checksum per thread)", file=sys.stderr)
    return 1 if summary.refused else 0


def _sealed_elsewhere(summary: Summary, source: Settings, target: Settings) -> list[str]:
    """What to tell of copied secrets the target's keys do not open: which key seals them
    (the source's key file, when that is where the source's key comes from) and the
    variable that gives it to the target's server."""
    from app.core.secretbox import key_file_path, keys_source

    lines = []
    source_file = None if source.secret_keys else key_file_path(source)
    for key_id, count in sorted(summary.unreadable.items()):
        where = f"the secrets of {count} MCP servers are sealed with"
        if key_id != "?" and source_file is not None:
            lines.append(
                f"{where} the source database's key, {source_file} (key {key_id}), which "
                f"{keys_source(target)} does not open. Start the target's server with "
                f"AGENTSTATE_SECRET_KEYS=$(cat {source_file}) (after its own key, if it has "
                "one), or it cannot read them; keep that file: no other key opens them")
        elif key_id != "?":
            lines.append(f"{where} key {key_id}, which {keys_source(target)} does not open: "
                         "put it in AGENTSTATE_SECRET_KEYS to read them")
        else:
            lines.append(f"{where} a key that neither {keys_source(target)} nor "
                         f"{keys_source(source)} (the source's) opens: put the key that sealed "
                         "them in AGENTSTATE_SECRET_KEYS to read them")
    return lines


# --- backup ------------------------------------------------------------------------------


def _run_backup(args: argparse.Namespace) -> int:
    from app.core.secretbox import key_file_path
    from app.db.backup import BackupError, backup

    settings = Settings()
    try:
        result = backup(settings.database_url, Path(args.path))
    except BackupError as exc:
        return _fail(str(exc))
    print(f"backed up {settings.redacted_database_url()} to {result.path} ({result.pages} "
          f"pages, {result.bytes} bytes, schema {result.schema})", file=sys.stderr)
    key_file = key_file_path(settings)
    if key_file is not None and key_file.exists() and not settings.secret_keys:
        print(f"note: the key that opens MCP server secrets is {key_file}, not in the "
              "backup; keep a copy of it with the backup.", file=sys.stderr)
    return 0
