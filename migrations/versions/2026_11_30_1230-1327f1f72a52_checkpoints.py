"""checkpoints of graph runtimes: checkpoints, channel values, list items, pending writes

Revision ID: 1327f1f72a52
Revises: 7394f9ae97e4
Create Date: 2026-11-30 12:30:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "1327f1f72a52"
down_revision: str | Sequence[str] | None = "7394f9ae97e4"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigIntPK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Timestamp = sa.DateTime(timezone=True)
SortedName = sa.String(length=255).with_variant(sa.String(length=255, collation="C"), "postgresql")
Namespace = sa.String(length=1024).with_variant(sa.String(length=1024, collation="C"),
                                                "postgresql")


def _thread_fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["thread_pk"], ["threads.id"], name=op.f(f"fk_{table}_thread_pk_threads"),
        ondelete="CASCADE",
    )


def upgrade() -> None:
    op.create_table(
        "checkpoints",
        sa.Column("id", BigIntPK, autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.String(length=255), nullable=False),
        sa.Column("thread_pk", sa.BigInteger(), nullable=False),
        sa.Column("checkpoint_ns", Namespace, nullable=False),
        sa.Column("checkpoint_id", SortedName, nullable=False),
        sa.Column("parent_checkpoint_id", SortedName, nullable=True),
        sa.Column("checkpoint", sa.JSON(), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("run_id", sa.String(length=255), nullable=True),
        sa.Column("content_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        _thread_fk("checkpoints"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_checkpoints")),
        sa.UniqueConstraint("thread_pk", "checkpoint_ns", "checkpoint_id",
                            name=op.f("uq_checkpoints_thread_pk_checkpoint_ns_checkpoint_id")),
    )
    op.create_index("ix_checkpoints_thread_pk_checkpoint_id", "checkpoints",
                    ["thread_pk", "checkpoint_id"])
    op.create_index("ix_checkpoints_tenant_id_run_id", "checkpoints", ["tenant_id", "run_id"])
    op.create_table(
        "checkpoint_blobs",
        sa.Column("thread_pk", sa.BigInteger(), nullable=False),
        sa.Column("checkpoint_ns", Namespace, nullable=False),
        sa.Column("channel", sa.String(length=1024), nullable=False),
        sa.Column("version", sa.String(length=255), nullable=False),
        sa.Column("tenant_id", sa.String(length=255), nullable=False),
        sa.Column("type", sa.String(length=255), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=True),
        sa.Column("items", sa.LargeBinary(), nullable=True),
        _thread_fk("checkpoint_blobs"),
        sa.PrimaryKeyConstraint("thread_pk", "checkpoint_ns", "channel", "version",
                                name=op.f("pk_checkpoint_blobs")),
    )
    op.create_table(
        "checkpoint_items",
        sa.Column("thread_pk", sa.BigInteger(), nullable=False),
        sa.Column("digest", sa.LargeBinary(length=16), nullable=False),
        sa.Column("tenant_id", sa.String(length=255), nullable=False),
        sa.Column("type", sa.String(length=255), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        _thread_fk("checkpoint_items"),
        sa.PrimaryKeyConstraint("thread_pk", "digest", name=op.f("pk_checkpoint_items")),
    )
    op.create_table(
        "checkpoint_writes",
        sa.Column("thread_pk", sa.BigInteger(), nullable=False),
        sa.Column("checkpoint_ns", Namespace, nullable=False),
        sa.Column("checkpoint_id", SortedName, nullable=False),
        sa.Column("task_id", sa.String(length=255), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("tenant_id", sa.String(length=255), nullable=False),
        sa.Column("channel", sa.String(length=1024), nullable=False),
        sa.Column("type", sa.String(length=255), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("task_path", sa.String(length=2048), nullable=False),
        _thread_fk("checkpoint_writes"),
        sa.PrimaryKeyConstraint("thread_pk", "checkpoint_ns", "checkpoint_id", "task_id", "idx",
                                name=op.f("pk_checkpoint_writes")),
    )


def downgrade() -> None:
    op.drop_table("checkpoint_writes")
    op.drop_table("checkpoint_items")
    op.drop_table("checkpoint_blobs")
    op.drop_index("ix_checkpoints_tenant_id_run_id", table_name="checkpoints")
    op.drop_index("ix_checkpoints_thread_pk_checkpoint_id", table_name="checkpoints")
    op.drop_table("checkpoints")
