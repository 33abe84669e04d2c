"""The statements every write runs, executed straight on asyncpg (Postgres's driver).

SQLAlchemy's execution layer (the compiled cache lookup, an execution context, parameter
and result processing, the cursor adapter, a greenlet switch) costs about 150 us of CPU a
statement over what asyncpg itself spends, and an append runs five or six statements: about
a fifth of the server's work per write (docs/PERFORMANCE.md). The repositories keep building
their statements with SQLAlchemy, once, at import; for the hot ones they call this module
instead of `connection.execute`. With asyncpg it compiles each statement once per parameter
shape with the engine's dialect, through SQLAlchemy's public `construct_expanded_state`
(the SQL text, the order of its `$n` parameters and their bind processors: the same ones
SQLAlchemy applies, so JSON is serialised by the engine's serializer and `UTCDateTime` is
checked), and sends it on the request's asyncpg connection, inside the transaction
SQLAlchemy manages: it is begun here if no statement has begun it yet, and committed or
rolled back by the unit of work as always. Elsewhere (SQLite) it is `connection.execute`.

What SQLAlchemy would otherwise do around a statement is kept:
- the tenant guard (app/db/tenancy.py) checks each statement when it is first compiled;
- a driver error is translated and raised as the `sqlalchemy.exc.DBAPIError` SQLAlchemy
  would raise (a lost connection invalidated first), so app/http/problems.py answers as for
  any statement;
- the engine's `before_cursor_execute` and `after_cursor_execute` listeners see each
  statement (listeners on a single connection do not), and `handle_error` listeners a
  failed one, so statement tracing
  (bench/sqlcapture.py, OpenTelemetry's spans, app/http/tracing.py) sees every statement
  once. Their execution context is a `DirectContext`: no compiled statement (the tenant guard
  has checked it already); what the listeners return is not applied;
- rows come back as named tuples: by position, by attribute and through `_mapping`, like
  SQLAlchemy's `Row`, with each column's result processor applied.
"""

from __future__ import annotations

import weakref
from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from functools import partial
from typing import Any, TypeVar

from sqlalchemy import Connection
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine.base import ExceptionContextImpl
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.pool import QueuePool
from sqlalchemy.sql.dml import Insert

from app.db.tenancy import require_scoped

Params = Mapping[str, Any]
T = TypeVar("T")
# Where a positional parameter's value comes from: (the caller's parameter, its index in an
# expanding list or None, the bind processor), or (None, the processed value, None) for a
# constant the statement carries.
_Source = tuple[str, int | None, Callable[[Any], Any] | None] | tuple[None, Any, None]


class _Plan:
    __slots__ = ("processors", "row", "sources", "sql")

    def __init__(self, sql: str, sources: list[_Source], row: Any,
                 processors: list[Callable[[Any], Any] | None]) -> None:
        self.sql = sql
        self.sources = sources
        self.row = row
        self.processors = processors if any(processors) else None

    def args(self, params: Params) -> list[Any]:
        out = []
        for name, index_or_constant, process in self.sources:
            if name is None:
                out.append(index_or_constant)
                continue
            value = (params[name] if index_or_constant is None
                     else params[name][index_or_constant])
            out.append(process(value) if process is not None else value)
        return out

    def rows(self, records: Sequence[Any]) -> list[Any]:
        # The named tuple's `_make` without its Python frame (a record has the statement's
        # columns, so its length check has nothing to find).
        make, processors = partial(tuple.__new__, self.row), self.processors
        if processors is None:
            return [make(record) for record in records]
        return [make([value if process is None else process(value)
                      for value, process in zip(record, processors, strict=True)])
                for record in records]


class _Row:
    """`Row`'s `_mapping`, for named tuples."""

    __slots__ = ()
    _fields: tuple[str, ...]

    @property
    def _mapping(self) -> dict[str, Any]:
        return dict(zip(self._fields, self, strict=True))  # type: ignore[call-overload]


