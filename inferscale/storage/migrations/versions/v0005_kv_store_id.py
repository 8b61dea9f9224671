"""``kv_entries.store_id``: which K/V folder holds the entry's file (NULL: no disk tier, or an older row).

Each K/V folder holds a random id of its own (:meth:`inferscale.kv.tiers.DiskTier.store_id`), and every row written
with a disk tier records it. Two hosts sharing one database may each keep K/V at the same path on their own disk
(the default data folder): a row's ``location`` cannot tell them apart, its folder's id can. Reconciliation deletes a
row whose file is gone only when the row names its own folder, so one host no longer deletes the rows of files it
cannot see, which made the other host remove those files as unaccounted for (:func:`inferscale.reconcile.filed_here`).

No row is rewritten (a nullable column is a change to the catalogue alone on both backends). A row with ``NULL``
is judged by its location, as before.

Revision ID: 0005_kv_store_id
Revises: 0004_history_scope
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_kv_store_id"
down_revision: str | None = "0004_history_scope"
branch_labels: str | None = None
depends_on: str | None = None

STORE_ID_LENGTH = 32  # inferscale.storage.models.STORE_ID_LENGTH when this revision was written


def upgrade() -> None:
    """Add the nullable column."""
    op.add_column("kv_entries", sa.Column("store_id", sa.String(STORE_ID_LENGTH), nullable=True))


def downgrade() -> None:
    """Drop the column (SQLite rebuilds the table in batch mode)."""
    with op.batch_alter_table("kv_entries") as batch:
        batch.drop_column("store_id")
