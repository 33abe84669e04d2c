"""The engine and the connections requests run on, built once per application in the lifespan."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import stat
import time
from contextvars import ContextVar
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn

from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import InvalidatePoolError, MissingGreenlet
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import QueuePool
from sqlalchemy.util import await_

from app.core.errors import ServiceUnavailable
from app.core.jsonutil import dumps, sqlite_contains, sqlite_json_equal
from app.core.settings import Settings, data_dir, sqlite_file
from app.db.diagnosis import FAILURES, Diagnosis, unavailable
from app.db.direct import closes_quietly

_LAST_USED = "agentstate_last_used"
# Execution option that marks a connection as the write transaction of a request.
WRITE = "agentstate_write"


def build_engine(settings: Settings) -> AsyncEngine:
    url = make_url(settings.database_url)
    # hide_parameters: an error's message never carries the statement's values (state).
    common: dict[str, Any] = {"json_serializer": dumps, "pool_pre_ping": settings.pool_pre_ping,
                              "hide_parameters": True}
    if url.get_backend_name() == "sqlite":
        if sqlite_file(url.database, url.query) is not None and not url.query.get("uri"):
            _private_file(Path(url.database or "").expanduser())
        engine = create_async_engine(
            url, pool_size=settings.pool_size, max_overflow=settings.max_overflow,
            pool_timeout=settings.pool_timeout, **common,
        )
        _configure_sqlite(engine, settings)
        return engine
    from app.core.pgurl import translate

    query, from_url = translate(url.query)
    url = url.set(query=query)
    server_settings = {
        "application_name": "agentstate",
        "statement_timeout": str(settings.statement_timeout_ms),
        # A client that stalls inside a transaction (a partition) cannot hold row locks
        # for longer than this: the server ends its session.
        "idle_in_transaction_session_timeout": str(settings.idle_in_transaction_timeout_ms),
        **from_url.pop("server_settings", {}),
    }
    per_transaction: dict[str, str] = {}
    if settings.pooled:
        # A transaction pooler refuses startup parameters (PgBouncer takes application_name
        # and a few others), and a server connection's session belongs to whoever holds it
        # next: every setting is set again in each transaction, with SET LOCAL.
        per_transaction = {name: value for name, value in server_settings.items()
                           if name != "application_name"}
        server_settings = {"application_name": server_settings["application_name"]}
        from_url.update(POOLED_CONNECT_ARGS,
                        connection_class=_per_transaction_connection(per_transaction))
    # The last resort for a statement that never returns: `database_timeout` beyond the
    # statement timeout (none when statements may run for ever, as migrations do). A
    # partition is found sooner, by TCP (see _detect_partitions).
    command_timeout = (settings.statement_timeout_ms / 1000 + settings.database_timeout
                       if settings.statement_timeout_ms else None)
    engine = create_async_engine(
        url,
        pool_size=settings.pool_size,
        max_overflow=settings.max_overflow,
        # The connection checked in last is checked out first: the one a checkout in place
        # (`checkout_in_place`) puts back is the one the checkout that follows takes.
        pool_use_lifo=True,
        pool_recycle=settings.pool_recycle,
        pool_timeout=settings.pool_timeout,
        connect_args={
            "timeout": min(settings.connect_timeout, settings.database_timeout),
            "command_timeout": command_timeout,
            **from_url,
            "server_settings": server_settings,
        },
        **{**common, "pool_pre_ping": False},
    )
    _detect_partitions(engine, settings.database_timeout)
    _connect_in_place(engine)
    if settings.pool_pre_ping:
        _ping_on_checkout(engine, settings.pool_ping_idle_seconds, settings.database_timeout)
    return engine


# Through a transaction pooler a prepared statement may not outlive its transaction: the next
# transaction of the same client may run on another server connection, and the server
# connection goes on to other clients with whatever was prepared on it. asyncpg's cache off
# (its statements, the direct path's included, use the unnamed statement, replaced by the
# next one), SQLAlchemy's cache off, and SQLAlchemy's explicit prepares unnamed too. Every
# statement then costs a Parse round trip before its Bind, inside its transaction (the
# server connection stays the client's until the transaction ends).
POOLED_CONNECT_ARGS: dict[str, Any] = {
    "statement_cache_size": 0,
    "prepared_statement_cache_size": 0,
    "prepared_statement_name_func": lambda: "",
}
_SETTING_NAME = re.compile(r"^[a-z_][a-z0-9_.]*$")


def _per_transaction_connection(values: dict[str, str]) -> type[Any]:
    """An asyncpg connection class whose every BEGIN also `SET LOCAL`s `values`: the same
    simple-query message, so the same round trip (`BEGIN; SET LOCAL ...; SET LOCAL ...`).

    Every transaction begins in asyncpg's `Transaction.start`, which sends `BEGIN ...;` with
    `Connection.execute`: SQLAlchemy's adapter and the direct path (app/db/direct.py) both
    begin that way. A connection in autocommit begins nothing, which is why reads run in
    transactions through a pooler (`Database`). `connection_class` is asyncpg's own
    extension point.
    """
    import asyncpg  # type: ignore[import-untyped]  # no stubs

    for name in values:
        if not _SETTING_NAME.match(name):
            raise ValueError(f"{name!r} is not a Postgres setting name")
    suffix = " ".join(f"SET LOCAL {name} = '{value.replace(chr(39), chr(39) * 2)}';"
                      for name, value in values.items())

    class PerTransactionSettings(asyncpg.Connection):  # type: ignore[misc]
        __slots__ = ()

        async def execute(self, query: str, *args: Any, timeout: float | None = None) -> Any:
            if not args and query.startswith("BEGIN") and query.endswith(";"):
                query = f"{query} {suffix}"
            return await super().execute(query, *args, timeout=timeout)

    return PerTransactionSettings


def _private_file(path: Path) -> None:
    """Create the SQLite database file (and its directory) readable by its owner only: every
    conversation is in it. SQLite gives its -wal and -shm files the database file's mode."""
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
    if path.parent == data_dir() and stat.S_IMODE(path.parent.stat().st_mode) & 0o077:
        path.parent.chmod(0o700)  # the embedded default's data directory, made before 0.2
    if not path.exists():
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            pass  # another process made it first