def row_type(names: Sequence[str]) -> Any:
    """A named tuple type of these fields with `Row`'s `_mapping`: the rows this module
    returns, and records a statement returns inside a column (arrays of ROW(...))."""
    fields = namedtuple("Row", list(names), rename=True)  # type: ignore[misc]
    return type("Row", (_Row, fields), {"__slots__": ()})


# Per dialect (an engine's serializer is in its bind processors): each statement compiled
# once per INSERT column list, and planned once per length of its expanding lists. Only the
# statements repositories build once (at import, or in `functools.cache`d builders) come here,
# so both stay as small as the code that builds them.
_caches: weakref.WeakKeyDictionary[Any, tuple[dict[Any, Any], dict[Any, _Plan]]] = (
    weakref.WeakKeyDictionary())


def _plan(connection: AsyncConnection, stmt: Any, params: Params) -> _Plan:
    dialect = connection.dialect
    cache = _caches.get(dialect)
    if cache is None:
        cache = _caches[dialect] = ({}, {})
    compiled_by_key, plans = cache
    keys = tuple(params) if isinstance(stmt, Insert) else None
    key = (id(stmt), keys)
    found = compiled_by_key.get(key)
    if found is None:  # the entry holds `stmt`, so no other statement can take its id
        found = compiled_by_key[key] = _compile(dialect, stmt, keys)
    _, compiled, expanding = found
    shape = (*key, *(len(params[name]) for name in expanding))
    plan = plans.get(shape)
    if plan is None:
        plan = plans[shape] = _make_plan(dialect, stmt, compiled, params)
    return plan


def _compile(dialect: Any, stmt: Any,
             keys: tuple[str, ...] | None) -> tuple[Any, Any, tuple[str, ...]]:
    require_scoped(stmt)
    compiled = stmt.compile(dialect=dialect, column_keys=keys)
    expanding = tuple(name for name, bind in compiled.binds.items() if bind.expanding)
    return stmt, compiled, expanding


def _make_plan(dialect: Any, stmt: Any, compiled: Any, params: Params) -> _Plan:
    state = compiled.construct_expanded_state(dict(params))
    expanded = {part: (name, i) for name, parts in state.parameter_expansion.items()
                for i, part in enumerate(parts)}
    sources: list[_Source] = []
    for name in state.positiontup or ():
        origin, index = expanded.get(name, (name, None))
        process = state.processors.get(name)
        if process is None and name in compiled.binds:
            process = compiled.binds[name].type.dialect_impl(dialect).bind_processor(dialect)
        if origin in params:
            sources.append((origin, index, process))
        else:  # a value the statement carries (a literal, `revision + 1`)
            value = state.parameters[name]
            sources.append((None, process(value) if process else value, None))
    columns = list(stmt.selected_columns if hasattr(stmt, "selected_columns")
                   else stmt.exported_columns)
    row = row_type([c.key for c in columns])
    processors = [c.type.dialect_impl(dialect).result_processor(dialect, None) for c in columns]
    return _Plan(state.statement, sources, row, processors)


# The connection whose statements run alone, each committing by itself (`alone`), in the
# context of the request that said so: a context variable, so nothing of it stays with the
# connection when it goes back to the pool.
_ALONE: ContextVar[AsyncConnection | None] = ContextVar("agentstate_alone", default=None)


def alone(connection: AsyncConnection) -> bool:
    """Let `connection`'s next statements on this path run alone, outside a transaction
    (no BEGIN before them, no COMMIT after: each commits by itself), until `together`.
    Only where the direct path runs them and no transaction is open: else False, and
    nothing changes. SQLAlchemy is not told (its isolation level and its record of a
    transaction, set and reset through its events, cost more than the statement's own
    Python work), so a statement sent through SQLAlchemy still begins a transaction."""
    if idle(connection) is None or connection.in_transaction():
        return False
    _ALONE.set(connection)
    return True


def together(connection: AsyncConnection) -> None:
    """Back from `alone`: the next statement begins a transaction."""
    if running_alone(connection):
        _ALONE.set(None)


def running_alone(connection: AsyncConnection) -> bool:
    """`connection`'s statements run alone (`alone`), in this request."""
    return _ALONE.get() is connection


