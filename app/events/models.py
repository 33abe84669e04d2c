from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Index, String, UniqueConstraint, text
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base, BigIntPK, Name, UTCDateTime


class Event(Base):
    """Append-only audit log, one feed per tenant (docs/events.md).

    `id` is the insert order of the whole table and never leaves the database. `seq` is the
    tenant's own order: 1, 2, 3, ... assigned once, after the writer committed, by the
    sequencer on Postgres (NULL until then), by the insert itself on SQLite (whose writers
    are serialised).
    """

    __tablename__ = "events"
    __table_args__ = (
        UniqueConstraint("tenant_id", "seq"),
        Index("ix_events_tenant_id_thread_id_seq", "tenant_id", "thread_id", "seq"),
        # The sequencer's work list: small, since rows leave it within milliseconds.
        Index("ix_events_unsequenced", "tenant_id", "id",
              postgresql_where=text("seq IS NULL"), sqlite_where=text("seq IS NULL")),
        Index("ix_events_at", "at"),  # the retention sweeper
        {"sqlite_autoincrement": True},  # never reuse an id, even after the newest row goes
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(Name)
    seq: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    type: Mapped[str] = mapped_column(String(64))
    thread_id: Mapped[str | None] = mapped_column(Name, nullable=True)
    resource: Mapped[str] = mapped_column(String(1024))
    revision: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    actor: Mapped[str] = mapped_column(Name)
