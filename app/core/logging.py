"""JSON-lines logging with the request id on every line.

Only what we choose goes into a line: method, route, status, duration. Never bodies, never
headers (Authorization, cookies), never query strings, never SQL parameters.
"""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from datetime import UTC, datetime

request_id_var: ContextVar[str | None] = ContextVar("request_id", default=None)

_RESERVED = set(vars(logging.makeLogRecord({}))) | {"color_message"}


class JsonFormatter(logging.Formatter):
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
        JsonFormatter() if fmt == "json" else logging.Formatter("%(levelname)s %(name)s %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # uvicorn's own access log prints query strings; ours (agentstate.access) does not.
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    logging.getLogger("alembic").setLevel(logging.WARNING)
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
