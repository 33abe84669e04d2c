"""Checks run before a server says "ready", and the banner it says it with.

A misconfiguration (a database that does not exist, a wrong password, a schema never migrated,
keys that cannot open the stored secrets) is found here, at start, and reported in one line
that names the cause and the fix, instead of by the first request as a 500.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from app.core.secretbox import (
    FROM_SQLITE,
    SecretBox,
    SecretKeyError,
    keys_source,
    load_secret_box,
    secrets_status,
)
from app.core.settings import Settings
from app.db import direct, migrate
from app.db.diagnosis import diagnose
from app.db.engine import Database
from app.mcp_servers.repository import StoredSecretsRepository

log = logging.getLogger("agentstate")

# Exit statuses: a restart cannot fix a misconfiguration, so the unit must not loop on it
# (deploy/agentstate.container: RestartPreventExitStatus=2). Anything else may be transient.
EXIT_MISCONFIGURED = 2
EXIT_FAILED = 1
# Causes a restart will not cure; the database being away for a moment is not one of them.
# Set by `agentstate serve` for its workers: the address the banner names.
LISTEN_ADDRESS = "AGENTSTATE_LISTEN_ADDRESS"
PERMANENT = {"database_missing", "database_auth_failed", "database_tls_failed",
             "database_pooler"}
# How many stored secrets the start-up opens (the oldest): enough to tell keys that open none
# from keys that open some, at a few milliseconds of work.
SECRETS_CHECKED = 1000


class StartupError(Exception):
    """Refuse to start; the message is one line saying what is wrong and how to fix it."""

    def __init__(self, message: str, exit_code: int = EXIT_MISCONFIGURED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def database_error(exc: BaseException, settings: Settings) -> StartupError | None:
    found = diagnose(exc, settings.database_url)
    if found is None:
        return None
    return StartupError(found.message,
                        EXIT_MISCONFIGURED if found.code in PERMANENT else EXIT_FAILED)


async def schema_revision(db: Database, settings: Settings) -> str | None:
    """Connect and read the schema revision, or StartupError naming why that failed."""
    try:
        async with asyncio.timeout(settings.database_timeout):
            return await migrate.current_revision(db.engine)
    except TimeoutError:
        raise StartupError(
            f"the database did not answer within {settings.database_timeout:g} s "
            "(AGENTSTATE_DATABASE_TIMEOUT)", EXIT_FAILED) from None
    except (SQLAlchemyError, OSError) as exc:
        error = database_error(exc, settings)
        if error is None:
            raise
        raise error from exc


async def check_schema(db: Database, settings: Settings) -> str | None:
    current = await schema_revision(db, settings)
    head = migrate.head_revision()
    if current != head:
        raise StartupError(f"schema is at {current or 'nothing'}, head is {head}: "
                           "run `agentstate migrate`", EXIT_FAILED)
    await check_timeouts(db, settings)
    return current


async def check_timeouts(db: Database, settings: Settings) -> None:
    """The statement timeout is in force on the connections requests get: a pooler that
    drops startup parameters (PgBouncer's ignore_startup_parameters) would otherwise lose it
    silently, and a write blocked on a lock would wait it out instead of answering 503."""
    found = await db.statement_timeout_ms()
    if found is not None and found != settings.statement_timeout_ms:
        raise StartupError(
            f"the database runs with statement_timeout={found} ms, not the "
            f"{settings.statement_timeout_ms} ms agentstate asked for: a pooler in front of it "
            "drops the settings sent at connect (PgBouncer's ignore_startup_parameters); "
            "set AGENTSTATE_DATABASE_POOLER=transaction (docs/SCALING.md)")


async def check_secrets(db: Database, box: SecretBox | None, settings: Settings) -> None:
    """Open the stored secrets (the oldest SECRETS_CHECKED) with the configured keys, so keys
    changed without `secrets rotate`, a lost key file, or data copied from another database
    without its key are said at start, in one line naming the key and the variable.

    Said, not refused: everything but reading those secrets still works (threads, messages
    and agent states do not wait on a key), and a database may hold secrets sealed under
    keys of other deployments (an import warns of them). A new key would not help: each
    line says to put back the key that sealed them.
    """
    async with db.read() as connection:
        rows = await StoredSecretsRepository(connection).ciphertexts_after(0, SECRETS_CHECKED)
    if not rows:
        return
    if box is None:
        log.warning(
            "MCP servers hold encrypted secrets (e.g. %s/%s), and no key is configured to open "
            "them: set AGENTSTATE_SECRET_KEYS to the key that sealed them (%s, e.g. "
            "AGENTSTATE_SECRET_KEYS=$(cat /path/to/secret.key)); a new key from `agentstate "
            "secrets new-key` cannot open them", rows[0].tenant_id, rows[0].server_name,
            FROM_SQLITE)
        return
    closed = [row for row in rows if box.key_id_of(row.secrets) is None]
    if not closed:
        return
    log.warning(
        "%s opens %s of the %d stored MCP secrets checked (e.g. not those of %s/%s): they were "
        "sealed with another key. Put that key in AGENTSTATE_SECRET_KEYS after the current "
        "one (AGENTSTATE_SECRET_KEYS=<current>,<old>; %s), then run `agentstate secrets "
        "rotate`", keys_source(settings),
        "none" if len(closed) == len(rows) else len(rows) - len(closed), len(rows),
        closed[0].tenant_id, closed[0].server_name, FROM_SQLITE)


def banner(settings: Settings, *, revision: str | None, secrets: str, auth: str,
           address: str | None) -> tuple[str, dict[str, object]]:
    """The "ready" line: the same facts in text and JSON logs."""
    from app import __version__

    facts: dict[str, object] = {
        "version": __version__,
        "address": address or "(not known)",
        "database": settings.redacted_database_url(),
        "schema_revision": revision,
        "auth": auth,
        "secrets": secrets,
    }
    text = (f"agentstate {__version__} ready on {facts['address']}: database "
            f"{facts['database']} at schema {revision}, {auth}, secrets {secrets}")
    return text, facts


async def start(app: Any, settings: Settings, db: Database) -> None:
    """The lifespan's start-up: migrate (SQLite), check, load the secrets key, log "ready".

    Served by `agentstate serve` (`app.state.strict_start`), a failed check stops the server
    with one line. An application built in-process (tests, embedding) starts anyway and
    reports the cause at /readyz, as it would when the database goes away later.
    """
    strict = getattr(app.state, "strict_start", False)
    try:
        app.state.secret_box = load_secret_box(settings)
    except SecretKeyError as error:
        raise StartupError(str(error)) from None
    fallback = direct.fallback_reason(db.engine.dialect)
    if fallback is not None:
        log.warning("the direct write path is off (%s): writes run through SQLAlchemy's "
                    "execution, and the direct path serves 1.2-1.4x their appends and state "
                    "writes a second (docs/PERFORMANCE.md); install the SQLAlchemy release "
                    "pyproject.toml names (sqlalchemy>=2.1.9,<2.2)", fallback)
    try:
        if settings.should_auto_migrate:
            try:
                await migrate.upgrade(db.engine)
            except (SQLAlchemyError, OSError) as exc:
                raise database_error(exc, settings) or exc from exc
        revision = await check_schema(db, settings)
        await check_secrets(db, app.state.secret_box, settings)
    except StartupError as error:
        if strict:
            log.error("%s", error)
            raise
        log.warning("not ready: %s", error)
        return
    if app.state.secret_box is None:
        log.warning("AGENTSTATE_SECRET_KEYS is not set: MCP server writes that carry secrets "
                    "are refused (503 secrets_not_configured); make a key with `agentstate "
                    "secrets new-key`")
    authenticator = app.state.authenticator
    auth = ("keys required" if authenticator.require_keys
            else "open on loopback until the first key exists")
    text, facts = banner(settings, revision=revision, secrets=secrets_status(settings),
                         auth=auth, address=os.environ.get(LISTEN_ADDRESS))
    log.info(text, extra=facts)
