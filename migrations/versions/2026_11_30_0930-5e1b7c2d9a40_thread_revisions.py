"""thread state history, and the revisions that stored messages and reverted compactions

Revision ID: 5e1b7c2d9a40
Revises: 8190990c30ca
Create Date: 2026-11-30 09:30:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "5e1b7c2d9a40"
down_revision: str | Sequence[str] | None = "8190990c30ca"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "thread_revisions",
        sa.Column("thread_pk", sa.BigInteger(), nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.Column("tenant_id", sa.String(length=255), nullable=False),
        sa.Column("state", sa.JSON(), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("updated_at", Timestamp, nullable=False),
        sa.ForeignKeyConstraint(["thread_pk"], ["threads.id"],
                                name=op.f("fk_thread_revisions_thread_pk_threads"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("thread_pk", "revision", name=op.f("pk_thread_revisions")),
    )
    # Live threads start their history at their current state.
    op.execute(
        "INSERT INTO thread_revisions (thread_pk, revision, tenant_id, state, metadata, "
        "updated_at) SELECT id, revision, tenant_id, state, metadata, updated_at FROM threads "
        "WHERE deleted_at IS NULL"
    )
    # Plain ADD/DROP COLUMN, which both backends support (SQLite since 3.35): a batch
    # rebuild of `messages` would cost a copy of every message.
    op.add_column("threads", sa.Column("history_limit", sa.Integer(), nullable=True))
    op.add_column("messages", sa.Column("revision", sa.BigInteger(), server_default="0",
                                        nullable=False))
    op.add_column("compactions", sa.Column("reverted_revision", sa.BigInteger(), nullable=True))
    # When an existing revert happened is not known: a fork sees such a compaction as
    # reverted from the revision that made it.
    op.execute("UPDATE compactions SET reverted_revision = thread_revision "
               "WHERE reverted_at IS NOT NULL")


def downgrade() -> None:
    op.drop_column("compactions", "reverted_revision")
    op.drop_column("messages", "revision")
    op.drop_column("threads", "history_limit")
    op.drop_table("thread_revisions")
