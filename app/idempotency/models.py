"""The stored first response to an `Idempotency-Key`."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base, BigIntPK, JSONType, Name, UTCDateTime


class IdempotencyKey(Base):
    """The first response to an `Idempotency-Key`, committed with the write it protects.

    Rows go with their thread (ON DELETE CASCADE), so a retry after a DELETE answers 410
    instead of replaying a thread that no longer exists.
    """

    __tablename__ = "idempotency_keys"
    __table_args__ = (
        UniqueConstraint("thread_pk", "endpoint", "key"),
        # Lazy expiry deletes the oldest rows of a tenant.
        Index("ix_idempotency_keys_tenant_id_created_at", "tenant_id", "created_at"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(Name)
    thread_pk: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("threads.id", ondelete="CASCADE")
    )
    endpoint: Mapped[str] = mapped_column(String(32))
    key: Mapped[str] = mapped_column(String(255))
    request_hash: Mapped[str] = mapped_column(String(64))
    status: Mapped[int] = mapped_column(Integer)
    response: Mapped[dict[str, Any]] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class TenantIdempotencyKey(Base):
    """The same for a write outside threads (store items, a batch that starts with one):
    scoped to the tenant and the endpoint."""

    __tablename__ = "tenant_idempotency_keys"
    __table_args__ = (
        UniqueConstraint("tenant_id", "endpoint", "key"),
        Index("ix_tenant_idempotency_keys_tenant_id_created_at", "tenant_id", "created_at"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(Name)
    endpoint: Mapped[str] = mapped_column(String(32))
    key: Mapped[str] = mapped_column(String(255))
    request_hash: Mapped[str] = mapped_column(String(64))
    status: Mapped[int] = mapped_column(Integer)
    response: Mapped[dict[str, Any]] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