def _detect_partitions(engine: AsyncEngine, seconds: float) -> None:
    """TCP keepalives and TCP_USER_TIMEOUT on every Postgres connection (libpq's `keepalives`
    and `tcp_user_timeout`, which asyncpg does not offer).

    When the network between us and Postgres silently drops packets, a request waiting for a
    statement's answer would wait for the command timeout (statement timeout + slack), and
    one sending for the kernel's retransmission limit (about 15 minutes). With these, the
    kernel gives up on the connection once the peer has not acknowledged anything for
    `seconds`, while a statement that runs long on a healthy connection is unaffected (the
    peer's kernel answers the keepalive probes).
    """
    interval = max(1, int(seconds / 3))

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        driver = getattr(dbapi_connection, "driver_connection", None)
        transport = getattr(driver, "_transport", None)
        sock = transport.get_extra_info("socket") if transport is not None else None
        if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return  # a unix socket has no network to lose
        options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
        for name, value in (("TCP_KEEPIDLE", interval), ("TCP_KEEPINTVL", interval),
                            ("TCP_KEEPCNT", 3), ("TCP_USER_TIMEOUT", int(seconds * 1000))):
            if hasattr(socket, name):
                options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
        for level, option, value in options:
            try:
                sock.setsockopt(level, option, value)
            except OSError:
                pass  # not on this platform; the command timeout still bounds the wait


def _ping_on_checkout(engine: AsyncEngine, idle_seconds: float, timeout: float) -> None:
    """`pool_pre_ping` in at most one round trip, and none for a connection in steady use.

    SQLAlchemy's asyncpg ping wraps a prepared `;` in BEGIN/ROLLBACK (three round trips, on
    every checkout). Here a connection the database closed (a restart, `pg_terminate_backend`)
    is seen without a round trip: the event loop has already read its EOF, so asyncpg reports
    it closed. Only a connection idle for `idle_seconds` is also pinged, with a simple-query
    `SELECT 1`, for what no EOF announces (a half-open TCP connection behind a NAT or a
    failover). As with pre-ping, a connection that fails either check discards the pool's
    older connections and the checkout retries on a new one. In a checkout in place
    (`checkout_in_place`), where nothing may wait, a check to act on is only noted.
    """
    sync_engine = engine.sync_engine

    @event.listens_for(sync_engine, "connect")
    @event.listens_for(sync_engine, "checkin")
    def _used(_dbapi_connection: Any, record: Any) -> None:
        if record is not None and not _IN_PLACE.get():  # one put back unpinged stays due
            record.info[_LAST_USED] = time.monotonic()

    @event.listens_for(sync_engine, "checkout")
    def _ping(_dbapi_connection: Any, record: Any, proxy: Any) -> None:
        driver = proxy.driver_connection
        closed = driver.is_closed()
        if not closed and time.monotonic() - record.info.get(_LAST_USED, 0.0) < idle_seconds:
            return
        deferred = _IN_PLACE.get()
        if deferred is not None:
            deferred.append("closed" if closed else "ping")
            return
        if closed:
            raise InvalidatePoolError("connection was closed by the database")
        try:
            # Bounded: through a partition the ping must not wait out the command timeout.
            await_(driver.execute("SELECT 1", timeout=timeout))
        except Exception as exc:  # any failure means "not usable"
            raise InvalidatePoolError("connection failed its ping") from exc


