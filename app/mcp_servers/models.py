from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Index, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base, BigIntPK, JSONType, Name, SortedName, UTCDateTime


class McpServer(Base):
    """Cached connection state of one MCP server; a DELETE leaves a tombstone (no secrets).

    `secrets` is one authenticated ciphertext of all the server's secrets (see
    app/core/secretbox.py); `secret_names` lets reads show `"***"` without decrypting.
    Columns marked `info={"secret": True}` are never exported.
    """

    __tablename__ = "mcp_servers"
    __table_args__ = (
        UniqueConstraint("tenant_id", "server_name"),
        Index("ix_mcp_servers_tenant_id_server_type_server_name",
              "tenant_id", "server_type", "server_name"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(Name)
    server_name: Mapped[str] = mapped_column(SortedName)
    server_type: Mapped[str] = mapped_column(Name)
    revision: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[dict[str, Any]] = mapped_column(JSONType)
    secret_names: Mapped[list[str]] = mapped_column(JSONType)
    secrets: Mapped[str | None] = mapped_column(Text, nullable=True, info={"secret": True})
    last_connected_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
