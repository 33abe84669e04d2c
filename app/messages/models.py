from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    ForeignKey,
    Index,
    PrimaryKeyConstraint,
    String,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base, JSONType, Name, OpaqueJSON, UTCDateTime

LIVE_ONLY = text("status = 'live'")
HAS_PARENT = text("parent_thread_id IS NOT NULL")


class Message(Base):
    """One row per message, never rewritten by an append.

    Keyed by (thread_pk, seq): the seq comes from the thread row's `last_seq`, bumped in the
    UPDATE that serialises appends to one thread. Every read walks one of the indexes below
    from a key, so its cost is the page, not the history.
    """

    __tablename__ = "messages"
    __table_args__ = (
        PrimaryKeyConstraint("thread_pk", "seq"),
        UniqueConstraint("thread_pk", "message_id"),
        # The full view's order.
        Index("ix_messages_thread_pk_position_seq", "thread_pk", "position", "seq"),
        # The live view's order, without stepping over compacted history.
        Index("ix_messages_live", "thread_pk", "position", "seq",
              postgresql_where=LIVE_ONLY, sqlite_where=LIVE_ONLY),
        # A message found by its id anywhere in the tenant (parent links, lineage).
        Index("ix_messages_tenant_id_message_id", "tenant_id", "message_id"),
        # Who points at a thread's messages (refusing a delete that would break a lineage).
        Index("ix_messages_parent", "tenant_id", "parent_thread_id", "parent_seq",
              postgresql_where=HAS_PARENT, sqlite_where=HAS_PARENT),
    )

    thread_pk: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("threads.id", ondelete="CASCADE")
    )
    seq: Mapped[int] = mapped_column(BigInteger)
    tenant_id: Mapped[str] = mapped_column(Name)
    message_id: Mapped[str] = mapped_column(Name)
    position: Mapped[int] = mapped_column(BigInteger)
    role: Mapped[str] = mapped_column(String(64))
    content: Mapped[Any] = mapped_column(JSONType, nullable=True)
    # A framework's own item, opaque to agentstate: `json` keeps its text (key order) as sent.
    item: Mapped[Any] = mapped_column(OpaqueJSON, nullable=True)
    name: Mapped[str | None] = mapped_column(String(255), nullable=True)
    tool_calls: Mapped[Any] = mapped_column(JSONType, nullable=True)
    tool_call_id: Mapped[str | None] = mapped_column(String(255), nullable=True)
    agent_name: Mapped[str | None] = mapped_column(Name, nullable=True)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    status: Mapped[str] = mapped_column(String(16))
    # The compaction that replaced this message (while status is "compacted").
    compacted_by: Mapped[str | None] = mapped_column(Name, nullable=True)
    # For a summary: the compaction that wrote it.
    summary_of: Mapped[str | None] = mapped_column(Name, nullable=True)
    # The thread revision that stored it (0: stored before revisions were recorded here), so
    # a fork can take the messages as they were at a revision.
    revision: Mapped[int] = mapped_column(BigInteger, server_default="0")
    # The message this one continues (API.md section 4, "Parent links"): the id as the
    # client sent it, and the row it named when it was stored, by its natural key (thread id,
    # seq), so an export carries it as it is and an import may bring the threads in any order.
    parent_id: Mapped[str | None] = mapped_column(Name, nullable=True)
    parent_thread_id: Mapped[str | None] = mapped_column(Name, nullable=True)
    parent_seq: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