async def _adapter(connection: AsyncConnection, on_its_own: bool) -> Any:
    """SQLAlchemy's adapter of the request's asyncpg connection, in the transaction
    SQLAlchemy tracks (begun here if no statement has begun it). A read on Postgres runs in
    autocommit, and a write `alone` outside any transaction: neither has a transaction to
    track (one would be bookkeeping only, a trip through the greenlet and its events)."""
    sync = connection.sync_connection
    # Read without a round trip to the greenlet unless SQLAlchemy must reconnect first.
    fairy = (sync.connection if sync is not None and not sync.invalidated
             else await connection.get_raw_connection())
    adapter: Any = fairy.dbapi_connection
    if not (adapter.autocommit or on_its_own or connection.in_transaction()):
        await connection.begin()
    return adapter


class DirectContext:
    """The execution context SQLAlchemy's statement events get for a direct statement: none
    of SQLAlchemy's (no compiled statement, no cursor), but a listener may keep what it needs
    between the events on it, as OpenTelemetry keeps the statement's span."""

    compiled = None


async def _run(connection: AsyncConnection, plan: _Plan, args: Any, many: bool,
               call: Callable[[Any], Any]) -> Any:
    on_its_own = running_alone(connection)
    adapter = await _adapter(connection, on_its_own)
    sync = connection.sync_connection
    # The engine's listeners (statement tracing, the tenant guard), not the connection's:
    # its dispatch joins them anew for every connection, at each event's first use.
    events = sync.engine.dispatch if sync is not None else None
    context = DirectContext()
    try:
        # asyncpg's BEGIN, sent with the first statement as SQLAlchemy's cursor sends it (a
        # connection in autocommit has none); its errors are translated like the statement's.
        if adapter._transaction is None and not (adapter.autocommit or on_its_own):
            await adapter._start_transaction()
        if events is not None and events.before_cursor_execute:
            events.before_cursor_execute(sync, None, plan.sql, args, context, many)
        result = await call(adapter._connection)
        if events is not None and events.after_cursor_execute:
            events.after_cursor_execute(sync, None, plan.sql, args, context, many)
        return result
    except Exception as error:  # noqa: BLE001 - every error is translated, as SQLAlchemy does
        try:
            adapter._handle_exception(error)  # raises it as the DB-API error it maps to
        except Exception as translated:
            dialect = connection.dialect
            if not isinstance(translated, dialect.loaded_dbapi.Error):
                _failed(sync, plan, args, context, translated, None, False)
                raise  # not the driver's (an OSError): raised as SQLAlchemy raises it
            lost = dialect.is_disconnect(translated, adapter, None)
            raised = sa_exc.DBAPIError.instance(
                plan.sql, None, translated, dialect.loaded_dbapi.Error, hide_parameters=True,
                connection_invalidated=lost, dialect=dialect)
            _failed(sync, plan, args, context, translated, raised, lost)
            if lost:
                await connection.invalidate(translated)
            raise raised from error
    except BaseException as error:  # cancelled: the listeners hear of it too
        _failed(sync, plan, args, context, error, None, False)
        raise


def _failed(sync: Any, plan: _Plan, args: Any, context: Any, error: BaseException,
            raised: sa_exc.StatementError | None, lost: bool) -> None:
    """Tell SQLAlchemy's `handle_error` listeners that a direct statement failed, as
    SQLAlchemy tells them of its own."""
    if sync is None or not sync.dialect.dispatch.handle_error:
        return
    failure = ExceptionContextImpl(error, raised, sync.engine, sync.dialect, sync, None,
                                   plan.sql, args, context, lost, True, False)
    for listener in sync.dialect.dispatch.handle_error:
        listener(failure)


# The private members of SQLAlchemy's asyncpg adapter that `_run` uses, checked against
# SQLAlchemy 2.1.9 (pyproject.toml bounds the version to that series). A release that renames
# them sends every statement down SQLAlchemy's own path instead of failing requests; the
# start-up log says so (`fallback_reason`), and tests/test_direct.py fails.
_MEMBERS = ("_transaction", "_start_transaction", "_handle_exception", "_connection",
            "autocommit")


