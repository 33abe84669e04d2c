"""A route's request handling worked out once, for the requests FastAPI would accept.

FastAPI's handler solves a route's dependencies anew on every request: for each parameter it
looks up the parameter's aliases, whether its type is a sequence and whether it is a
parameter model, through `typing` introspection, about 100 Python calls a parameter, and
about 60 more a level of dependencies (docs/PERFORMANCE.md, "A cheaper request"). A
`RoutePlan` asks those questions once, when the route is built, and keeps the answers: per
request it reads each path and query parameter, validates it with the parameter's own
validator, calls the dependencies in FastAPI's order and the endpoint, and builds the
response as FastAPI does.

It answers only what FastAPI would accept. Any parameter or body that does not validate,
a body that was not JSON, or dependency overrides (tests) hand the request to FastAPI's
own handler before anything has been called, so every error is FastAPI's, word for word.
Reading and validating have no side effects, so the order (all values first, then the
dependencies) changes no answer: FastAPI calls the dependencies first and reports the
values' errors after, and a dependency that raises is called the same in both.

A route is planned only when it is plain: coroutine endpoint and dependencies, one level of
dependencies below the endpoint (none with dependencies of their own), path and query
parameters only (no headers, cookies or parameter models: the units of work read their
headers themselves, `DeclaredHeader`), at most one body parameter, not embedded and not a
form, the default response class, no background tasks or security scopes. Any other route
keeps FastAPI's handler (`plan_of` returns None).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from contextlib import asynccontextmanager
from copy import deepcopy
from dataclasses import dataclass
from typing import Any

import fastapi.routing
from fastapi import params
from fastapi.datastructures import DefaultPlaceholder
from fastapi.dependencies.models import Dependant
from fastapi.responses import JSONResponse
from fastapi.routing import serialize_response
from fastapi.utils import is_body_allowed_for_status_code
from pydantic import Json
from starlette.requests import Request
from starlette.responses import Response

# Where BodyLimitMiddleware leaves the parsed body: a 1-tuple, so a JSON `null` body counts
# (app/http/routing.py's `ParsedRequest` reads it too).
PARSED_BODY = "agentstate.json"

Handler = Callable[[Request], Coroutine[Any, Any, Response]]


class _Refused(Exception):
    """A value FastAPI would not accept: its handler answers the request."""


try:  # FastAPI's own rule for "read every value of a repeated query parameter"
    from fastapi._compat import field_annotation_is_sequence
except ImportError:  # a FastAPI that moved it: plan no route that asks
    field_annotation_is_sequence = None  # type: ignore[assignment]

# FastAPI's serialisation takes what a plan passes it (asked once, not per route).
_SERIALIZES = {"field", "response_content", "include", "exclude", "by_alias", "exclude_unset",
               "exclude_defaults", "exclude_none", "is_coroutine", "dump_json"
               } <= set(inspect.signature(serialize_response).parameters)


def _is_sequence(annotation: Any) -> bool:
    if field_annotation_is_sequence is None:
        raise _Refused
    return bool(field_annotation_is_sequence(annotation))


_IMMUTABLE = (type(None), bool, int, float, str, bytes)


@dataclass(frozen=True)
class _Param:
    """One path or query parameter: where to find it, and its FastAPI field."""

    name: str
    alias: str
    in_query: bool
    many: bool
    field: Any  # fastapi's ModelField
    required: bool
    validate_default: bool
    # The default, when it is a value nothing can change (FastAPI copies it per request).
    default: Any
    fixed_default: bool

    @classmethod
    def of(cls, field: Any) -> _Param:
        info = field.field_info
        # One name to look up (FastAPI's `_get_param_aliases` gives more for alias choices or
        # a field config), and no parameter model.
        alias = getattr(field, "validation_alias", None) or field.alias
        if not isinstance(info, params.Path | params.Query) or not isinstance(alias, str) \
                or info.validation_alias not in (None, alias) or getattr(field, "config", None) \
                or (inspect.isclass(info.annotation) and hasattr(info.annotation,
                                                                 "model_fields")):
            raise _Refused
        in_query = isinstance(info, params.Query)
        many = in_query and _is_sequence(info.annotation) and not any(
            type(item) is Json for item in info.metadata)
        required = info.is_required()
        default = None if required else field.default
        fixed = info.default_factory is None and type(default) in _IMMUTABLE
        return cls(field.name, alias, in_query, many, field, required,
                   bool(info.validate_default), default, fixed)

    def value(self, request: Request) -> Any:
        if not self.in_query:
            raw: Any = request.path_params.get(self.alias)
        elif self.many:
            raw = request.query_params.getlist(self.alias) or None
        else:
            query = request.query_params
            # Not `get`: Mapping's raises and catches a KeyError for an absent parameter.
            raw = query[self.alias] if self.alias in query else None  # noqa: SIM401
        if raw is None:
            if self.required:
                raise _Refused
            raw = self.default if self.fixed_default else deepcopy(self.field.default)
            if not self.validate_default:
                return raw
        value, errors = self.field.validate(raw, {}, loc=("query" if self.in_query else "path",
                                                          self.alias))
        if errors:
            raise _Refused
        return value


@dataclass(frozen=True)
class _Call:
    """A dependant: its callable, its parameters, and where the request and the response
    go among its arguments."""

    call: Callable[..., Any]
    name: str | None
    params: tuple[_Param, ...]
    request_name: str | None
    response_name: str | None
    generator: bool
    function_scope: bool

    @classmethod
    def of(cls, dependant: Dependant, *, endpoint: bool) -> _Call:
        call = dependant.call
        if call is None or dependant.header_params or dependant.cookie_params \
                or dependant.websocket_param_name or dependant.http_connection_param_name \
                or dependant.background_tasks_param_name or dependant.security_scopes_param_name \
                or getattr(dependant, "concurrency", None) is not None \
                or (dependant.body_params and not endpoint) \
                or (dependant.dependencies and not endpoint):
            raise _Refused
        target = call if inspect.isroutine(call) else getattr(call, "__call__", None)  # noqa: B004
        generator = inspect.isasyncgenfunction(target)
        if not (generator or inspect.iscoroutinefunction(target)) or (generator and endpoint):
            raise _Refused
        return cls(call, dependant.name,
                   tuple(_Param.of(field) for field in (*dependant.path_params,
                                                        *dependant.query_params)),
                   dependant.request_param_name, dependant.response_param_name, generator,
                   getattr(dependant, "scope", None) == "function")

    def arguments(self, request: Request) -> dict[str, Any]:
        return {param.name: param.value(request) for param in self.params}


class RoutePlan:
    """`route`'s request handling, worked out once (see the module's docstring)."""

    def __init__(self, route: Any) -> None:  # an APIRoute or FastAPI's effective copy
        dependant = route.dependant
        self.endpoint = _Call.of(dependant, endpoint=True)
        self.dependencies = tuple(_Call.of(sub, endpoint=False)
                                  for sub in dependant.dependencies)
        calls = [sub.call for sub in self.dependencies]
        if len(set(map(id, calls))) != len(calls):
            raise _Refused  # FastAPI calls a repeated dependency once: not planned here
        body = dependant.body_params
        if len(body) > 1 or (body and (getattr(route, "_embed_body_fields", True)
                                       or getattr(body[0].field_info, "embed", None)
                                       or isinstance(body[0].field_info, params.Form))):
            raise _Refused
        self.body = body[0] if body else None
        if not _SERIALIZES or not isinstance(route.response_class, DefaultPlaceholder) \
                or route.response_class.value is not JSONResponse:
            raise _Refused
        self.route = route

    def values(self, request: Request) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Each dependency's arguments and the endpoint's, validated (`_Refused` if FastAPI
        would not accept one)."""
        provider = self.route.dependency_overrides_provider
        if getattr(provider, "dependency_overrides", None):
            raise _Refused
        arguments = [dependency.arguments(request) for dependency in self.dependencies]
        values = self.endpoint.arguments(request)
        if self.body is not None:
            parsed = request.scope.get(PARSED_BODY)
            media = request.headers.get("content-type", "").lower()
            if parsed is None or not media.lstrip().startswith("application/"):
                raise _Refused  # FastAPI reads such a body as bytes, or finds none
            value, errors = self.body.validate(parsed[0], {}, loc=("body",))
            if errors:
                raise _Refused
            values[self.body.name] = value
        return arguments, values

    async def run(self, request: Request, arguments: list[dict[str, Any]],
                  values: dict[str, Any]) -> Response:
        """The dependencies in FastAPI's order, the endpoint, and FastAPI's response."""
        response = Response()
        del response.headers["content-length"]
        response.status_code = None  # type: ignore[assignment]
        for dependency, given in zip(self.dependencies, arguments, strict=True):
            solved = await self._call(dependency, request, response, given)
            if dependency.name is not None:
                values[dependency.name] = solved
        if self.endpoint.request_name:
            values[self.endpoint.request_name] = request
        if self.endpoint.response_name:
            values[self.endpoint.response_name] = response
        raw = await self.endpoint.call(**values)
        if isinstance(raw, Response):
            return raw
        route = self.route
        status = route.status_code or response.status_code
        if response.status_code:
            status = response.status_code
        args: dict[str, Any] = {} if status is None else {"status_code": status}
        dump_json = route.response_field is not None
        content = await serialize_response(
            field=route.response_field, response_content=raw,
            include=route.response_model_include, exclude=route.response_model_exclude,
            by_alias=route.response_model_by_alias,
            exclude_unset=route.response_model_exclude_unset,
            exclude_defaults=route.response_model_exclude_defaults,
            exclude_none=route.response_model_exclude_none, is_coroutine=True,
            dump_json=dump_json)
        answer = (Response(content=content, media_type="application/json", **args) if dump_json
                  else JSONResponse(content, **args))
        if not is_body_allowed_for_status_code(answer.status_code):
            answer.body = b""
        answer.headers.raw.extend(response.headers.raw)
        return answer

    @staticmethod
    async def _call(dependency: _Call, request: Request, response: Response,
                    given: dict[str, Any]) -> Any:
        if dependency.request_name:
            given[dependency.request_name] = request
        if dependency.response_name:
            given[dependency.response_name] = response
        if not dependency.generator:
            return await dependency.call(**given)
        # FastAPI's generator dependencies end with the request's stack, or with the
        # handler's when declared `scope="function"`.
        stack = request.scope["fastapi_function_astack" if dependency.function_scope
                              else "fastapi_inner_astack"]
        return await stack.enter_async_context(asynccontextmanager(dependency.call)(**given))


def effective_route(route: Any) -> Any:
    """What FastAPI builds `route`'s handler from: since 0.165, a route included in a router
    has an effective copy (the including routers' prefix, dependencies and overrides) that
    `get_route_handler` finds in a context variable; before, the route itself."""
    context = getattr(fastapi.routing, "_effective_route_context_var", None)
    effective = context.get() if context is not None else None
    return effective if getattr(effective, "original_route", None) is route else route


def plan_of(route: Any) -> RoutePlan | None:
    """The route's plan; None where FastAPI's handler must do all of it."""
    try:
        return RoutePlan(route)
    except _Refused:
        return None


def planned(plan: RoutePlan | None, fallback: Handler) -> Handler:
    """A handler that runs `plan` for what it accepts and `fallback` (FastAPI's) otherwise."""
    if plan is None:
        return fallback

    async def handler(request: Request) -> Response:
        try:
            arguments, values = plan.values(request)
        except _Refused:
            return await fallback(request)
        return await plan.run(request, arguments, values)

    return handler
