"""The request dependencies every router uses: settings, who is calling, and the unit of work.

One transaction per request is opened and closed here and nowhere else. The units are plain
dependencies: each enters its transaction on the unit slot the route keeps
(`app.http.routing.DomainRoute`), which exits it when the handler has returned. The write
unit then writes the request's audit events and commits *before* the response is sent, so a
failed commit becomes an error response and can never follow a 2xx. Services only execute
statements.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import TracebackType
from typing import Annotated, Any

from anyio import CancelScope
from fastapi import Depends, Request
from fastapi.security import HTTPBearer

from app.core.errors import Forbidden, InvalidHeader, Unauthorized
from app.core.principal import Principal
from app.core.revisions import Preconditions
from app.core.secretbox import SecretBox
from app.core.settings import Settings
from app.db.direct import in_place, together
from app.db.engine import Database
from app.db.tenancy import request_tenant
from app.db.unit import UnitOfWork
from app.events.feed import Feed
from app.events.repository import EventRepository
from app.http.params import DeclaredHeader
from app.http.plan import PARSED_BODY
from app.http.preconditions import CONDITIONS, THREAD_IF_MATCH, VALIDATOR, read_preconditions
from app.http.routing import UNIT, UnitSlot

# Set by app.http.middleware.BodyLimitMiddleware when it authenticated the request.
PRINCIPAL = "agentstate.principal"

# Every dependency is `async def`: FastAPI runs a plain `def` in its thread pool, a thread
# hop per request.


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


async def get_secret_box(request: Request) -> SecretBox | None:
    box: SecretBox | None = request.app.state.secret_box
    return box


SecretBoxDep = Annotated[SecretBox | None, Depends(get_secret_box)]

def bearer_token(authorizations: list[str]) -> str | None:
    """The token of the one `Authorization: Bearer` header; None when there is none. Several
    Authorization headers are a 400 (which one counts is not ours to guess)."""
    if len(authorizations) > 1:
        raise InvalidHeader("Send one Authorization header, not several.")
    if not authorizations:
        return None
    scheme, _, token = authorizations[0].strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("Use Authorization: Bearer <api key>.")
    return token.strip()


# The routes the LangGraph SDK calls (`get_client(url=<server>/langgraph)`, the store's
# `langgraph_router.py`): there the key may come as the SDK sends it, `x-api-key: <key>`.
SDK_PREFIX = "/langgraph/"


def request_token(path: str, authorizations: list[str], api_keys: list[str]) -> str | None:
    """The API key a request presents: its `Authorization: Bearer` token, or under
    `SDK_PREFIX` its one `x-api-key` header instead. Two different keys are a 400."""
    token = bearer_token(authorizations)
    if not path.startswith(SDK_PREFIX) or not api_keys:
        return token
    if len(api_keys) > 1:
        raise InvalidHeader("Send one x-api-key header, not several.")
    key = api_keys[0].strip()
    if not key:
        raise Unauthorized("The x-api-key header is empty.")
    if token is not None and token != key:
        raise InvalidHeader("Send the API key once: as x-api-key or as Authorization: Bearer.")
    return key


async def authenticate(app: Any, path: str, authorizations: list[str],
                       api_keys: list[str]) -> Principal:
    """The principal of a request's key headers (401 if no valid key where one is needed).
    Used by the body-limit middleware too, so a write is judged before its body."""
    principal: Principal = await app.state.authenticator.authenticate(
        app.state.db, request_token(path, authorizations, api_keys))
    return principal


async def _caller(request: Request) -> Principal:
    """The key's tenant and scopes (the body-limit middleware's answer when it had one);
    the anonymous owner of the default tenant when the server runs open (no keys exist).
    The tenant guard checks statements while it is set, until `request_tenant` is reset."""
    principal: Principal | None = request.scope.get(PRINCIPAL)
    if principal is None:
        principal = await authenticate(request.app, request.scope["path"],
                                       request.headers.getlist("authorization"),
                                       request.headers.getlist("x-api-key"))
    request_tenant.set(principal.tenant_id)
    return principal


class _Key(HTTPBearer):
    """A dependency that judges who is calling. An `HTTPBearer`, so the OpenAPI document
    declares the bearer scheme on every operation that depends on it, but it reads the key
    headers itself (`_caller`: errors are ours, and under `SDK_PREFIX` the key may come as
    `x-api-key`). The units of work below are keys too, and read the precondition headers
    they are built with (`declared_headers`, into `uow.preconditions`): the key, the
    preconditions and the transaction are one dependency, not three levels of them, on
    every request (docs/PERFORMANCE.md, "A cheaper request"). Each resets the tenant when it
    ends."""

    def __init__(self, *headers: DeclaredHeader) -> None:
        super().__init__(auto_error=False, scheme_name="ApiKey",
                         description="An API key from `agentstate keys create`.")
        self.declared_headers = headers


def _allowed(principal: Principal, scope: str) -> Principal:
    if not principal.can(scope):
        raise Forbidden(f"This API key lacks the {scope!r} scope.")
    return principal


class _Scoped(_Key):
    """The caller, who must hold `scope` (403 otherwise)."""

    def __init__(self, scope: str) -> None:
        super().__init__()
        self.scope = scope

    async def __call__(  # type: ignore[override]
        self, request: Request,
    ) -> AsyncIterator[Principal]:
        try:
            yield _allowed(await _caller(request), self.scope)
        finally:
            request_tenant.set(None)


_may_read, _may_write = _Scoped("read"), _Scoped("write")
ReadAccess = Annotated[Principal, Depends(_may_read)]
WriteAccess = Annotated[Principal, Depends(_may_write)]
# `dependencies=[WRITE_FIRST]` on a route whose body is parsed by a dependency of its own:
# the key is judged (401/403) before anything is said about the body.
WRITE_FIRST = Depends(_may_write)


async def get_database(request: Request) -> Database:
    db: Database = request.app.state.db
    return db


async def get_feed(request: Request) -> Feed:
    feed: Feed = request.app.state.feed
    return feed


DatabaseDep = Annotated[Database, Depends(get_database)]
FeedDep = Annotated[Feed, Depends(get_feed)]


class _Unit:
    """A request's unit of work, entered on its route's `UnitSlot`: a read, or a write
    transaction that commits, with its events, when the handler has returned (an exception
    from the handler leaves it uncommitted: rolled back). The tenant is reset when it ends.
    A class, not a generator: every request enters one."""

    __slots__ = ("_connected", "events", "pre", "principal", "request", "uow", "writes")

    def __init__(self, request: Request, principal: Principal, pre: Preconditions, *,
                 writes: bool, events: bool = True) -> None:
        self.request, self.principal, self.pre = request, principal, pre
        self.writes, self.events = writes, events

    async def __aenter__(self) -> UnitOfWork:
        app = self.request.app
        self._connected = app.state.db.write() if self.writes else app.state.db.read()
        try:
            connection = await self._connected.__aenter__()
        except BaseException:
            request_tenant.set(None)
            raise
        self.uow = UnitOfWork(connection, self.principal, app.state.settings, self.pre)
        return self.uow

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        committing = self.writes and error is None
        try:
            if committing:
                try:
                    await self._commit()
                except BaseException as failed:  # rolled back, and answered (a 503)
                    await self._connected.__aexit__(type(failed), failed, failed.__traceback__)
                    raise
            await self._connected.__aexit__(kind, error, traceback)
        finally:
            together(self.uow.connection)
            request_tenant.set(None)
        if committing and self.uow.events:
            # Number the committed events and wake watchers (docs/events.md): coalesced per
            # tenant and in the background, the response does not wait for it.
            feed: Feed = self.request.app.state.feed
            feed.written(self.principal.tenant_id)

    async def _commit(self) -> None:
        uow = self.uow
        if uow.settled():  # committed by its statement: the database's health hears of it
            self.request.app.state.db.committed()
            return
        with CancelScope(shield=True):  # what is committed is answered
            if self.events:
                await EventRepository(uow.connection, uow.tenant_id).append(
                    self.principal.actor, uow.events)
            # In place where there is nothing to send (no statement began a transaction).
            await in_place(uow.connection, lambda connection: connection.commit())


async def _judged(request: Request, scope: str,
                  headers: tuple[DeclaredHeader, ...]) -> tuple[Principal, Preconditions]:
    """The caller, who must hold `scope`, and the precondition headers the route reads; the
    tenant reset if either is refused (the unit resets it when it ends)."""
    try:
        return _allowed(await _caller(request), scope), read_preconditions(request, headers)
    except BaseException:
        request_tenant.set(None)
        raise


async def _open(request: Request, unit: _Unit) -> UnitOfWork:
    """Enter `unit` on the request's unit slot, which the route (`DomainRoute`) exits when
    the handler has returned (a write commits there, before the response is sent)."""
    slot: UnitSlot | None = request.scope.get(UNIT)
    if slot is None:
        raise RuntimeError(f"{request.scope['path']}: a unit of work needs the route class "
                           "DomainRoute")
    return await slot.enter(unit)


# Each judges the caller first: looking a key up may take a connection of its own, and
# requests holding theirs while they wait for it would empty the pool (50 first uses of one
# key did).
class _ReadUnit(_Key):
    async def __call__(self, request: Request) -> UnitOfWork:  # type: ignore[override]
        principal, pre = await _judged(request, "read", self.declared_headers)
        return await _open(request, _Unit(request, principal, pre, writes=False))


class _WriteUnit(_Key):
    async def __call__(self, request: Request) -> UnitOfWork:  # type: ignore[override]
        principal, pre = await _judged(request, "write", self.declared_headers)
        return await _open(request, _Unit(request, principal, pre, writes=True))


_TRUE = ("1", "on", "t", "true", "y", "yes")  # what a `bool` query parameter reads as true


def _asks_refresh(request: Request) -> bool:
    """`?refresh_ttl=true`, or `"refresh_ttl": true` in the JSON body."""
    if request.query_params.get("refresh_ttl", "").lower() in _TRUE:
        return True
    parsed: tuple[Any] | None = request.scope.get(PARSED_BODY)
    return parsed is not None and isinstance(parsed[0], dict) \
        and parsed[0].get("refresh_ttl") is True


class _RefreshingUnit(_Key):
    """A read that may restart the time to live of what it returns (the store's
    `refresh_ttl`): then a write transaction, committed before the response (bookkeeping, no
    events), under the read scope; otherwise a read."""

    async def __call__(self, request: Request) -> UnitOfWork:  # type: ignore[override]
        principal, pre = await _judged(request, "read", self.declared_headers)
        refreshing = _asks_refresh(request)
        return await _open(request, _Unit(request, principal, pre, writes=refreshing,
                                          events=not refreshing))


# A Core connection inside, not an ORM Session: repositories run Core statements only, and
# the Session's bookkeeping cost about 120 us a write (docs/PERFORMANCE.md).
Reader = Annotated[UnitOfWork, Depends(_ReadUnit())]
Writer = Annotated[UnitOfWork, Depends(_WriteUnit())]
RefreshingReader = Annotated[UnitOfWork, Depends(_RefreshingUnit())]
# With `uow.preconditions`: GET of a revisioned resource (304, 412), writes to one (RFC 9110
# section 13.2.2), writes to a thread's children (If-Match only, on the thread).
ConditionalReader = Annotated[UnitOfWork, Depends(_ReadUnit(*VALIDATOR))]
ConditionalRefreshingReader = Annotated[UnitOfWork, Depends(_RefreshingUnit(*VALIDATOR))]
ConditionalWriter = Annotated[UnitOfWork, Depends(_WriteUnit(*CONDITIONS))]
IfMatchWriter = Annotated[UnitOfWork, Depends(_WriteUnit(*THREAD_IF_MATCH))]
