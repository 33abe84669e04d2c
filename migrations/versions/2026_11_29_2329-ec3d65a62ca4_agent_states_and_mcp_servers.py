"""agent states and mcp servers

Revision ID: ec3d65a62ca4
Revises: 73d63767d940
Create Date: 2026-11-29 23:29:29.015907+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "ec3d65a62ca4"
down_revision: str | Sequence[str] | None = "73d63767d940"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigIntPK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Timestamp = sa.DateTime(timezone=True)
# Byte order on Postgres whatever the locale, like SQLite's BINARY (app/db/base.py SortedName).
SortedName = sa.String(length=255).with_variant(sa.String(length=255, collation="C"), "postgresql")


def upgrade() -> None:
    op.create_table(
        "mcp_servers",
        sa.Column("id", BigIntPK, autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.String(length=255), nullable=False),
        sa.Column("server_name", SortedName, nullable=False),
        sa.Column("server_type", sa.String(length=255), nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.JSON(), nullable=False),
        sa.Column("secret_names", sa.JSON(), nullable=False),
        sa.Column("secrets", sa.Text(), nullable=True),
        sa.Column("last_connected_at", Timestamp, nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("updated_at", Timestamp, nullable=False),
        sa.Column("deleted_at", Timestamp, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_mcp_servers")),
        sa.UniqueConstraint("tenant_id", "server_name",
                            name=op.f("uq_mcp_servers_tenant_id_server_name")),
    )
    op.create_index("ix_mcp_servers_tenant_id_server_type_server_name", "mcp_servers",
                    ["tenant_id", "server_type", "server_name"])

    op.create_table(
        "agent_states",
        sa.Column("id", BigIntPK, autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.String(length=255), nullable=False),
        sa.Column("thread_pk", BigIntPK, nullable=False),
        sa.Column("thread_id", SortedName, nullable=False),
        sa.Column("agent_name", SortedName, nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.JSON(), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("updated_at", Timestamp, nullable=False),
        sa.Column("deleted_at", Timestamp, nullable=True),
        sa.ForeignKeyConstraint(["thread_pk"], ["threads.id"], ondelete="CASCADE",
                                name=op.f("fk_agent_states_thread_pk_threads")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agent_states")),
        sa.UniqueConstraint("tenant_id", "thread_id", "agent_name",
                            name=op.f("uq_agent_states_tenant_id_thread_id_agent_name")),
    )
    op.create_index("ix_agent_states_tenant_id_agent_name_thread_id", "agent_states",
                    ["tenant_id", "agent_name", "thread_id"])
    op.create_index("ix_agent_states_thread_pk", "agent_states", ["thread_pk"])
    if op.get_bind().dialect.name == "postgresql":
        # Serves ?state_contains= (app/db/dialect.py casts json to jsonb the same way).
        op.execute(
            "CREATE INDEX ix_agent_states_state_gin ON agent_states "
            "USING gin ((state::jsonb) jsonb_path_ops)"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP INDEX ix_agent_states_state_gin")
    op.drop_index("ix_agent_states_thread_pk", table_name="agent_states")
    op.drop_index("ix_agent_states_tenant_id_agent_name_thread_id", table_name="agent_states")
    op.drop_table("agent_states")
    op.drop_index("ix_mcp_servers_tenant_id_server_type_server_name", table_name="mcp_servers")
    op.drop_table("mcp_servers")
