"""threads and events

Revision ID: 73d63767d940
Revises:
Create Date: 2026-11-29 23:05:45.199056+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "73d63767d940"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigIntPK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("seq", BigIntPK, autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.String(length=255), nullable=False),
        sa.Column("at", Timestamp, nullable=False),
        sa.Column("type", sa.String(length=64), nullable=False),
        sa.Column("thread_id", sa.String(length=255), nullable=True),
        sa.Column("resource", sa.String(length=1024), nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=True),
        sa.Column("actor", sa.String(length=255), nullable=False),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_events")),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_events_tenant_id_seq", "events", ["tenant_id", "seq"])
    op.create_index("ix_events_tenant_id_thread_id_seq", "events", ["tenant_id", "thread_id", "seq"])

    op.create_table(
        "threads",
        sa.Column("id", BigIntPK, autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.String(length=255), nullable=False),
        sa.Column("thread_id", sa.String(length=255), nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.JSON(), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("updated_at", Timestamp, nullable=False),
        sa.Column("deleted_at", Timestamp, nullable=True),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.Column("message_count", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_threads")),
        sa.UniqueConstraint("tenant_id", "thread_id", name=op.f("uq_threads_tenant_id_thread_id")),
    )
    op.create_index(
        "ix_threads_tenant_id_created_at_thread_id", "threads",
        ["tenant_id", "created_at", "thread_id"],
    )
    if op.get_bind().dialect.name == "postgresql":
        # Serves ?metadata= containment (app/db/dialect.py casts json to jsonb the same way).
        op.execute(
            "CREATE INDEX ix_threads_metadata_gin ON threads "
            "USING gin ((metadata::jsonb) jsonb_path_ops)"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP INDEX ix_threads_metadata_gin")
    op.drop_index("ix_threads_tenant_id_created_at_thread_id", table_name="threads")
    op.drop_table("threads")
    op.drop_index("ix_events_tenant_id_thread_id_seq", table_name="events")
    op.drop_index("ix_events_tenant_id_seq", table_name="events")
    op.drop_table("events")
