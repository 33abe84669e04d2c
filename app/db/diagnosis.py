"""What went wrong with the database, in one line an operator can act on.

SQLAlchemy wraps the driver's exception (asyncpg's, sqlite3's, or an OSError from the socket)
once or twice; `diagnose()` walks the chain to the cause and names it with a stable `code`
(the problem `code` of a 503, and what /readyz reports) and a sentence saying how to fix it.
Messages name the database by its redacted URL and never carry SQL or its parameters.

`unavailable()` turns such a failure into the 503 a request is answered with. It is applied
where requests reach the database (`Database.read()` / `write()`, app/db/engine.py), so a
failure is the same 503 whatever reached the database first: a handler, a dependency, or the
API-key lookup of the body-limit middleware, which runs before any exception handler.
"""

from __future__ import annotations

import errno
import logging
import socket
import sqlite3
import ssl
from collections.abc import Iterator
from dataclasses import dataclass

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from app.core.errors import ServiceUnavailable

URL_SETTING = "AGENTSTATE_DATABASE_URL"
# Postgres SQLSTATE classes that mean "the database cannot serve this now", not a bug: 08
# connection exceptions, 53 insufficient resources (too many connections, disk full, out of
# memory) and 57P operator intervention (shutting down, starting up).
_UNAVAILABLE = ("08", "53", "57P")
# 40P01 deadlock (two batches taking the same rows in opposite orders), 40001 serialization
# failure: Postgres rolled the transaction back, and the same request retried succeeds.
_RETRY_NOW = ("40P01", "40001")
# Statements the database cancelled after a wait (a lock held by a stalled peer): the request
# may succeed when retried, so 503 + Retry-After, with a code of its own.
_TIMEOUTS = {"57014": "statement_timeout", "55P03": "lock_timeout"}
# What reaching the database can raise: the driver's errors as SQLAlchemy wraps them, the
# pool's wait for a connection, and the socket's own (asyncpg's connect raises OSError).
FAILURES = (DBAPIError, PoolTimeout, OSError)

log = logging.getLogger("agentstate.errors")


@dataclass(frozen=True)
class Diagnosis:
    code: str
    message: str


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo += [getattr(current, "orig", None), current.__cause__, current.__context__]


def _where(url: str) -> str:
    try:
        parsed = make_url(url)
    except ArgumentError:
        return "the database"
    if parsed.get_backend_name() == "sqlite":
        return f"the SQLite database {parsed.database}"
    host = parsed.host or parsed.query.get("host")  # libpq's ?host= (a socket directory)
    if isinstance(host, tuple):  # several hosts
        host = ",".join(host)
    if host and host.startswith("/"):
        return f"the socket {host}/.s.PGSQL.{parsed.port or 5432}"
    return f"{host or 'localhost'}:{parsed.port or 5432}"


def diagnose(exc: BaseException, url: str) -> Diagnosis | None:
    """The cause of a database failure, or None when it is not one we can name."""
    parsed_db = _database_name(url)
    for cause in _chain(exc):
        sqlstate = str(getattr(cause, "sqlstate", "") or "")
        text = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
        if sqlstate == "3D000":
            return Diagnosis("database_missing", f"database {parsed_db} does not exist: "
                             f"create it, or set {URL_SETTING}")
        if sqlstate in ("28000", "28P01"):
            return Diagnosis("database_auth_failed", f"{_where(url)} refused the login: {text}: "
                             f"check the user and password in {URL_SETTING}")
        if sqlstate == "42P01" or (isinstance(cause, sqlite3.OperationalError)
                                   and text.startswith("no such table")):
            return Diagnosis("schema_not_current", "the database schema is not current "
                             f"({text}): run `agentstate migrate`")
        if sqlstate == "53100" or _is_disk_full(cause):
            return Diagnosis("disk_full", f"{_where(url)}: disk full ({text}): free space "
                             "on its file system")
        if sqlstate == "25006" or _is_read_only(cause):
            return Diagnosis("read_only", f"{_where(url)} is read-only ({text}): "
                             "check the file system, its mount and the file's permissions"
                             if _is_sqlite(url) else f"{_where(url)} is read-only ({text}): "
                             "is it a standby? point AGENTSTATE_DATABASE_URL at the primary")
        if _is_write_error(cause):
            return Diagnosis("storage_error", f"{_where(url)}: cannot write ({text}): the "
                             "disk quota or the file size limit is reached, or the disk fails")
        if isinstance(cause, sqlite3.OperationalError) and "unable to open" in text:
            return Diagnosis("database_unavailable", f"cannot open {_where(url)}: check that "
                             "its directory exists and is writable")
        if sqlstate == "08P01" and "unsupported startup parameter" in text:
            return Diagnosis("database_pooler", f"{_where(url)} is a connection pooler that "
                             f"refused a setting agentstate sends at connect ({text}): set "
                             "AGENTSTATE_DATABASE_POOLER=transaction (docs/SCALING.md)")
        if sqlstate.startswith(("08", "57P")):
            return Diagnosis("database_unavailable", f"{_where(url)}: {text}")
        if sqlstate.startswith("53"):
            return Diagnosis("database_unavailable", f"{_where(url)}: {text}")
        if isinstance(cause, socket.gaierror):
            return Diagnosis("database_unavailable", f"cannot resolve the database host "
                             f"of {_where(url)}: check {URL_SETTING}")
        if "rejected SSL upgrade" in text:
            return Diagnosis("database_tls_failed", f"{_where(url)} does not offer TLS, which "
                             f"sslmode requires: set sslmode=prefer (or disable) in "
                             f"{URL_SETTING}, or turn on ssl in Postgres")
        if isinstance(cause, ssl.SSLError | ssl.CertificateError):
            return Diagnosis("database_tls_failed", f"TLS to {_where(url)} failed: {text}: "
                             "check sslmode and sslrootcert in " + URL_SETTING)
        if isinstance(cause, ConnectionRefusedError):
            return Diagnosis("database_unavailable", f"{_where(url)} refused the connection: "
                             "is the database running, and is the host and port right?")
        if isinstance(cause, TimeoutError | PoolTimeout):
            return Diagnosis("database_timeout", f"{_where(url)} did not answer in time")
        if isinstance(cause, ConnectionError | OSError):
            return Diagnosis("database_unavailable", f"{_where(url)}: {text}")
        if type(cause).__name__ in ("ConnectionDoesNotExistError", "InterfaceError",
                                    "InternalClientError", "ConnectionFailureError"):
            return Diagnosis("database_unavailable", f"{_where(url)}: {text}")
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return Diagnosis("database_unavailable", f"{_where(url)}: the connection was lost")
    return None


