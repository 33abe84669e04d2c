"""The router and route classes every domain uses.

`DomainRouter` says at once, with one regular expression, when a path matches none of its
routes: FastAPI tries an application's routes one at a time, router by router (about 25
Python calls a route), and a store search came after 55 routes, a checkpoint read after 44.

`DomainRoute`, the route class of every `DomainRouter` and of the application's own routes
(FastAPI's documented way to change how a route handles its request, "Custom Request and
APIRoute class"):
- the handler reads the JSON body the body-limit middleware already parsed and checked,
  instead of parsing it again: it gets a `ParsedRequest`, whose `json()` returns the value
  `BodyLimitMiddleware` left in the scope (`PARSED_BODY`). A body the middleware did not
  parse (none) is parsed as before;
- the request's unit of work (app/http/dependencies.py) is entered on an exit stack the
  route keeps in the scope (`UNIT`) and closes when the handler has returned its response,
  before the response is sent: a write commits there, so a failed commit is the answer
  instead of the 2xx. A generator dependency would do the same at about 110 more Python
  calls a request;
- the handler runs the route's plan (app/http/plan.py) for what FastAPI would accept, and
  FastAPI's own handler for the rest.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine
from contextlib import AsyncExitStack
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute, APIRouter
from starlette._utils import get_route_path
from starlette.routing import Match
from starlette.types import Scope

from app.http.plan import PARSED_BODY, effective_route, plan_of, planned

# The request's exit stack for its unit of work (app/http/dependencies.py), closed when the
# handler has returned its response and before it is sent.
UNIT = "agentstate.unit"


class ParsedRequest(Request):
    async def json(self) -> Any:
        parsed = self.scope.get(PARSED_BODY)
        if parsed is not None:
            return parsed[0]
        return await super().json()


class DomainRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = planned(plan_of(effective_route(self)), super().get_route_handler())

        async def domain_handler(request: Request) -> Response:
            async with AsyncExitStack() as unit:
                request.scope[UNIT] = unit
                return await handler(ParsedRequest(request.scope, request.receive))

        return domain_handler


_NAMED_GROUP = re.compile(r"\(\?P<[^>]+>")


class DomainRouter(APIRouter):
    """An `APIRouter` that answers "no match" for a path none of its routes' paths match
    (whatever the method), with one regular expression: the alternation of its routes'
    own, so the answer is the one trying each route would give. FastAPI (0.165) asks an
    included router whether it matches before trying its routes (where it flattened them,
    this is never asked, and costs nothing). Include it without a prefix: the routes'
    paths are all it knows."""

    _any_path: re.Pattern[str] | None = None
    _built_for = -1  # len(self.routes) when _any_path was built

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("route_class", DomainRoute)  # every domain's routes
        super().__init__(*args, **kwargs)

    def _paths(self) -> re.Pattern[str] | None:
        if self._built_for != len(self.routes):
            patterns = [getattr(route, "path_regex", None) for route in self.routes]
            self._any_path = None if not patterns or None in patterns else re.compile("|".join(
                f"(?:{_NAMED_GROUP.sub('(?:', pattern.pattern)})" for pattern in patterns
                if pattern is not None))
            self._built_for = len(self.routes)
        return self._any_path

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] in ("http", "websocket"):
            paths = self._paths()
            if paths is not None and paths.match(get_route_path(scope)) is None:
                return Match.NONE, {}
        return super().matches(scope)
