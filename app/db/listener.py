"""One dedicated Postgres connection per server process that LISTENs for feed wake-ups.

Watchers never hold a database connection while they wait: they wait on the in-process
`app.events.feed.Feed`, which this listener wakes for every `NOTIFY agentstate_events,
'<tenant>'` (sent by the sequencer when it numbers a tenant's events). If the connection is
lost, it reconnects with back-off and reports `on_reconnect`, since notifications sent
meanwhile are lost: the feed then wakes every watcher to read again.

A transaction pooler cannot carry a LISTEN (the session it runs in goes to the next client
at once), so through one the listener connects to AGENTSTATE_DIRECT_DATABASE_URL, and
without that there is no listener: the feed polls (`session_url`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import asyncpg  # type: ignore[import-untyped]  # no stubs; used for LISTEN only
from sqlalchemy.engine import make_url

from app.core.pgurl import translate
from app.core.settings import Settings

log = logging.getLogger("agentstate.feed")
CHANNEL = "agentstate_events"


def session_url(settings: Settings) -> str | None:
    """The URL for a connection that needs its session to itself (a LISTEN, a session's
    advisory lock and settings): the direct one when configured, else the database URL
    unless that goes through a transaction pooler (None: there is none)."""
    if settings.direct_database_url:
        return settings.direct_database_url
    return None if settings.pooled else settings.database_url


def connect_arguments(database_url: str) -> dict[str, Any]:
    """asyncpg.connect() arguments for a URL as the engine reads it: libpq's parameters
    (sslmode, options, ...) translated, several hosts with target_session_attrs kept."""
    url = make_url(database_url)
    query, translated = translate(url.query)
    url = url.set(query=query)
    _, arguments = url.get_dialect()().create_connect_args(url)
    arguments.pop("prepared_statement_cache_size", None)
    translated.pop("statement_cache_size", None)
    return {**arguments, **translated}


class Listener:
    def __init__(self, database_url: str, on_notify: Callable[[str], None],
                 on_reconnect: Callable[[], None], connect_timeout: float = 5.0) -> None:
        self.arguments = connect_arguments(database_url)
        self.on_notify = on_notify
        self.on_reconnect = on_reconnect
        self.connect_timeout = connect_timeout
        self._task: asyncio.Task[None] | None = None
        self._connection: asyncpg.Connection | None = None
        self.connected = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="agentstate-listener")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self._connection is not None and not self._connection.is_closed():
            await self._connection.close(timeout=2)

    def _notified(self, _connection: Any, _pid: int, _channel: str, payload: str) -> None:
        self.on_notify(payload)

    async def _run(self) -> None:
        delay = 0.1
        while True:
            lost = asyncio.Event()
            try:
                self._connection = await asyncpg.connect(**{
                    "timeout": self.connect_timeout, **self.arguments,
                    "server_settings": {**self.arguments.get("server_settings", {}),
                                        "application_name": "agentstate-listener"}})
                self._connection.add_termination_listener(lambda _c, lost=lost: lost.set())
                await self._connection.add_listener(CHANNEL, self._notified)
            except Exception as exc:  # noqa: BLE001 - whatever failed to connect: retry
                self.connected.clear()
                if self._connection is not None and not self._connection.is_closed():
                    self._connection.terminate()
                log.warning("feed listener cannot connect; retrying",
                            extra={"error": type(exc).__name__, "retry_in": delay})
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            delay = 0.1
            self.connected.set()
            # What was notified before we listened (or while we were away) is lost: every
            # watcher reads again.
            self.on_reconnect()
            while not lost.is_set() and not self._connection.is_closed():
                try:  # the EOF of a closed socket is seen here; no query is sent
                    await asyncio.wait_for(lost.wait(), 5.0)
                except TimeoutError:
                    pass
            self.connected.clear()
            log.warning("feed listener lost its connection; reconnecting")
            self.on_reconnect()
