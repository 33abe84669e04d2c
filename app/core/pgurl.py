"""libpq URL parameters (what managed Postgres providers hand out), translated for asyncpg.

`postgresql://u:p@host/db?sslmode=verify-full&sslrootcert=ca.pem&application_name=x` works
with psql; asyncpg takes none of those names as they are (SQLAlchemy passes the query string
to `asyncpg.connect()` as keyword arguments, so `sslmode` was a TypeError). Here each known
parameter becomes its asyncpg argument, and an unknown one is refused in one line naming it.
"""

from __future__ import annotations

import shlex
import ssl
from collections.abc import Mapping
from typing import Any

# Understood by SQLAlchemy's asyncpg dialect or by asyncpg itself: passed through as they are.
PASSTHROUGH = {"prepared_statement_cache_size", "ssl", "target_session_attrs", "host", "port"}
SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
TRANSLATED = {"sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword", "application_name",
              "options", "connect_timeout", "passfile"}
# Known to libpq, harmless to ignore here (asyncpg has no use for them).
IGNORED = {"client_encoding", "fallback_application_name", "keepalives", "keepalives_idle",
           "keepalives_interval", "keepalives_count", "sslcompression", "sslsni",
           "ssl_min_protocol_version", "channel_binding", "gssencmode"}


class UrlParameterError(ValueError):
    pass


def _one(value: str | tuple[str, ...]) -> str:
    return value[-1] if isinstance(value, tuple) else value


def check_parameters(query: Mapping[str, str | tuple[str, ...]]) -> None:
    """Refuse what cannot be translated; the message is the part after the setting's name."""
    known = PASSTHROUGH | TRANSLATED | IGNORED
    for name, raw in query.items():
        value = _one(raw)
        if name not in known:
            raise UrlParameterError(
                f"has the parameter {name}=, which agentstate does not understand; supported: "
                + ", ".join(sorted(PASSTHROUGH | TRANSLATED)))
        if name == "sslmode" and value not in SSLMODES:
            raise UrlParameterError(f"has sslmode={value}; use one of {', '.join(SSLMODES)}")
        if name == "connect_timeout":
            try:
                float(value)
            except ValueError:
                raise UrlParameterError("has a connect_timeout that is not a number of "
                                        "seconds") from None
        if name == "options":
            _server_options(value)
        if name == "prepared_statement_cache_size" and not value.isdigit():
            raise UrlParameterError("has a prepared_statement_cache_size that is not a whole "
                                    "number (0 turns the statement caches off)")


def _server_options(options: str) -> dict[str, str]:
    """`-c name=value` (and `--name=value`) pairs of libpq's `options`, as server settings."""
    settings: dict[str, str] = {}
    words = shlex.split(options)
    i = 0
    while i < len(words):
        word = words[i]
        if word == "-c" and i + 1 < len(words):
            pair, i = words[i + 1], i + 2
        elif (word.startswith("-c") and len(word) > 2) or word.startswith("--"):
            pair, i = word[2:], i + 1
        else:
            raise UrlParameterError(f"has options={options!r}; only `-c name=value` pairs "
                                    "are supported")
        name, sep, value = pair.partition("=")
        if not sep:
            raise UrlParameterError(f"has options with {pair!r}, which is not name=value")
        settings[name.replace("-", "_")] = value
    return settings


def _ssl_context(mode: str, params: Mapping[str, str]) -> ssl.SSLContext | str | bool:
    """libpq's sslmode as asyncpg's `ssl`: verify-* check the server against sslrootcert
    (the system's CAs without it); require encrypts without checking, as libpq does."""
    if mode == "disable":
        return False
    if mode in ("allow", "prefer") and not any(k in params for k in ("sslcert", "sslrootcert")):
        return mode
    context = ssl.create_default_context(cafile=params.get("sslrootcert"))
    if mode in ("require", "allow", "prefer") and "sslrootcert" not in params:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif mode in ("require", "verify-ca", "allow", "prefer"):
        # libpq: with a root certificate, `require` verifies the chain like verify-ca.
        context.check_hostname = False
    if "sslcert" in params:
        context.load_cert_chain(params["sslcert"], params.get("sslkey"),
                                params.get("sslpassword"))
    return context


def translate(query: Mapping[str, str | tuple[str, ...]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(what stays in the URL's query, asyncpg connect arguments) for a checked query."""
    check_parameters(query)
    params = {name: _one(value) for name, value in query.items()}
    keep = {name: value for name, value in query.items() if name in PASSTHROUGH}
    args: dict[str, Any] = {}
    server: dict[str, str] = {}
    if "sslmode" in params or "sslrootcert" in params or "sslcert" in params:
        mode = params.get("sslmode", "verify-full" if "sslrootcert" in params else "prefer")
        args["ssl"] = _ssl_context(mode, params)
    if "application_name" in params:
        server["application_name"] = params["application_name"]
    if "options" in params:
        server.update(_server_options(params["options"]))
    if "connect_timeout" in params:
        args["timeout"] = float(params["connect_timeout"])
    if "passfile" in params:
        args["passfile"] = params["passfile"]
    if "prepared_statement_cache_size" in params:
        # SQLAlchemy's cache; the hot writes use asyncpg's own (app/db/direct.py): the same size.
        args["statement_cache_size"] = int(params["prepared_statement_cache_size"])
    if server:
        args["server_settings"] = server
    return keep, args