# Set during a checkout in place: what the checkout listener would have sent, left undone.
_IN_PLACE: ContextVar[list[str] | None] = ContextVar("agentstate_in_place", default=None)


class _WouldConnect(Exception):
    """A checkout in place came to open a connection (the pool's entry had none, or one to
    replace)."""


def _connect_in_place(engine: AsyncEngine) -> None:
    """A connect in a checkout in place is refused before asyncpg is called (a refused
    `await_` would leave its coroutine never awaited, and Python warns of that)."""

    @event.listens_for(engine.sync_engine, "do_connect")
    def _connecting(*_: Any) -> None:
        if _IN_PLACE.get() is not None:
            raise _WouldConnect


def checkout_in_place(engine: AsyncEngine) -> AsyncConnection | None:
    """`await engine.connect()` with no trip through SQLAlchemy's greenlet, where checking a
    pooled connection out sends nothing: one is waiting in the pool, in use within
    `pool_ping_idle_seconds` and younger than `pool_recycle`. None where it would send or
    wait (a connection to open, ping or replace, none free): the caller then connects as
    usual, on the same pool entry.

    A greenlet costs more than the rest of the checkout: a 16 KiB stack for its first Python
    frame, mapped and unmapped each time, and the event loop's C stack copied out and back
    (docs/PERFORMANCE.md). What SQLAlchemy does in it is done in place, up to what would send
    or wait:
    - a connection to open (the pool's entry has none, or one past `pool_recycle`, which
      SQLAlchemy closes first with asyncpg's `terminate`: its Terminate message sent, the
      server's end not awaited): the `do_connect` listener raises `_WouldConnect` before
      asyncpg is called, and SQLAlchemy puts the entry back as after any failed connect
      (anything else that would wait raises `MissingGreenlet` at SQLAlchemy's `await_`,
      before it is sent);
    - a connection closed by the database or idle past `pool_ping_idle_seconds`: the ping
      listener notes it instead of acting, and the connection goes back on top of the pool
      (LIFO), where the caller's own checkout takes it and pings it.
    """
    pool = engine.sync_engine.pool
    if not isinstance(pool, QueuePool) or pool.checkedin() == 0:
        return None  # it would open a connection or wait for one
    deferred: list[str] = []
    token = _IN_PLACE.set(deferred)
    try:
        try:
            sync = engine.sync_engine.connect()
        except (_WouldConnect, MissingGreenlet):
            return None
        if deferred:  # back on top of the pool, for the caller's checkout to take
            sync.close()
            return None
    finally:
        _IN_PLACE.reset(token)
    return AsyncConnection(engine, sync)


def _configure_sqlite(engine: AsyncEngine, settings: Settings) -> None:
    """WAL, foreign keys, a busy timeout, and BEGIN IMMEDIATE for writes.

    A deferred transaction that reads and then writes cannot wait for the write lock (SQLite
    answers "database is locked" at once to avoid a deadlock), so write transactions take the
    lock up front with BEGIN IMMEDIATE and queue on the busy timeout instead of failing.
    """

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we emit BEGIN ourselves, below
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={int(settings.sqlite_busy_timeout_ms)}")
        cursor.execute(f"PRAGMA synchronous={settings.sqlite_synchronous}")
        cursor.close()
        dbapi_connection.create_function(
            "agentstate_json_contains", 2, sqlite_contains, deterministic=True
        )
        dbapi_connection.create_function(
            "agentstate_json_equal", 2, sqlite_json_equal, deterministic=True)

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(connection: Any) -> None:
        mode = "IMMEDIATE" if connection.get_execution_options().get(WRITE) else "DEFERRED"
        connection.exec_driver_sql(f"BEGIN {mode}")


class Connected:
    """`Database.read()` and `write()`: an async context manager of a connection (a class,
    not a generator: every request enters one)."""

    __slots__ = ("_connection", "_db", "_engine", "_lock")

    def __init__(self, db: Database, engine: AsyncEngine, lock: asyncio.Lock | None) -> None:
        self._db, self._engine, self._lock = db, engine, lock

    async def __aenter__(self) -> AsyncConnection:
        if self._lock is not None:
            await self._lock.acquire()
        connected = False
        try:
            self._connection = ((self._db.in_place and checkout_in_place(self._engine))
                                or await self._engine.connect())
            connected = True
        except FAILURES as exc:
            self._db.raise_answer(exc)
        finally:
            if not connected and self._lock is not None:
                self._lock.release()
        return self._connection

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        _traceback: TracebackType | None) -> None:
        try:
            await _close(self._connection)
        except FAILURES as exc:
            self._db.raise_answer(exc)
        finally:
            if self._lock is not None:
                self._lock.release()
        if isinstance(error, FAILURES):  # a statement's, answered as the connect's
            self._db.raise_answer(error)


