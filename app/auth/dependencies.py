"""Who is calling: the `Principal` every router receives through an `Annotated` dependency.

Routers declare the scope they need (`ReadAccess`, `WriteAccess`, ...); repositories take the
principal's tenant, so no query can be written without one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from app.core.errors import Forbidden

OPEN_TENANT = "default"
ANONYMOUS = "anonymous"
ALL_SCOPES = frozenset({"read", "write", "secrets:read", "admin"})


@dataclass(frozen=True)
class Principal:
    tenant_id: str
    actor: str
    scopes: frozenset[str]

    def can(self, scope: str) -> bool:
        return scope in self.scopes or "admin" in self.scopes


async def current_principal(request: Request) -> Principal:
    """Open mode: every caller is the anonymous owner of the default tenant."""
    return Principal(OPEN_TENANT, ANONYMOUS, ALL_SCOPES)


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
SecretsAccess = Annotated[Principal, Depends(require("secrets:read"))]
