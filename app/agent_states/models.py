from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, ForeignKey, Index, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base, BigIntPK, JSONType, Name, SortedName, UTCDateTime


class AgentState(Base):
    """One row per (tenant, thread, agent), upserted; a DELETE leaves a tombstone.

    The tombstone (`deleted_at` set) keeps the revision sequence, so a re-created state never
    reuses an ETag. Rows go with their thread by ON DELETE CASCADE.
    """

    __tablename__ = "agent_states"
    __table_args__ = (
        # Also the keyset order of both lists: (thread_id, agent_name).
        UniqueConstraint("tenant_id", "thread_id", "agent_name"),
        Index("ix_agent_states_tenant_id_agent_name_thread_id",
              "tenant_id", "agent_name", "thread_id"),
        # The cascade from threads looks rows up by this column.
        Index("ix_agent_states_thread_pk", "thread_pk"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(Name)
    thread_pk: Mapped[int] = mapped_column(
        BigIntPK, ForeignKey("threads.id", ondelete="CASCADE")
    )
    thread_id: Mapped[str] = mapped_column(SortedName)
    agent_name: Mapped[str] = mapped_column(SortedName)
    revision: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[dict[str, Any]] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
