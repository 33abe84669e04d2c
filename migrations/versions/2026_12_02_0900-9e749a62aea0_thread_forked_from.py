"""thread forked from: a fork records its source thread (by id) and the revision it forked

Revision ID: 9e749a62aea0
Revises: b5d1e7a3c902
Create Date: 2026-12-02 09:00:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "9e749a62aea0"
down_revision: str | Sequence[str] | None = "b5d1e7a3c902"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

IS_FORK = sa.text("forked_from_thread_id IS NOT NULL")


def upgrade() -> None:
    op.add_column("threads", sa.Column("forked_from_thread_id", sa.String(length=255),
                                       nullable=True))
    op.add_column("threads", sa.Column("forked_from_revision", sa.BigInteger(), nullable=True))
    op.create_index("ix_threads_forked_from", "threads",
                    ["tenant_id", "forked_from_thread_id", "created_at", "thread_id"],
                    postgresql_where=IS_FORK, sqlite_where=IS_FORK)


def downgrade() -> None:
    op.drop_index("ix_threads_forked_from", table_name="threads")
    for column in ("forked_from_revision", "forked_from_thread_id"):
        op.drop_column("threads", column)
