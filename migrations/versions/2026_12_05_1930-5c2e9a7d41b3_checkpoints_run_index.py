"""checkpoints: the runs' index leads with run_id

Revision ID: 5c2e9a7d41b3
Revises: 3b8f0c6d2e51
Create Date: 2026-12-05 19:30:00+00:00

`ix_checkpoints_tenant_id_run_id` served one statement, the deletion of runs' checkpoints
(`tenant_id = :tenant AND run_id IN (...)`), which `(run_id, tenant_id)` serves as well. But
an index led by `tenant_id` is also one Postgres can take to find a tenant's checkpoints,
and with statistics taken while the table was small (a new deployment's first minutes, a
short benchmark) the planner took it, small as it is, for every lookup of a checkpoint by
its key: a scan of the tenant's checkpoints per step of a parent-chain walk (37 ms instead
of 1.5 for a walk of 150, docs/PERFORMANCE.md). Led by `run_id`, it serves only what it is
for. Building it reads the table once, holding off checkpoint writes meanwhile.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "5c2e9a7d41b3"
down_revision: str | Sequence[str] | None = "3b8f0c6d2e51"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_checkpoints_run_id_tenant_id", "checkpoints", ["run_id", "tenant_id"])
    op.drop_index("ix_checkpoints_tenant_id_run_id", table_name="checkpoints")


def downgrade() -> None:
    op.create_index("ix_checkpoints_tenant_id_run_id", "checkpoints", ["tenant_id", "run_id"])
    op.drop_index("ix_checkpoints_run_id_tenant_id", table_name="checkpoints")
