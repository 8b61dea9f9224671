"""A covering index for a user's scope: ``memories (user_id, pk, id, hash)`` replaces ``ix_memories_user_id``.

Every scoped search first reads ``(pk, id, hash)`` of the scope's memories, ordered by ``pk``
(:func:`inferscale.storage.queries.select_versions`). A user's rows are spread over the whole table (written as
they came, among everyone else's), so with the plain ``user_id`` index each of them cost a table page; this index
holds the columns read, in the order read, so the scope is one contiguous range of the index (SQLite's "covering
index", PostgreSQL's index-only scan). Its first column serves every lookup the old index served.

Revision ID: 0002_user_scope_index
Revises: 0001_baseline
"""

from __future__ import annotations

from alembic import op

revision = "0002_user_scope_index"
down_revision: str | None = "0001_baseline"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Create the covering index, then drop the one it supersedes."""
    # A plain CREATE INDEX, not CONCURRENTLY: on PostgreSQL it holds a SHARE lock on memories while it builds
    # (writes wait, reads go on). CONCURRENTLY cannot run inside a transaction block, and ensure_schema runs the
    # whole chain in one write transaction that holds the schema lock (pg_advisory_xact_lock, released only when
    # that transaction ends; BEGIN IMMEDIATE on SQLite). Alembic's autocommit_block() cannot leave a transaction
    # its caller began (it asserts: tried with Alembic 1.20), and committing that transaction here would release
    # the schema lock mid-upgrade (a second process would run this revision too) and lose the all-or-nothing
    # rollback of a failed upgrade.
    op.create_index("ix_memories_user_scope", "memories", ["user_id", "pk", "id", "hash"])
    op.drop_index("ix_memories_user_id", table_name="memories")


def downgrade() -> None:
    """Restore the plain ``user_id`` index and drop the covering one."""
    op.create_index("ix_memories_user_id", "memories", ["user_id"])
    op.drop_index("ix_memories_user_scope", table_name="memories")
