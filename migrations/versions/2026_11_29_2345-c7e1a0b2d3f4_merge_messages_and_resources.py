"""Join the messages and resources heads on the client branch.

Only so that the client tests can run against every endpoint before the integrator chains the
slices' revisions linearly; drop this file then.

Revision ID: c7e1a0b2d3f4
Revises: a14c3fd14714, ec3d65a62ca4
Create Date: 2026-11-29 23:45:00
"""

from __future__ import annotations

revision = "c7e1a0b2d3f4"
down_revision = ("a14c3fd14714", "ec3d65a62ca4")
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
