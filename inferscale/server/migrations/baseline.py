"""The ``api_keys`` table as InferScale 0.1 made it with ``create_all`` (before it was versioned), frozen here:
revision ``0001_api_keys`` creates it, and a table made before versioning is checked against it. Later changes go
in new revisions, never here."""

from __future__ import annotations

from sqlalchemy import JSON, Boolean, Column, DateTime, LargeBinary, MetaData, String, Table


def baseline_metadata() -> MetaData:
    """A new ``MetaData`` holding ``api_keys`` as revision ``0001_api_keys`` defines it (key ids 12 characters,
    names 255; salt 16 bytes and scrypt hash 64 bytes; scope lists as JSON, ``NULL`` for any)."""
    metadata = MetaData()
    Table(
        "api_keys",
        metadata,
        Column("key_id", String(12), primary_key=True),
        Column("name", String(255), nullable=False),
        Column("salt", LargeBinary(16), nullable=False),
        Column("secret_hash", LargeBinary(64), nullable=False),
        Column("admin", Boolean, nullable=False),
        Column("user_ids", JSON),
        Column("agent_ids", JSON),
        Column("run_ids", JSON),
        Column("created_at", DateTime(timezone=True), nullable=False),
        Column("revoked_at", DateTime(timezone=True)),
    )
    return metadata
