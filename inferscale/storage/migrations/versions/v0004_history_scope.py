"""``memory_history.user_id / agent_id / run_id``: the scope of the memory each history row describes.

A memory's history outlives it (``memory_id`` is no foreign key), but its scope lived only in ``memories``: once a
memory was deleted, ``history(memory_id, user_id=...)`` could not tell whose it had been and answered ``[]``, and a
server key bound to some users could not read it at all. Each new history row records the scope (a memory never
changes scope, so every row of one memory holds the same).

No row is rewritten: adding nullable columns is a change to the catalogue alone on both backends, so the upgrade
holds its lock for an instant whatever the table's size. A row with all three ``NULL`` (written before this
revision, or by a process still running an older InferScale) takes its memory's scope when it is read, from the
live memory (:func:`inferscale.storage.queries.history`); a memory deleted before this revision has none, so a
scoped read never returns its rows: they stay readable without ids, as before.

Revision ID: 0004_history_scope
Revises: 0003_chain_from
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_history_scope"
down_revision: str | None = "0003_chain_from"
branch_labels: str | None = None
depends_on: str | None = None

SCOPE_COLUMNS = ("user_id", "agent_id", "run_id")
MAX_ID_LENGTH = 255  # inferscale.storage.models.MAX_ID_LENGTH when this revision was written


def upgrade() -> None:
    """Add the three nullable columns."""
    for name in SCOPE_COLUMNS:
        op.add_column("memory_history", sa.Column(name, sa.String(MAX_ID_LENGTH), nullable=True))


def downgrade() -> None:
    """Drop the columns (SQLite rebuilds the table in batch mode)."""
    with op.batch_alter_table("memory_history") as batch:
        for name in SCOPE_COLUMNS:
            batch.drop_column(name)
