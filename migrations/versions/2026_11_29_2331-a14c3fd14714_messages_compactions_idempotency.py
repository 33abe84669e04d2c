"""messages, compactions and idempotency keys

Revision ID: a14c3fd14714
Revises: 73d63767d940
Create Date: 2026-11-29 23:31:59.479486+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "a14c3fd14714"
down_revision: str | Sequence[str] | None = "73d63767d940"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigIntPK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Timestamp = sa.DateTime(timezone=True)
LIVE_ONLY = sa.text("status = 'live'")


def _thread_fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["thread_pk"], ["threads.id"], name=op.f(f"fk_{table}_thread_pk_threads"),
        ondelete="CASCADE",
    )


def upgrade() -> None:
    op.create_table(
        "messages",
        sa.Column("thread_pk", sa.BigInteger(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("tenant_id", sa.String(length=255), nullable=False),
        sa.Column("message_id", sa.String(length=255), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("content", sa.JSON(), nullable=True),
        sa.Column("name", sa.String(length=255), nullable=True),
        sa.Column("tool_calls", sa.JSON(), nullable=True),
        sa.Column("tool_call_id", sa.String(length=255), nullable=True),
        sa.Column("agent_name", sa.String(length=255), nullable=True),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("compacted_by", sa.String(length=255), nullable=True),
        sa.Column("summary_of", sa.String(length=255), nullable=True),
        _thread_fk("messages"),
        sa.PrimaryKeyConstraint("thread_pk", "seq", name=op.f("pk_messages")),
        sa.UniqueConstraint("thread_pk", "message_id",
                            name=op.f("uq_messages_thread_pk_message_id")),
    )
    op.create_index("ix_messages_thread_pk_position_seq", "messages",
                    ["thread_pk", "position", "seq"])
    op.create_index("ix_messages_live", "messages", ["thread_pk", "position", "seq"],
                    postgresql_where=LIVE_ONLY, sqlite_where=LIVE_ONLY)

    op.create_table(
        "compactions",
        sa.Column("thread_pk", sa.BigInteger(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("tenant_id", sa.String(length=255), nullable=False),
        sa.Column("compaction_id", sa.String(length=255), nullable=False),
        sa.Column("source_message_ids", sa.JSON(), nullable=False),
        sa.Column("summary_message_id", sa.String(length=255), nullable=False),
        sa.Column("summary_text", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("model", sa.String(length=255), nullable=True),
        sa.Column("input_token_count", sa.BigInteger(), nullable=True),
        sa.Column("output_token_count", sa.BigInteger(), nullable=True),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("thread_revision", sa.BigInteger(), nullable=False),
        sa.Column("reverted_at", Timestamp, nullable=True),
        _thread_fk("compactions"),
        sa.PrimaryKeyConstraint("thread_pk", "seq", name=op.f("pk_compactions")),
        sa.UniqueConstraint("thread_pk", "compaction_id",
                            name=op.f("uq_compactions_thread_pk_compaction_id")),
    )

    op.create_table(
        "idempotency_keys",
        sa.Column("id", BigIntPK, autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.String(length=255), nullable=False),
        sa.Column("thread_pk", sa.BigInteger(), nullable=False),
        sa.Column("endpoint", sa.String(length=32), nullable=False),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("response", sa.JSON(), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        _thread_fk("idempotency_keys"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_idempotency_keys")),
        sa.UniqueConstraint("thread_pk", "endpoint", "key",
                            name=op.f("uq_idempotency_keys_thread_pk_endpoint_key")),
    )
    op.create_index("ix_idempotency_keys_tenant_id_created_at", "idempotency_keys",
                    ["tenant_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_idempotency_keys_tenant_id_created_at", table_name="idempotency_keys")
    op.drop_table("idempotency_keys")
    op.drop_table("compactions")
    op.drop_index("ix_messages_live", table_name="messages")
    op.drop_index("ix_messages_thread_pk_position_seq", table_name="messages")
    op.drop_table("messages")
