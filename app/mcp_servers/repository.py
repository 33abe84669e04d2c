"""MCP server rows. Every API statement is scoped by tenant; revisions change only in SQL."""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.base import AnyRow, table
from app.db.revisioned import RevisionedRepository
from app.mcp_servers.models import McpServer

ms = table(McpServer)


class McpServerRepository(RevisionedRepository):
    table = ms
    key_columns = ("server_name",)

    async def page(self, *, limit: int, after: str | None,
                   server_type: str | None) -> list[AnyRow]:
        """Live servers by server_name, keyset-paged on it."""
        stmt = select(ms).where(self._live())
        if server_type is not None:
            stmt = stmt.where(ms.c.server_type == server_type)
        if after is not None:
            stmt = stmt.where(ms.c.server_name > after)
        stmt = stmt.order_by(ms.c.server_name).limit(limit)
        return list((await self.connection.execute(stmt)).all())



class StoredSecretsRepository:
    """The sealed secrets of every tenant, for the operator's jobs that span them: key rotation
    (`agentstate secrets rotate`) and the start-up check that the keys open them. The one place
    where statements are deliberately not scoped by tenant; nothing here runs in a request."""

    def __init__(self, connection: AsyncConnection) -> None:
        self.connection = connection

    async def ciphertexts_after(self, after_id: int, limit: int) -> list[AnyRow]:
        stmt = (select(ms.c.id, ms.c.tenant_id, ms.c.server_name, ms.c.secrets)
                .where(ms.c.id > after_id, ms.c.secrets.is_not(None))
                .order_by(ms.c.id).limit(limit))
        return list((await self.connection.execute(stmt)).all())

    async def swap_ciphertext(self, row_id: int, old: str, new: str) -> bool:
        """Replace a ciphertext only if no write changed it meanwhile (the write's own
        ciphertext is already under the first key). Neither the revision nor updated_at
        changes: the resource itself does not."""
        result = await self.connection.execute(
            update(ms).where(ms.c.id == row_id, ms.c.secrets == old).values(secrets=new)
        )
        return bool(result.rowcount)
