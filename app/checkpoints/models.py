"""Checkpoints of graph runtimes (LangGraph first): immutable snapshots of a thread's channels.

A checkpoint row holds the small part (versions, metadata, parent); channel values live in
`checkpoint_blobs`, one row per (thread, namespace, channel, version), so a checkpoint that
changes one channel stores one value. A value sent as a list of items (a message log) is
stored once per thread per item in `checkpoint_items`, and the list as the digests of chunks
of 64 item digests (chunks are items too): the next version of a 400-message log adds two
item rows, its last chunk and 16 bytes per chunk, not the log.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    PrimaryKeyConstraint,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from app.db.base import Base, BigIntPK, JSONType, Name, SortedName, UTCDateTime

# Namespaces nest ("outer:<uuid>|inner:<uuid>"), so they may be longer than a name; byte
# order on Postgres, as for names.
Namespace = String(1024).with_variant(String(1024, collation="C"), "postgresql")


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (
        # Also the order of every read: newest (largest id) first within a namespace.
        UniqueConstraint("thread_pk", "checkpoint_ns", "checkpoint_id"),
        Index("ix_checkpoints_thread_pk_checkpoint_id", "thread_pk", "checkpoint_id"),
        # Led by run_id: one led by tenant_id was taken for key lookups on stale statistics.
        Index("ix_checkpoints_run_id_tenant_id", "run_id", "tenant_id"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(Name)
    thread_pk: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("threads.id", ondelete="CASCADE"))
    checkpoint_ns: Mapped[str] = mapped_column(Namespace)
    checkpoint_id: Mapped[str] = mapped_column(SortedName)
    parent_checkpoint_id: Mapped[str | None] = mapped_column(SortedName, nullable=True)
    # The checkpoint without its channel values: channel_versions, versions_seen, ts, ...
    checkpoint: Mapped[dict[str, Any]] = mapped_column(JSONType)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSONType)
    # metadata.run_id when it is a string, for deletes by run.
    run_id: Mapped[str | None] = mapped_column(String(255), nullable=True)
    # sha256 of the create request's content: a replay is recognised by it.
    content_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class CheckpointBlob(Base):
    __tablename__ = "checkpoint_blobs"
    __table_args__ = (PrimaryKeyConstraint("thread_pk", "checkpoint_ns", "channel", "version"),)

    thread_pk: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("threads.id", ondelete="CASCADE"))
    checkpoint_ns: Mapped[str] = mapped_column(Namespace)
    channel: Mapped[str] = mapped_column(String(1024))
    version: Mapped[str] = mapped_column(String(255))
    tenant_id: Mapped[str] = mapped_column(Name)
    type: Mapped[str] = mapped_column(String(255))
    # The value's bytes, or (for a value sent as items) None and the items' digests.
    data: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    items: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)


class CheckpointItem(Base):
    """One item of list values (a message), stored once per thread by its digest."""

    __tablename__ = "checkpoint_items"
    __table_args__ = (PrimaryKeyConstraint("thread_pk", "digest"),)

    thread_pk: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("threads.id", ondelete="CASCADE"))
    digest: Mapped[bytes] = mapped_column(LargeBinary(16))
    tenant_id: Mapped[str] = mapped_column(Name)
    type: Mapped[str] = mapped_column(String(255))
    data: Mapped[bytes] = mapped_column(LargeBinary)


class CheckpointWrite(Base):
    """A pending write of a task, stored against the checkpoint it follows."""

    __tablename__ = "checkpoint_writes"
    __table_args__ = (PrimaryKeyConstraint("thread_pk", "checkpoint_ns", "checkpoint_id",
                                           "task_id", "idx"),)

    thread_pk: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("threads.id", ondelete="CASCADE"))
    checkpoint_ns: Mapped[str] = mapped_column(Namespace)
    checkpoint_id: Mapped[str] = mapped_column(SortedName)
    task_id: Mapped[str] = mapped_column(String(255))
    idx: Mapped[int] = mapped_column(Integer)
    tenant_id: Mapped[str] = mapped_column(Name)
    channel: Mapped[str] = mapped_column(String(1024))
    type: Mapped[str] = mapped_column(String(255))
    data: Mapped[bytes] = mapped_column(LargeBinary)
    task_path: Mapped[str] = mapped_column(String(2048))
