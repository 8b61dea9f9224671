"""Baseline: ``memories``, ``memory_history`` and ``kv_entries`` as InferScale 0.1 created them.

Revision ID: 0001_baseline
Revises: (none)
"""

from __future__ import annotations

from alembic import op

from inferscale.storage.migrations.baseline import baseline_metadata

revision = "0001_baseline"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Create the three tables and their indexes (an existing table is an error: checked before stamping)."""
    baseline_metadata().create_all(op.get_bind(), checkfirst=False)


def downgrade() -> None:
    """Drop the three tables."""
    baseline_metadata().drop_all(op.get_bind(), checkfirst=False)
