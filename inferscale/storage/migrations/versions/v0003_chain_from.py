"""``memories.chain_from``: where a memory's bounded chain starts in its stored context (NULL: in no chain).

A memory of a bounded chain (``kv.chain_block``, docs/architecture.md) is encoded on the stored K/V of the memories
before it in its block, not after their text. Its ``context`` holds its block anchor's context turns, then the texts
of the block's earlier memories; ``chain_from`` is the index where those texts start. Existing rows get NULL: they
are encoded as before.

Revision ID: 0003_chain_from
Revises: 0002_user_scope_index
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_chain_from"
down_revision: str | None = "0002_user_scope_index"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the nullable column (no rewrite of the rows: NULL needs none on either backend)."""
    op.add_column("memories", sa.Column("chain_from", sa.Integer(), nullable=True))


def downgrade() -> None:
    """Drop the column (SQLite rebuilds the table in batch mode)."""
    with op.batch_alter_table("memories") as batch:
        batch.drop_column("chain_from")