def _sqlstate(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)
    return str(getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None) or "")


def unavailable(exc: BaseException, url: str, retry_after: int,
                ) -> tuple[ServiceUnavailable, Diagnosis | None] | None:
    """The 503 (with `Retry-After`) that a failure to reach or use the database is answered
    with, and its diagnosis; None when the failure is not the database's (a bug: a 500).

    Logged here, once, as a warning; the statement and its parameters are never logged or
    returned."""
    if not isinstance(exc, FAILURES):
        return None
    sqlstate = _sqlstate(exc)
    found = diagnose(exc, url)
    if (isinstance(exc, DBAPIError) and not isinstance(exc, OperationalError | InterfaceError)
            and not (exc.connection_invalidated or sqlstate.startswith(_UNAVAILABLE)
                     or sqlstate in _TIMEOUTS or found is not None)):
        if sqlstate not in _RETRY_NOW:
            return None  # an integrity or programming error: ours to fix
        log.warning("transaction rolled back by the database: %s", sqlstate)
        return ServiceUnavailable(
            "The database rolled this request back to break a deadlock with another; "
            "nothing was written. Retry it.", headers={"Retry-After": "0"}), None
    log.warning("database unavailable: %s",
                found.message if found else f"{type(exc).__name__} {sqlstate}")
    error = ServiceUnavailable("The database is unavailable; retry shortly.",
                               headers={"Retry-After": str(retry_after)})
    if sqlstate in _TIMEOUTS:
        error.code = _TIMEOUTS[sqlstate]
        error.detail = ("The database cancelled the statement after waiting too long (a lock "
                        "held by another request, or a busy server); nothing was written. "
                        "Retry shortly.")
    elif found is not None and found.code != error.code:  # the cause, when it is known
        error.code, error.detail = found.code, found.message[:1].upper() + found.message[1:]
    return error, found


def _database_name(url: str) -> str:
    try:
        return make_url(url).database or "(none)"
    except ArgumentError:
        return "(unparsable URL)"


def _is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def _is_disk_full(cause: BaseException) -> bool:
    if isinstance(cause, OSError) and cause.errno == errno.ENOSPC:
        return True
    return isinstance(cause, sqlite3.Error) and (
        "disk is full" in str(cause) or getattr(cause, "sqlite_errorname", "") == "SQLITE_FULL")


def _is_read_only(cause: BaseException) -> bool:
    if isinstance(cause, OSError) and cause.errno == errno.EROFS:
        return True
    return isinstance(cause, sqlite3.Error) and (
        "readonly database" in str(cause)
        or str(getattr(cause, "sqlite_errorname", "")).startswith("SQLITE_READONLY"))


def _is_write_error(cause: BaseException) -> bool:
    """SQLite reports a full disk (ENOSPC) as SQLITE_FULL; any other failed write (EDQUOT,
    EFBIG past RLIMIT_FSIZE, EIO) as SQLITE_IOERR_WRITE / _FSYNC."""
    if isinstance(cause, OSError) and cause.errno in (errno.EDQUOT, errno.EFBIG, errno.EIO):
        return True
    return isinstance(cause, sqlite3.Error) and str(
        getattr(cause, "sqlite_errorname", "")) in ("SQLITE_IOERR_WRITE", "SQLITE_IOERR_FSYNC")
