"""libpq URL parameters become asyncpg's arguments (app/core/pgurl.py); unknown ones are refused.

The connection itself is proven in tests/test_startup.py (a real server on such a URL); here,
what each parameter turns into, including TLS, which the test Postgres does not offer.
"""

from __future__ import annotations

import ssl

import pytest
from pydantic import ValidationError
from sqlalchemy.engine import make_url

from app.core.pgurl import translate
from app.core.settings import Settings, describe_settings_error


def args_of(query: str) -> tuple[dict, dict]:
    return translate(make_url(f"postgresql+asyncpg://u@h/db?{query}").query)


def test_sslmodes() -> None:
    assert args_of("sslmode=disable")[1]["ssl"] is False
    assert args_of("sslmode=prefer")[1]["ssl"] == "prefer"
    required = args_of("sslmode=require")[1]["ssl"]
    assert isinstance(required, ssl.SSLContext)
    assert required.verify_mode == ssl.CERT_NONE and not required.check_hostname
    full = args_of("sslmode=verify-full")[1]["ssl"]
    assert full.verify_mode == ssl.CERT_REQUIRED and full.check_hostname
    ca = args_of("sslmode=verify-ca")[1]["ssl"]
    assert ca.verify_mode == ssl.CERT_REQUIRED and not ca.check_hostname


def test_server_settings_and_timeouts() -> None:
    keep, args = args_of("application_name=app&connect_timeout=7&options=-c%20a%3D1%20-cb%3D2"
                         "&prepared_statement_cache_size=0")
    assert keep == {"prepared_statement_cache_size": "0"}
    # SQLAlchemy's statement cache and asyncpg's own (app/db/direct.py) are both turned off.
    assert args == {"timeout": 7.0, "statement_cache_size": 0,
                    "server_settings": {"application_name": "app", "a": "1", "b": "2"}}


@pytest.mark.parametrize(("query", "message"), [
    ("sslfoo=1", "AGENTSTATE_DATABASE_URL has the parameter sslfoo="),
    ("sslmode=maybe", "AGENTSTATE_DATABASE_URL has sslmode=maybe; use one of"),
    ("connect_timeout=soon", "AGENTSTATE_DATABASE_URL has a connect_timeout that is not"),
    ("options=--x", "AGENTSTATE_DATABASE_URL has options with 'x'"),
    ("prepared_statement_cache_size=off",
     "AGENTSTATE_DATABASE_URL has a prepared_statement_cache_size that is not a whole number"),
])
def test_unknown_or_bad_parameters_are_one_line(query: str, message: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(database_url=f"postgresql://u:pw@h/db?{query}", _env_file=None)  # type: ignore[call-arg]
    described = describe_settings_error(refused.value)
    assert described.startswith(message) and "\n" not in described and "pw" not in described


@pytest.mark.anyio
@pytest.mark.postgres_only(reason="a Postgres session setting")
async def test_sessions_bound_idle_transactions(database_url: str) -> None:
    """A stalled client cannot hold row locks longer than the setting."""
    from sqlalchemy import text

    from app.db.engine import Database

    db = Database(Settings(database_url=database_url, idle_in_transaction_timeout_ms=45_000,
                           _env_file=None))  # type: ignore[call-arg]
    try:
        async with db.read() as connection:
            shown = await connection.scalar(text("SHOW idle_in_transaction_session_timeout"))
        assert shown == "45s"
    finally:
        await db.dispose()
