"""Baseline: ``api_keys`` as InferScale 0.1 created it.

Revision ID: 0001_api_keys
Revises: (none)
"""

from __future__ import annotations

from alembic import op

from inferscale.server.migrations.baseline import baseline_metadata

revision = "0001_api_keys"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Create ``api_keys`` (an existing table is an error: checked before stamping)."""
    baseline_metadata().create_all(op.get_bind(), checkfirst=False)


def downgrade() -> None:
    """Drop ``api_keys``."""
    baseline_metadata().drop_all(op.get_bind(), checkfirst=False)
