"""opaque message items, roles of any short name, threads listed by activity

Revision ID: 9772f0f32351
Revises: 5e1b7c2d9a40
Create Date: 2026-11-30 12:15:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "9772f0f32351"
down_revision: str | Sequence[str] | None = "5e1b7c2d9a40"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _role(length: int) -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.alter_column("messages", "role", type_=sa.String(length=length),
                        existing_nullable=False)
        return
    # SQLite cannot change a column's declared type in place: the table is rebuilt.
    with op.batch_alter_table("messages") as batch:
        batch.alter_column("role", type_=sa.String(length=length), existing_nullable=False)


def upgrade() -> None:
    op.add_column("messages", sa.Column("item", sa.JSON(), nullable=True))
    _role(64)
    op.create_index(op.f("ix_threads_tenant_id_updated_at_thread_id"), "threads",
                    ["tenant_id", "updated_at", "thread_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_threads_tenant_id_updated_at_thread_id"), table_name="threads")
    op.execute("UPDATE messages SET role = substr(role, 1, 16)")
    _role(16)
    op.drop_column("messages", "item")
