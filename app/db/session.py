"""One transaction per request, opened and closed here and nowhere else.

The write dependency commits *before* the response is sent (`scope="function"`), so a failed
commit becomes an error response and can never follow a 2xx. Services only execute statements.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncConnection

from app.auth.dependencies import Principal, current_principal
from app.events.service import flush_events

# Both depend on the caller being authenticated first (FastAPI resolves `current_principal`
# once per request): looking a key up may take a connection of its own, and requests holding
# theirs while they wait for it would empty the pool (50 first uses of one key did).
Authenticated = Annotated[Principal, Depends(current_principal)]


async def _read_session(request: Request, _: Authenticated) -> AsyncIterator[AsyncConnection]:
    async with request.app.state.db.read() as connection:
        yield connection


async def _write_session(request: Request, _: Authenticated) -> AsyncIterator[AsyncConnection]:
    # An exception from the handler leaves the transaction uncommitted: rolled back.
    async with request.app.state.db.write() as connection:
        yield connection
        await flush_events(connection)
        await connection.commit()


# A Core connection, not an ORM Session: repositories run Core statements only, and the
# Session's bookkeeping cost about 120 us a write (docs/PERFORMANCE.md).
ReadSession = Annotated[AsyncConnection, Depends(_read_session, scope="function")]
WriteSession = Annotated[AsyncConnection, Depends(_write_session, scope="function")]
