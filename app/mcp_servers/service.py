"""MCP servers (API.md section 7): cached connection state, secrets encrypted at rest.

Secrets are write-only by default: reads show their names mapped to `"***"`, and the values
only with `?include_secrets=true` to a caller with the `secrets:read` scope. They never reach
events, logs, error messages or exports in clear.
"""

from __future__ import annotations

from typing import Any

from cryptography.fernet import InvalidToken
from sqlalchemy.ext.asyncio import AsyncConnection

from app.core.errors import Forbidden, Unprocessable
from app.core.mergepatch import merge_patch
from app.core.pagination import Page, decode_name_cursor, split_page
from app.core.revisions import Preconditions, RevisionedResource
from app.core.secretbox import SecretBox, require_box, require_opener
from app.db.base import utcnow
from app.db.unit import UnitOfWork
from app.mcp_servers.errors import UnknownSecret
from app.mcp_servers.repository import McpServerRepository, StoredSecretsRepository
from app.mcp_servers.schemas import MASK, McpServerOut, McpServerPatch, McpServerReplace

CURSOR = "mcp_servers"
NO_SECRETS: dict[str, Any] = {"secret_names": [], "secrets": None}


def server_path(server_name: str) -> str:
    return f"/v1/mcp-servers/{server_name}"


class McpServerService:
    def __init__(self, uow: UnitOfWork, box: SecretBox | None) -> None:
        self.uow = uow
        self.principal = uow.principal
        self.settings = uow.settings
        self.box = box
        self.repo = McpServerRepository(uow.connection, uow.tenant_id)

    def _resource(self, server_name: str) -> RevisionedResource:
        return RevisionedResource(
            self.repo, (server_name,), noun="MCP server", label=f"MCP server {server_name!r}",
            required=self.settings.require_preconditions,
        )

    def _owner(self, server_name: str) -> list[str]:
        return [self.principal.tenant_id, server_name]

    def _event(self, change: str, server_name: str, revision: int) -> None:
        self.uow.record(f"mcp_server.{change}", server_path(server_name), revision=revision)

    def _stored_secrets(self, row: Any) -> dict[str, str]:
        if row is None or row.secrets is None:
            return {}
        return require_opener(self.box).open(self._owner(row.server_name), row.secrets)

    def _secret_columns(self, server_name: str, current: Any,
                        incoming: dict[str, str | None] | None, *, patch: bool) -> dict[str, Any]:
        """The stored columns for a write's `secrets` member: `{}`/null clear; `"***"` keeps
        that stored secret; on PATCH, null removes one and the others are kept."""
        if not incoming:
            return NO_SECRETS
        needs_stored = patch or MASK in incoming.values()
        stored = self._stored_secrets(current) if needs_stored else {}
        result = dict(stored) if patch else {}
        for name, value in incoming.items():
            if value is None:
                result.pop(name, None)
            elif value == MASK:
                if name not in stored:
                    raise UnknownSecret(
                        f'"{MASK}" keeps a stored secret, and there is no secret {name!r}.',
                        errors=[{"pointer": f"/secrets/{name}", "code": "unknown_secret",
                                 "message": "no stored secret of this name to keep"}],
                    )
                result[name] = stored[name]
            else:
                result[name] = value
        if not result:
            return NO_SECRETS
        return {"secret_names": list(result),
                "secrets": require_box(self.box).seal(self._owner(server_name), result)}

    def _out(self, row: Any, include_secrets: bool = False) -> McpServerOut:
        secrets = (self._stored_secrets(row) if include_secrets
                   else dict.fromkeys(row.secret_names, MASK))
        return McpServerOut.from_row(row, secrets)

    def _allow_read(self, include_secrets: bool) -> None:
        if include_secrets and not self.principal.can("secrets:read"):
            raise Forbidden("include_secrets=true needs an API key with the 'secrets:read' scope.")

    async def get(self, server_name: str, *, include_secrets: bool = False) -> McpServerOut:
        self._allow_read(include_secrets)
        return self._out(await self._resource(server_name).get(), include_secrets)

    async def list(self, *, limit: int, cursor: str | None, server_type: str | None,
                   include_secrets: bool = False) -> Page[McpServerOut]:
        self._allow_read(include_secrets)
        after = decode_name_cursor(CURSOR, cursor, 1)
        rows = await self.repo.page(limit=limit + 1, after=after[0] if after else None,
                                    server_type=server_type)
        return split_page(CURSOR, rows, limit, lambda row: [row.server_name],
                          lambda row: self._out(row, include_secrets),
                          max_bytes=self.settings.max_page_bytes)

    async def replace(self, server_name: str, body: McpServerReplace,
                      pre: Preconditions) -> tuple[McpServerOut, bool]:
        """PUT: returns the server and whether it was created. Omitted `secrets` and
        `last_connected_at` keep the stored values."""
        given = body.model_fields_set

        def values(current: Any) -> dict[str, Any]:
            stored: dict[str, Any] = {"server_type": body.server_type, "state": body.state}
            if "last_connected_at" in given or current is None:
                stored["last_connected_at"] = body.last_connected_at
            if "secrets" in given:
                stored |= self._secret_columns(server_name, current, dict(body.secrets or {}),
                                               patch=False)
            elif current is None:
                stored |= NO_SECRETS
            return stored

        row, created = await self._resource(server_name).put(pre, values, utcnow())
        self._event("created" if created else "updated", server_name, row.revision)
        return self._out(row), created

    async def patch(self, server_name: str, body: McpServerPatch,
                    pre: Preconditions) -> McpServerOut:
        given = body.model_fields_set
        if "server_type" in given and body.server_type is None:
            raise Unprocessable("server_type cannot be removed.", errors=[
                {"pointer": "/server_type", "code": "required", "message": "may not be null"}])

        def values(current: Any) -> dict[str, Any]:
            stored: dict[str, Any] = {}
            if "server_type" in given:
                stored["server_type"] = body.server_type
            if "state" in given:
                # `"state": null` removes the member (RFC 7396); for state that means "empty".
                stored["state"] = (merge_patch(current.state, body.state)
                                   if body.state is not None else {})
            if "last_connected_at" in given:
                stored["last_connected_at"] = body.last_connected_at
            if "secrets" in given:
                stored |= self._secret_columns(server_name, current, body.secrets, patch=True)
            return stored

        row = await self._resource(server_name).patch(pre, values)
        self._event("updated", server_name, row.revision)
        return self._out(row)

    async def delete(self, server_name: str, pre: Preconditions) -> None:
        # The tombstone keeps the name and the revision, nothing else (no secrets).
        revision = await self._resource(server_name).delete(
            pre, {"state": {}, "last_connected_at": None, **NO_SECRETS}, utcnow()
        )
        self._event("deleted", server_name, revision)


async def rotate_batch(connection: AsyncConnection, box: SecretBox, after_id: int,
                       limit: int) -> tuple[int | None, int, list[str]]:
    """Re-encrypt one batch of stored secrets with the first key (`agentstate secrets rotate`).

    Returns the last row id seen (None when done), how many were rotated, and the
    `tenant/server` names no configured key opens (names only, never values).
    """
    repo = StoredSecretsRepository(connection)
    rows = await repo.ciphertexts_after(after_id, limit)
    rotated, unreadable = 0, []
    for row in rows:
        try:
            new = box.rotate(row.secrets)
        except InvalidToken:
            unreadable.append(f"{row.tenant_id}/{row.server_name}")
            continue
        rotated += await repo.swap_ciphertext(row.id, row.secrets, new)
    return (rows[-1].id if rows else None), rotated, unreadable
