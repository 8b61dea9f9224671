"""The memory store's tables as InferScale 0.1 made them with ``create_all`` (before the schema was versioned),
frozen here: revision ``0001_baseline`` creates them, and a database made before versioning is checked against
them. Later changes go in new revisions, never here."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)


def baseline_metadata() -> MetaData:
    """A new ``MetaData`` holding ``memories``, ``memory_history`` and ``kv_entries`` as revision ``0001_baseline``
    defines them (keys are ``INTEGER`` on SQLite, for its rowid alias and ``AUTOINCREMENT``, ``BIGINT`` elsewhere;
    ids 36 characters, hashes 64, scope ids, keys and actors 255)."""
    key = BigInteger().with_variant(Integer(), "sqlite")
    metadata = MetaData()
    Table(
        "memories",
        metadata,
        Column("pk", key, primary_key=True, autoincrement=True),
        Column("id", String(36), nullable=False),
        Column("text", Text, nullable=False),
        Column("hash", String(64), nullable=False),
        Column("user_id", String(255)),
        Column("agent_id", String(255)),
        Column("run_id", String(255)),
        Column("metadata", JSON, nullable=False),
        Column("context", JSON, nullable=False),
        Column("created_at", DateTime(timezone=True), nullable=False),
        Column("updated_at", DateTime(timezone=True), nullable=False),
        Index("ix_memories_id", "id", unique=True),
        Index("ix_memories_hash", "hash"),
        Index("ix_memories_user_id", "user_id"),
        Index("ix_memories_agent_id", "agent_id"),
        Index("ix_memories_run_id", "run_id"),
        sqlite_autoincrement=True,
    )
    Table(
        "memory_history",
        metadata,
        Column("id", key, primary_key=True, autoincrement=True),
        Column("memory_id", String(36), nullable=False),
        Column("event", String(16), nullable=False),
        Column("old_text", Text),
        Column("new_text", Text),
        Column("old_metadata", JSON(none_as_null=True)),
        Column("new_metadata", JSON(none_as_null=True)),
        Column("actor", String(255)),
        Column("created_at", DateTime(timezone=True), nullable=False),
        Index("ix_memory_history_memory_id", "memory_id"),
    )
    Table(
        "kv_entries",
        metadata,
        Column("id", key, primary_key=True, autoincrement=True),
        Column("memory_id", String(36), ForeignKey("memories.id", ondelete="CASCADE"), nullable=False),
        Column("text_hash", String(64), nullable=False),
        Column("fingerprint", String(255), nullable=False),
        Column("encoding_key", String(255), nullable=False),
        Column("n_tokens", Integer, nullable=False),
        Column("nbytes", BigInteger, nullable=False),
        Column("location", Text, nullable=False),
        Column("created_at", DateTime(timezone=True), nullable=False),
        UniqueConstraint("memory_id", "fingerprint", "encoding_key", name="uq_kv_entries_memory_fp_key"),
        Index("ix_kv_entries_memory_id", "memory_id"),
    )
    return metadata