def _missing_members() -> tuple[str, ...]:
    from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_connection as adapter

    return tuple(name for name in _MEMBERS if not hasattr(adapter, name))


_MISSING = _missing_members()
_SUPPORTED = not _MISSING


def fallback_reason(dialect: Any) -> str | None:
    """Why the hot writes on this dialect take SQLAlchemy's path although its driver is
    asyncpg (None: they take the direct one, or the driver is not asyncpg)."""
    if _SUPPORTED or dialect.driver != "asyncpg":
        return None
    import sqlalchemy

    return (f"SQLAlchemy {sqlalchemy.__version__}'s asyncpg adapter has no "
            f"{', '.join(_MISSING)}")


def _direct(connection: AsyncConnection) -> bool:
    return _SUPPORTED and connection.dialect.driver == "asyncpg"


def idle(connection: AsyncConnection) -> Connection | None:
    """`connection`'s Connection if ending SQLAlchemy's transaction on it, or changing its
    isolation level, sends nothing to the database: asyncpg with no transaction of the
    driver's open (one SQLAlchemy began in autocommit is bookkeeping only). Nothing in those
    then waits, so they are called in place, with no trip through SQLAlchemy's greenlet."""
    if not _direct(connection):
        return None
    sync = connection.sync_connection
    if sync is None or sync.closed or sync.invalidated:
        return None
    driver = sync.connection.dbapi_connection
    return sync if driver._transaction is None else None  # type: ignore[union-attr]


async def in_place(connection: AsyncConnection, fn: Callable[[Connection], T]) -> T:
    """`connection.run_sync(fn)` for what sends nothing where `connection` is `idle` (a
    commit with no transaction begun): then called in place, with no trip through the
    greenlet."""
    sync = idle(connection)
    return fn(sync) if sync is not None else await connection.run_sync(fn)


def closes_quietly(connection: AsyncConnection) -> bool:
    """Whether closing `connection` sends nothing to the database, so runs to its end in one
    step that no cancellation can interrupt: `idle`, and returned into a queue pool with room
    for it (a full one closes the connection). SQLAlchemy's own `async with` closes in a
    task of its own, shielded, in case it waits: a task and a turn of the event loop more on
    every request."""
    sync = idle(connection)
    pool = sync.engine.pool if sync is not None else None
    return isinstance(pool, QueuePool) and pool.checkedin() < pool.size()


async def rows(connection: AsyncConnection, stmt: Any, params: Params) -> list[Any]:
    """`(await connection.execute(stmt, params)).all()`."""
    if not _direct(connection):
        return list((await connection.execute(stmt, params)).all())
    plan = _plan(connection, stmt, params)
    args = plan.args(params)
    records = await _run(connection, plan, args, False,
                         lambda driver: driver.fetch(plan.sql, *args))
    return plan.rows(records)


async def first(connection: AsyncConnection, stmt: Any, params: Params) -> Any:
    """`(await connection.execute(stmt, params)).first()`."""
    found = await rows(connection, stmt, params)
    return found[0] if found else None


async def execute(connection: AsyncConnection, stmt: Any, params: Params) -> None:
    """`await connection.execute(stmt, params)` of a statement that returns no rows."""
    if not _direct(connection):
        await connection.execute(stmt, params)
        return
    plan = _plan(connection, stmt, params)
    args = plan.args(params)
    await _run(connection, plan, args, False,
               lambda driver: driver.execute(plan.sql, *args))


async def execute_many(connection: AsyncConnection, stmt: Any,
                       params: Sequence[Params]) -> None:
    """`await connection.execute(stmt, params)` of a list of parameter sets, no rows back."""
    if not _direct(connection) or not params:
        await connection.execute(stmt, list(params))
        return
    plan = _plan(connection, stmt, params[0])
    args = [plan.args(one) for one in params]
    await _run(connection, plan, args, True,
               lambda driver: driver.executemany(plan.sql, args))
