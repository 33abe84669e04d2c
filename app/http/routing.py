"""The route class every router uses: the handler reads the JSON body the body-limit
middleware already parsed and checked, instead of parsing it again.

FastAPI's documented way to change how a route reads its request ("Custom Request and
APIRoute class"): `ParsedBodyRoute` hands the handler a `ParsedRequest`, whose `json()`
returns the value `BodyLimitMiddleware` left in the scope (`PARSED_BODY`). A body the
middleware did not parse (none, or a route added without this class) is parsed as before.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

# Where BodyLimitMiddleware leaves the parsed body: a 1-tuple, so a JSON `null` body counts.
PARSED_BODY = "agentstate.json"


class ParsedRequest(Request):
    async def json(self) -> Any:
        parsed = self.scope.get(PARSED_BODY)
        if parsed is not None:
            return parsed[0]
        return await super().json()


class ParsedBodyRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def parsed_body_handler(request: Request) -> Response:
            return await handler(ParsedRequest(request.scope, request.receive))

        return parsed_body_handler
