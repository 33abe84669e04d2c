"""merge heads of the messages and resources branches (bench branch only)

The integrator chains every helper's revision linearly; this merge point only lets the bench
branch run both slices before that happens, and goes away with the chaining.

Revision ID: be9c0e11a2d4
Revises: ec3d65a62ca4, a14c3fd14714
Create Date: 2026-11-29 23:45:00+00:00
"""

from __future__ import annotations

from collections.abc import Sequence

revision: str = "be9c0e11a2d4"
down_revision: str | Sequence[str] | None = ("ec3d65a62ca4", "a14c3fd14714")
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
