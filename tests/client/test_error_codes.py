"""Every error `code` the server can answer with has its own exception class in the client.

The mapping rule:

- The server's codes are found, not listed: every `AppError` subclass loaded once `app.main`
  has imported every slice (walking `__subclasses__()`, so an error moved into a slice or
  added later is covered without touching this file), the root `AppError` included.
- Each is raised by a route of a real application and rendered by the server's own
  handlers; `agentstate_client.errors.error_from_response` must turn that response into an
  instance of the client class dedicated to the code: `default_code` equal to the code and
  `status` equal to the status, so `except ThatClass` catches exactly that answer.
- A status-level code (`not_found`, `conflict`, `validation_failed`, `internal_error`, ...)
  is deliberately generic; its dedicated class is the status class (`NotFound`, `Conflict`,
  `UnprocessableEntity`, `InternalServerError`). Any other code that only reaches its status
  class is the factory's fallback for codes a client does not know, which is for older
  clients talking to newer servers, not for this client: the test fails and lists them.

Codes set on an instance rather than a class (`unknown_field` from request validation,
`method_not_allowed` for a framework 405) are not `AppError` subclasses and are pinned by
`tests/client/test_retries.py`.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import httpx
import pytest
from agentstate_client import errors as client_errors
from fastapi import FastAPI

import app.main  # builds the app from every slice, so every AppError subclass is loaded
from app.core.errors import AppError
from app.core.settings import Settings
from tests.support import ROOT

pytestmark = pytest.mark.anyio


def server_errors() -> list[type[AppError]]:
    """`AppError` and every subclass of it the server has loaded."""
    found: list[type[AppError]] = []
    pending: list[type[AppError]] = [AppError]
    while pending:
        cls = pending.pop()
        if cls not in found:
            found.append(cls)
            pending.extend(cls.__subclasses__())
    return sorted(found, key=lambda cls: (cls.status, cls.code, cls.__qualname__))


def instance(cls: type[AppError]) -> AppError:
    """An instance made as a service would, with None for what the constructor requires
    (`RevisionMismatch(current_revision)`)."""
    required = [p for p in inspect.signature(cls).parameters.values()
                if p.default is p.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return cls(*[None] * len(required))


def raising_app(errors: list[type[AppError]]) -> FastAPI:
    """The real application, plus one route that raises the error it is asked for."""
    application = app.main.create_app(Settings(database_url="sqlite+aiosqlite:///:memory:",
                                               _env_file=None))  # type: ignore[call-arg]

    async def raise_error(index: int) -> Any:
        raise instance(errors[index])

    application.add_api_route("/test/raise/{index}", raise_error, methods=["GET"])
    return application


async def test_every_server_error_code_has_its_client_class() -> None:
    errors = server_errors()
    assert len(errors) > 1, "no AppError subclass was found: is app.main still the app?"
    transport = httpx.ASGITransport(app=raising_app(errors))
    unmapped: list[str] = []
    async with httpx.AsyncClient(transport=transport, base_url="http://agentstate.test") as http:
        for index, cls in enumerate(errors):
            where = f"{cls.__module__}.{cls.__qualname__} ({cls.status} {cls.code})"
            response = await http.get(f"/test/raise/{index}")
            assert response.status_code == cls.status, where
            assert response.headers["content-type"] == "application/problem+json", where
            assert response.json()["code"] == cls.code, where

            error = client_errors.error_from_response(response)
            assert (error.status_code, error.code) == (cls.status, cls.code), where
            client_class = type(error)
            if (client_class.default_code, client_class.status) != (cls.code, cls.status):
                unmapped.append(f"{where} -> {client_class.__name__}")
    assert unmapped == [], (
        "server codes with no client class of their own (add one to "
        "client/agentstate_client/errors.py, its __all__ and docstring tree):\n"
        + "\n".join(unmapped))


def test_every_client_error_class_is_in_both_error_trees() -> None:
    """The tree in the module docstring and the one in docs/client.md name every class
    (tests/client/test_package.py pins `__all__`)."""
    classes = [name for name, value in vars(client_errors).items()
               if isinstance(value, type) and issubclass(value, client_errors.AgentStateError)]
    guide = (ROOT / "docs" / "client.md").read_text().split("### Errors", 1)[1]
    for tree in (client_errors.__doc__ or "", guide.split("```", 2)[1]):
        assert [name for name in classes if not re.search(rf"\b{name}\b", tree)] == []
