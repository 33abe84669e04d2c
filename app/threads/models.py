from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    ForeignKey,
    Index,
    Integer,
    PrimaryKeyConstraint,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base, BigIntPK, JSONType, Name, UTCDateTime


class Thread(Base):
    """One row per (tenant, thread_id), kept as a tombstone after DELETE.

    The tombstone (`deleted_at` set) is what lets a late writer get 410 instead of silently
    resurrecting the thread, and lets a re-created thread continue the revision sequence.
    """

    __tablename__ = "threads"
    __table_args__ = (
        UniqueConstraint("tenant_id", "thread_id"),
        # Keyset listing, newest created first.
        Index("ix_threads_tenant_id_created_at_thread_id", "tenant_id", "created_at", "thread_id"),
        # Keyset listing by activity (`?order_by=updated_at`).
        Index("ix_threads_tenant_id_updated_at_thread_id", "tenant_id", "updated_at", "thread_id"),
        # The retention sweeper's work list: live threads with a time to live.
        Index("ix_threads_expiring", "updated_at",
              postgresql_where=text("ttl_seconds IS NOT NULL AND deleted_at IS NULL"),
              sqlite_where=text("ttl_seconds IS NOT NULL AND deleted_at IS NULL")),
        # `?forked_from=`: a thread's forks, keyset-paged newest created first.
        Index("ix_threads_forked_from", "tenant_id", "forked_from_thread_id", "created_at",
              "thread_id", postgresql_where=text("forked_from_thread_id IS NOT NULL"),
              sqlite_where=text("forked_from_thread_id IS NOT NULL")),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(Name)
    thread_id: Mapped[str] = mapped_column(Name)
    revision: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[dict[str, Any]] = mapped_column(JSONType)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # The last message seq handed out; bumped in the same UPDATE that bumps the revision,
    # so concurrent appends serialise on this row and seqs never gap or repeat.
    last_seq: Mapped[int] = mapped_column(BigInteger, default=0)
    # Live messages, maintained by appends and compactions (never a COUNT(*) over history).
    message_count: Mapped[int] = mapped_column(BigInteger, default=0)
    # How many revisions of its state history the thread keeps; None: the server's setting
    # (AGENTSTATE_THREAD_HISTORY).
    history_limit: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Seconds after its last write (`updated_at`) the retention sweeper deletes the thread
    # (a normal delete: tombstone and event); None: kept until deleted.
    ttl_seconds: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # Set by a fork on the thread it made: the source's `thread_id` (the id clients see, not
    # its row: the source may be deleted or re-created since, and an export carries ids) and
    # the revision forked. Both or neither; None for a thread no fork made.
    forked_from_thread_id: Mapped[str | None] = mapped_column(Name, nullable=True)
    forked_from_revision: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class ThreadRevision(Base):
    """The state and metadata of a thread as one of its writes left them.

    A row is written by every write that sets the state or metadata (create, PUT, PATCH), in
    the same transaction, and rows older than the thread's history window are pruned by the
    same statement. Appends, compactions and agent-state writes change neither, so they add
    no row: the state at any revision is that of the newest row at or below it.
    """

    __tablename__ = "thread_revisions"
    __table_args__ = (PrimaryKeyConstraint("thread_pk", "revision"),)

    thread_pk: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("threads.id", ondelete="CASCADE")
    )
    revision: Mapped[int] = mapped_column(BigInteger)
    tenant_id: Mapped[str] = mapped_column(Name)
    state: Mapped[dict[str, Any]] = mapped_column(JSONType)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSONType)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
