"""One transaction per request, opened and closed here and nowhere else.

The write dependency commits *before* the response is sent (`scope="function"`), so a failed
commit becomes an error response and can never follow a 2xx. Services only flush.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncSession

from app.events.service import flush_events


async def _read_session(request: Request) -> AsyncIterator[AsyncSession]:
    # Closing rolls back: a read never leaves a transaction open.
    async with request.app.state.db.read_sessions() as session:
        yield session


async def _write_session(request: Request) -> AsyncIterator[AsyncSession]:
    db = request.app.state.db
    async with db.writer(), db.write_sessions() as session:
        try:
            yield session
            await flush_events(session)
            await session.commit()
        except BaseException:
            await session.rollback()
            raise


ReadSession = Annotated[AsyncSession, Depends(_read_session, scope="function")]
WriteSession = Annotated[AsyncSession, Depends(_write_session, scope="function")]
