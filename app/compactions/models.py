from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, ForeignKey, PrimaryKeyConstraint, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base, JSONType, Name, UTCDateTime


class Compaction(Base):
    """The audit record of one compaction, keyed like messages by (thread_pk, seq): `seq` is
    its summary's seq, so records list in the order they were made.

    A reverted record stays (`reverted_at` set, hidden from the API) so that the summary it
    wrote still names a compaction that existed.
    """

    __tablename__ = "compactions"
    __table_args__ = (
        PrimaryKeyConstraint("thread_pk", "seq"),
        UniqueConstraint("thread_pk", "compaction_id"),
    )

    thread_pk: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("threads.id", ondelete="CASCADE")
    )
    seq: Mapped[int] = mapped_column(BigInteger)
    tenant_id: Mapped[str] = mapped_column(Name)
    compaction_id: Mapped[str] = mapped_column(Name)
    source_message_ids: Mapped[list[str]] = mapped_column(JSONType)
    summary_message_id: Mapped[str] = mapped_column(Name)
    summary_text: Mapped[str | None] = mapped_column(Text, nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    model: Mapped[str | None] = mapped_column(String(255), nullable=True)
    input_token_count: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    output_token_count: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    thread_revision: Mapped[int] = mapped_column(BigInteger)
    reverted_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # The thread revision the revert produced (a fork before it sees the compaction live).
    reverted_revision: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
