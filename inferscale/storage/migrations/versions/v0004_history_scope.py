"""``memory_history.user_id / agent_id / run_id``: the scope of the memory each history row describes.

A memory's history outlives it (``memory_id`` is no foreign key), but its scope lived only in ``memories``: once a
memory was deleted, ``history(memory_id, user_id=...)`` could not tell whose it had been and answered ``[]``, and a
server key bound to some users could not read it at all. Each row now records the scope (a memory never changes
scope, so every row of one memory holds the same). Existing rows take it from their memory where it still exists;
rows of memories deleted before this revision keep ``NULL`` in all three, a scope no memory has (every memory sets
at least one id), so a scoped read never matches them: they stay readable unscoped, as before.

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
    """Add the three nullable columns, then copy each row's scope from its memory where the memory still exists."""
    for name in SCOPE_COLUMNS:
        op.add_column("memory_history", sa.Column(name, sa.String(MAX_ID_LENGTH), nullable=True))
    history = sa.table("memory_history", sa.column("memory_id"), *(sa.column(name) for name in SCOPE_COLUMNS))
    memories = sa.table("memories", sa.column("id"), *(sa.column(name) for name in SCOPE_COLUMNS))

    def of_memory(name: str) -> sa.ScalarSelect[object]:
        return sa.select(memories.c[name]).where(memories.c.id == history.c.memory_id).scalar_subquery()

    exists = sa.exists().where(memories.c.id == history.c.memory_id)
    op.execute(history.update().where(exists).values({name: of_memory(name) for name in SCOPE_COLUMNS}))


def downgrade() -> None:
    """Drop the columns (SQLite rebuilds the table in batch mode)."""
    with op.batch_alter_table("memory_history") as batch:
        for name in SCOPE_COLUMNS:
            batch.drop_column(name)
