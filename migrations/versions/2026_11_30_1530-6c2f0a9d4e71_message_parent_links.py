"""message parent links: a message may continue another one, in any thread of the tenant

Revision ID: 6c2f0a9d4e71
Revises: 1327f1f72a52
Create Date: 2026-11-30 15:30:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "6c2f0a9d4e71"
down_revision: str | Sequence[str] | None = "1327f1f72a52"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

HAS_PARENT = sa.text("parent_thread_id IS NOT NULL")


def upgrade() -> None:
    op.add_column("messages", sa.Column("parent_id", sa.String(length=255), nullable=True))
    op.add_column("messages", sa.Column("parent_thread_id", sa.String(length=255),
                                        nullable=True))
    op.add_column("messages", sa.Column("parent_seq", sa.BigInteger(), nullable=True))
    op.create_index("ix_messages_tenant_id_message_id", "messages", ["tenant_id", "message_id"])
    op.create_index("ix_messages_parent", "messages",
                    ["tenant_id", "parent_thread_id", "parent_seq"],
                    postgresql_where=HAS_PARENT, sqlite_where=HAS_PARENT)


def downgrade() -> None:
    op.drop_index("ix_messages_parent", table_name="messages")
    op.drop_index("ix_messages_tenant_id_message_id", table_name="messages")
    for column in ("parent_seq", "parent_thread_id", "parent_id"):
        op.drop_column("messages", column)
