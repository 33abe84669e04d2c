"""JSON-lines logging with the request id on every line.

Only what we choose goes into a line: method, route, status, duration. Never bodies, never
headers (Authorization, cookies), never query strings, never SQL parameters.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

request_id_var: ContextVar[str | None] = ContextVar("request_id", default=None)

_RESERVED = set(vars(logging.makeLogRecord({}))) | {"color_message"}


# Loggers of the database layers: at DEBUG they print statements with their values.
QUIET = ("sqlalchemy", "asyncpg", "aiosqlite")
_DATABASE_MODULES = ("sqlalchemy", "asyncpg", "aiosqlite", "sqlite3")


def _database_error(exc: BaseException | None) -> BaseException | None:
    """The driver or SQLAlchemy error in an exception's chain, if there is one."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if type(exc).__module__.split(".")[0] in _DATABASE_MODULES:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def safe_exception_text(exc_info: tuple[type[BaseException], BaseException, object] | tuple[
        None, None, None]) -> str | None:
    """A traceback whose database error is named by class and SQLSTATE only: the messages of
    drivers and SQLAlchemy carry the statement's values ("[parameters: ...]", Postgres'
    "DETAIL: Failing row contains (...)"), which are state contents. None: format as usual."""
    exc = exc_info[1]
    found = _database_error(exc)
    if exc is None or found is None:
        return None
    stack = "".join(traceback.format_tb(exc.__traceback__))
    orig = getattr(found, "orig", None) or found
    sqlstate = getattr(orig, "sqlstate", None) or getattr(orig, "sqlite_errorname", None)
    return (f"Traceback (most recent call last):\n{stack}{type(found).__module__}."
            f"{type(found).__qualname__} ({type(orig).__name__}, {sqlstate or 'no sqlstate'}); "
            "its message is not logged: it may hold the statement's values")


class TextFormatter(logging.Formatter):
    def formatException(self, ei: Any) -> str:
        return safe_exception_text(ei) or super().formatException(ei)


class JsonFormatter(logging.Formatter):
    def formatException(self, ei: Any) -> str:
        return safe_exception_text(ei) or super().formatException(ei)

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": datetime.fromtimestamp(record.created, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        request_id = request_id_var.get()
        if request_id:
            line["request_id"] = request_id
        line.update({k: v for k, v in vars(record).items() if k not in _RESERVED})
        if record.exc_info:
            line["exc_type"] = record.exc_info[0].__name__ if record.exc_info[0] else ""
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure_logging(level: str = "INFO", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if fmt == "json" else TextFormatter("%(levelname)s %(name)s %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # uvicorn's own access log prints query strings; ours (agentstate.access) does not.
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    logging.getLogger("alembic").setLevel(logging.WARNING)
    for name in QUIET:  # never statements or their values, whatever the level
        logging.getLogger(name).setLevel(logging.WARNING)
    if level.upper() != "DEBUG":
        logging.getLogger("uvicorn.error").addFilter(_drop_startup_tracebacks)
    access = logging.getLogger("uvicorn.access")
    access.handlers[:] = []
    access.propagate = False
    access.disabled = True


def _drop_startup_tracebacks(record: logging.LogRecord) -> bool:
    """A refused start-up (app/ops/startup.py) has logged its one line already; uvicorn's
    copy of the traceback says nothing more (it is kept at DEBUG)."""
    message = record.getMessage()
    return not (message.startswith("Traceback") and "StartupError" in message)