async def _close(connection: AsyncConnection) -> None:
    """Close `connection`: at once where that cannot wait (`closes_quietly`), else as
    `async with` does, to its end even if the request is cancelled meanwhile."""
    sync = connection.sync_connection
    if sync is not None and closes_quietly(connection):
        sync.close()  # nothing in it waits: no trip through SQLAlchemy's greenlet
    else:
        await connection.__aexit__(None, None, None)


class Database:
    """The engine and the request connections; one per running application."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.engine = build_engine(settings)
        # Postgres reads run in autocommit: under READ COMMITTED every statement takes its
        # own snapshot even inside a transaction, so BEGIN/ROLLBACK around a read only cost
        # two round trips. SQLite keeps its deferred transaction: there it pins a snapshot.
        # Through a transaction pooler they run in transactions too: outside one, the pooler
        # may give a statement's Bind another server connection than its Parse, and the
        # per-transaction settings (the statement timeout) would not apply.
        self._reads = (self.engine if self.engine.dialect.name == "sqlite" or settings.pooled
                       else self.engine.execution_options(isolation_level="AUTOCOMMIT"))
        # Begun by the first statement like any connection, but as BEGIN IMMEDIATE on SQLite.
        # On Postgres the engine itself: a derived engine's connections look their event
        # listeners up through both engines', on every statement.
        self._writes = (self.engine.execution_options(**{WRITE: True})
                        if self.engine.dialect.name == "sqlite" else self.engine)
        # SQLite has one writer at a time anyway. Queueing this process's writers on an
        # asyncio lock (first come, first served) instead of SQLite's busy handler, which
        # sleeps and polls with growing back-off, keeps the write latency tail short; other
        # processes still queue on the busy timeout.
        self._write_lock = asyncio.Lock() if self.engine.dialect.name == "sqlite" else None
        # Connections checked out without SQLAlchemy's greenlet where that sends nothing
        # (`checkout_in_place`): asyncpg's, unless every checkout pings.
        self.in_place = (self.engine.dialect.driver == "asyncpg"
                         and not (settings.pool_pre_ping and settings.pool_ping_idle_seconds == 0))
        # A full disk or a read-only file seen by a write (app/db/diagnosis.py), reported by
        # /readyz until a write commits again: reads alone would not notice.
        self.storage_problem: Diagnosis | None = None
        event.listen(self.engine.sync_engine, "commit", lambda _connection: self.committed())

    def committed(self) -> None:
        """A write committed: a storage problem a write saw is over."""
        self.storage_problem = None

    def read(self) -> Connected:
        """A connection for reads. Closing it ends SQLite's read transaction; on Postgres
        each statement commits by itself. A database that cannot be reached or used is a
        503 `ServiceUnavailable` (see `unavailable`), from the connect to the last statement."""
        return Connected(self, self._reads, None)

    def write(self) -> Connected:
        """A write transaction, begun by its first statement; the caller commits. Anything
        not committed (an exception, an early return) is rolled back on the way out. Failures
        of the database are a 503, as in `read`. On SQLite it waits for the process's write
        lock first."""
        return Connected(self, self._writes, self._write_lock)

    def raise_answer(self, exc: BaseException) -> NoReturn:
        """Raise what a failure of the database is answered with: its 503 (`unavailable`),
        else `exc` itself (a bug)."""
        error = self.unavailable(exc)
        if error is None:
            raise exc
        raise error from exc

    def unavailable(self, exc: BaseException) -> ServiceUnavailable | None:
        """The 503 that this failure of the database is answered with (None: it is not one,
        a bug). A full disk, a read-only or a failing file system is also kept for /readyz."""
        answer = unavailable(exc, self.settings.database_url, self.settings.retry_after_seconds)
        if answer is None:
            return None
        error, found = answer
        if found is not None and found.code in ("disk_full", "read_only", "storage_error"):
            self.storage_problem = found
        return error

    async def statement_timeout_ms(self) -> int | None:
        """The statement timeout a read connection runs with (None on SQLite)."""
        if self.dialect != "postgresql":
            return None
        async with self.read() as connection:
            found = await connection.scalar(text(
                "SELECT setting FROM pg_settings WHERE name = 'statement_timeout'"))
        return int(found or 0)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    async def dispose(self) -> None:
        await self.engine.dispose()
