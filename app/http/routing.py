"""The router and route classes every domain uses.

`DomainRouter` says at once, with one regular expression, when a path matches none of its
routes: FastAPI tries an application's routes one at a time, router by router (about 25
Python calls a route), and a store search came after 55 routes, a checkpoint read after 44.
The same expression names the first of its routes whose path matches; from there, the
first route whose path and method match is the route FastAPI would choose, and the router
hands the request to it as FastAPI (0.165) does, instead of trying its routes one at a
time twice (once to match, once to handle). A request no route takes fully (its 405, a
HEAD) and a FastAPI without these internals go through FastAPI's own matching.

`DomainRoute`, the route class of every `DomainRouter` and of the application's own routes
(FastAPI's documented way to change how a route handles its request, "Custom Request and
APIRoute class"):
- the handler reads the JSON body the body-limit middleware already parsed and checked,
  instead of parsing it again: it gets a `ParsedRequest`, whose `json()` returns the value
  `BodyLimitMiddleware` left in the scope (`PARSED_BODY`). A body the middleware did not
  parse (none) is parsed as before;
- the request's unit of work (app/http/dependencies.py) is entered on a `UnitSlot` the
  route keeps in the scope (`UNIT`) and exits when the handler has returned its response,
  before the response is sent: a write commits there, so a failed commit is the answer
  instead of the 2xx. A generator dependency would do the same at about 110 more Python
  calls a request;
- the handler runs the route's plan (app/http/plan.py) for what FastAPI would accept, and
  FastAPI's own handler for the rest.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

from fastapi import Request, Response
from fastapi.routing import APIRoute, APIRouter
from starlette._utils import get_route_path
from starlette.routing import Match
from starlette.types import Receive, Scope, Send

from app.http.plan import PARSED_BODY, effective_route, plan_of, planned

try:  # FastAPI 0.165's included routers, whose choice of a route `DomainRouter` repeats
    from fastapi.routing import (
        _FASTAPI_EFFECTIVE_ROUTE_CONTEXT_KEY,
        _SCOPE_MISSING,
        _get_fastapi_scope,
        _get_scope_included_router,
        _IncludedRouter,
        _restore_fastapi_scope_key,
        _update_scope,
    )
    from fastapi.telemetry._api import _route_selected

    _INTERNALS = True
except ImportError:  # another FastAPI: its own matching, every time
    _INTERNALS = False

# The request's `UnitSlot` for its unit of work (app/http/dependencies.py), exited when the
# handler has returned its response and before it is sent.
UNIT = "agentstate.unit"


T = TypeVar("T")


class UnitSlot:
    """Where a request's unit of work is entered (app/http/dependencies.py), for its route
    to exit when the handler has returned or raised, before the response is sent. One unit
    a request, which never suppresses an exception (an `AsyncExitStack` holding it cost
    about 30 Python calls a request)."""

    __slots__ = ("unit",)

    def __init__(self) -> None:
        self.unit: AbstractAsyncContextManager[Any] | None = None

    async def enter(self, unit: AbstractAsyncContextManager[T]) -> T:
        if self.unit is not None:
            raise RuntimeError("a request enters one unit of work")
        entered = await unit.__aenter__()
        self.unit = unit
        return entered

    def take(self) -> AbstractAsyncContextManager[Any] | None:
        """The unit entered, for its exit, and the slot lets go of it: the unit holds the
        request, whose scope holds the slot, and a cycle left behind would leave each
        request's objects to Python's cycle collector (a collection every few requests)."""
        unit, self.unit = self.unit, None
        return unit


class ParsedRequest(Request):
    async def json(self) -> Any:
        parsed = self.scope.get(PARSED_BODY)
        if parsed is not None:
            return parsed[0]
        return await super().json()


def build_route_contexts(app: Any) -> None:
    """Build now what FastAPI (0.165) builds at an included router's first request: each of
    its routes' effective context, a field per parameter and body (about 160 ms for the
    whole API on our 2-core machine). The first requests after a start then cost what later
    ones do. Nothing with another FastAPI."""
    if not _INTERNALS:
        return
    routers = [route for route in app.router.routes if isinstance(route, _IncludedRouter)]
    while routers:
        router = routers.pop()
        routers.extend(candidate for candidate in router.effective_candidates()
                       if isinstance(candidate, _IncludedRouter))
        router.effective_low_priority_routes()


class DomainRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = planned(plan_of(effective_route(self)), super().get_route_handler())

        async def domain_handler(request: Request) -> Response:
            slot = request.scope[UNIT] = UnitSlot()
            try:
                response = await handler(ParsedRequest(request.scope, request.receive))
            except BaseException as error:
                if (unit := slot.take()) is not None:
                    await unit.__aexit__(type(error), error, error.__traceback__)
                raise
            if (unit := slot.take()) is not None:
                await unit.__aexit__(None, None, None)
            return response

        return domain_handler


_NAMED_GROUP = re.compile(r"\(\?P<[^>]+>")
# The route `DomainRouter.matches` chose, for its `handle`: (router, route, its effective
# context, the child scope), at the top of the request's scope (a copy of the scope made
# to probe the routes keeps its own).
_SELECTED = "agentstate.selected_route"


class DomainRouter(APIRouter):
    """An `APIRouter` that answers "no match" for a path none of its routes' paths match
    (whatever the method), with one regular expression: the alternation of its routes'
    own, so the answer is the one trying each route would give. FastAPI (0.165) asks an
    included router whether it matches before trying its routes (where it flattened them,
    this is never asked, and costs nothing). Include it without a prefix: the routes'
    paths are all it knows. The alternative that matched names the first route whose path
    matches (module docstring)."""

    _any_path: re.Pattern[str] | None = None
    _built_for = -1  # len(self.routes) when _any_path was built
    _contexts: tuple[Any, dict[int, Any]] = (None, {})  # candidates -> {id(route): context}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("route_class", DomainRoute)  # every domain's routes
        super().__init__(*args, **kwargs)

    def _paths(self) -> re.Pattern[str] | None:
        if self._built_for != len(self.routes):
            patterns = [getattr(route, "path_regex", None) for route in self.routes]
            self._any_path = None if not patterns or None in patterns else re.compile("|".join(
                f"(?P<r{index}>{_NAMED_GROUP.sub('(?:', pattern.pattern)})"
                for index, pattern in enumerate(patterns) if pattern is not None))
            self._built_for = len(self.routes)
        return self._any_path

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] in ("http", "websocket"):
            paths = self._paths()
            path = get_route_path(scope)
            found = paths.match(path) if paths is not None else None
            if paths is not None and found is None:
                return Match.NONE, {}
            if found is not None and self._select(scope, path, int(str(found.lastgroup)[1:])):
                return Match.FULL, {}
        return super().matches(scope)

    def _select(self, scope: Scope, path: str, first: int) -> bool:
        """From `first`, the first of this router's routes whose path matches, FastAPI's
        choice: the first route in order whose path and method match (the others' paths
        are tried with their expressions alone). Matched by FastAPI as its
        `_IncludedRouter._match` matches one candidate, and kept for `handle`. False when
        FastAPI must choose: no route takes the method (its 405 or PARTIAL), or FastAPI
        does not match the chosen route fully after all."""
        if not _INTERNALS or scope["type"] != "http":
            return False
        method = scope["method"]
        for index in range(first, len(self.routes)):
            candidate = self.routes[index]
            if index != first and not candidate.path_regex.match(path):  # type: ignore[attr-defined]
                continue
            if method in (getattr(candidate, "methods", None) or ()):
                route = candidate
                break
        else:
            return False
        included = _get_scope_included_router(scope)
        if not isinstance(included, _IncludedRouter) or included.original_router is not self:
            return False
        context = self._context_of(included, route)
        if context is None:
            return False
        fastapi_scope = _get_fastapi_scope(scope)
        previous = fastapi_scope.get(_FASTAPI_EFFECTIVE_ROUTE_CONTEXT_KEY, _SCOPE_MISSING)
        fastapi_scope[_FASTAPI_EFFECTIVE_ROUTE_CONTEXT_KEY] = context
        try:
            match, child_scope = route.matches(scope)
        finally:
            _restore_fastapi_scope_key(scope, _FASTAPI_EFFECTIVE_ROUTE_CONTEXT_KEY, previous)
        if match != Match.FULL:
            return False
        scope[_SELECTED] = (self, route, context, child_scope)
        return True

    def _context_of(self, included: Any, route: Any) -> Any:
        """The effective context FastAPI built for `route` in this inclusion (None: not an
        `APIRoute` with one)."""
        candidates = included.effective_candidates()
        built, by_route = self._contexts
        if built is not candidates:
            by_route = {id(candidate.original_route): candidate for candidate in candidates
                        if isinstance(getattr(candidate, "original_route", None), APIRoute)}
            self._contexts = (candidates, by_route)
        return by_route.get(id(route))

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        selected = scope.pop(_SELECTED, None)
        if selected is None or selected[0] is not self:
            await super().handle(scope, receive, send)
            return
        # What FastAPI's `_IncludedRouter._handle_selected` does with the route it chose.
        _, route, context, child_scope = selected
        _update_scope(scope, child_scope)
        _route_selected(scope=scope, path=getattr(context.starlette_route, "path_format", None)
                        or context.path_format)
        _get_fastapi_scope(scope)[_FASTAPI_EFFECTIVE_ROUTE_CONTEXT_KEY] = context
        scope["route"] = route
        await route.handle(scope, receive, send)
