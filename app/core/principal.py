"""Who is calling: a key's tenant and scopes, or the anonymous owner of the default tenant
on an open server. Resolved per request by `app/http/dependencies.py`."""

from __future__ import annotations

from dataclasses import dataclass

OPEN_TENANT = "default"
ANONYMOUS = "anonymous"
ALL_SCOPES = frozenset({"read", "write", "secrets:read", "admin"})
# What a scope grants beyond itself. `write` implies `read`: a conditional write needs the
# revision it replaces and every write answers with the representation (docs/auth.md).
IMPLIES: dict[str, frozenset[str]] = {"admin": ALL_SCOPES, "write": frozenset({"read"})}


@dataclass(frozen=True)
class Principal:
    tenant_id: str
    actor: str
    scopes: frozenset[str]

    def can(self, scope: str) -> bool:
        return scope in self.scopes or any(scope in IMPLIES.get(held, ()) for held in self.scopes)
