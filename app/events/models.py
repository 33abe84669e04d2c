from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base, BigIntPK, Name, UTCDateTime


class Event(Base):
    """Append-only audit log. `seq` comes from the database and is the only order."""

    __tablename__ = "events"
    __table_args__ = (
        Index("ix_events_tenant_id_seq", "tenant_id", "seq"),
        Index("ix_events_tenant_id_thread_id_seq", "tenant_id", "thread_id", "seq"),
        {"sqlite_autoincrement": True},  # never reuse a seq, even after the newest row goes
    )

    seq: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(Name)
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    type: Mapped[str] = mapped_column(String(64))
    thread_id: Mapped[str | None] = mapped_column(Name, nullable=True)
    resource: Mapped[str] = mapped_column(String(1024))
    revision: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    actor: Mapped[str] = mapped_column(Name)
