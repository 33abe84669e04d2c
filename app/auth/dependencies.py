"""Who is calling: the `Principal` every router receives through an `Annotated` dependency.

Routers declare the scope they need (`ReadAccess`, `WriteAccess`, ...); repositories take the
principal's tenant, so no query can be written without one. The token is resolved by the
application's `Authenticator` (`app/auth/authenticator.py`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.auth.tenancy import request_tenant
from app.core.errors import Forbidden, Unauthorized

OPEN_TENANT = "default"
ANONYMOUS = "anonymous"
ALL_SCOPES = frozenset({"read", "write", "secrets:read", "admin"})

# Declares the bearer scheme on every operation in the OpenAPI document; errors are ours.
_bearer = HTTPBearer(auto_error=False, scheme_name="ApiKey",
                     description="An API key from `agentstate keys create`.")


@dataclass(frozen=True)
class Principal:
    tenant_id: str
    actor: str
    scopes: frozenset[str]

    def can(self, scope: str) -> bool:
        return scope in self.scopes or "admin" in self.scopes


async def current_principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> AsyncIterator[Principal]:
    """The key's tenant and scopes; the anonymous owner of the default tenant when the
    server runs open (no keys exist). The tenant guard checks statements while it is set."""
    if credentials is None and "authorization" in request.headers:
        raise Unauthorized("Use Authorization: Bearer <api key>.")
    token = credentials.credentials if credentials is not None else None
    principal = await request.app.state.authenticator.authenticate(request.app.state.db, token)
    request_tenant.set(principal.tenant_id)
    try:
        yield principal
    finally:
        request_tenant.set(None)


def require(scope: str):  # noqa: ANN201 - returns a FastAPI dependency
    async def dependency(
        principal: Annotated[Principal, Depends(current_principal)],
    ) -> Principal:
        if not principal.can(scope):
            raise Forbidden(f"This API key lacks the {scope!r} scope.")
        return principal

    return dependency


ReadAccess = Annotated[Principal, Depends(require("read"))]
WriteAccess = Annotated[Principal, Depends(require("write"))]
