"""SQLAlchemy 2.0 models: memories (the source of truth), their history and the index of stored fact KV.

Every timestamp is a tz-aware UTC ``datetime``. SQLite stores datetimes without a zone, so :class:`UTCDateTime`
converts to UTC on the way in and re-attaches UTC on the way out; PostgreSQL uses ``timestamptz``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Dialect,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from inferscale.scope import MAX_ID_LENGTH

# SQLite only aliases the rowid (and autoincrements) for the exact type "INTEGER PRIMARY KEY"; elsewhere the
# FAISS vector id needs the full int64 range.
_Int64Key = BigInteger().with_variant(Integer(), "sqlite")

ID_LENGTH = 36  # a UUID4 in its canonical text form
STORE_ID_LENGTH = 32  # a K/V folder's id: a UUID4's hex digits
HASH_LENGTH = 64  # a sha256 hex digest
KEY_LENGTH = 255  # fingerprints and encoding keys


def utc_now() -> datetime:
    """The current time as a tz-aware UTC ``datetime``."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A ``DateTime(timezone=True)`` that always returns tz-aware UTC values.

    Raises:
        ValueError: when a naive ``datetime`` is bound (its zone would be a guess).
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass a tz-aware value (e.g. datetime.now(UTC))")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:  # SQLite drops the zone; values were written in UTC
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class Base(DeclarativeBase):
    """Declarative base of every InferScale table."""

    type_annotation_map: ClassVar[dict[Any, Any]] = {
        dict[str, Any]: JSON,
        list[str]: JSON,
        datetime: UTCDateTime,
    }


class MemoryRow(Base):
    """One stored fact (table ``memories``).

    ``pk`` is the integer key and also the fact's FAISS vector id; it is never reused on SQLite
    (``AUTOINCREMENT``) nor on PostgreSQL (a sequence), so a stale vector can never point at a newer fact.
    ``id`` is the public UUID4 string.
    """

    __tablename__ = "memories"
    # A scoped search reads (pk, id, hash) of a user's memories by pk: this index holds them, so the read is one
    # range of it (revision 0002_user_scope_index); its first column also serves every other user_id lookup.
    __table_args__ = (
        Index("ix_memories_user_scope", "user_id", "pk", "id", "hash"),
        {"sqlite_autoincrement": True},
    )

    pk: Mapped[int] = mapped_column(_Int64Key, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(ID_LENGTH), unique=True, index=True)
    text: Mapped[str] = mapped_column(Text)
    hash: Mapped[str] = mapped_column(String(HASH_LENGTH), index=True)
    user_id: Mapped[str | None] = mapped_column(String(MAX_ID_LENGTH))
    agent_id: Mapped[str | None] = mapped_column(String(MAX_ID_LENGTH), index=True)
    run_id: Mapped[str | None] = mapped_column(String(MAX_ID_LENGTH), index=True)
    # ``metadata`` is reserved on declarative classes; the column keeps the plain name.
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    context: Mapped[list[str]] = mapped_column(JSON, default=list)
    # Where the texts of the memory's bounded chain start in ``context`` (revision 0003_chain_from); NULL when the
    # memory is in no chain (inferscale.storage.contexts).
    chain_from: Mapped[int | None] = mapped_column(Integer, nullable=True, default=None)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utc_now)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utc_now)


class HistoryRow(Base):
    """One change to a memory (table ``memory_history``): ``event`` is ``"ADD"``, ``"UPDATE"`` or ``"DELETE"``.

    ``memory_id`` is deliberately not a foreign key: history outlives the memory it describes, so each row also
    records that memory's scope (revision 0004_history_scope). All three are ``NULL`` on rows written before it or
    by an older InferScale: a read takes the live memory's scope for them, and a deletion records it in them first;
    the rows of a memory deleted before the revision have none.
    """

    __tablename__ = "memory_history"

    id: Mapped[int] = mapped_column(_Int64Key, primary_key=True, autoincrement=True)
    memory_id: Mapped[str] = mapped_column(String(ID_LENGTH), index=True)
    event: Mapped[str] = mapped_column(String(16))
    old_text: Mapped[str | None] = mapped_column(Text)
    new_text: Mapped[str | None] = mapped_column(Text)
    old_metadata: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    new_metadata: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    actor: Mapped[str | None] = mapped_column(String(KEY_LENGTH))
    user_id: Mapped[str | None] = mapped_column(String(MAX_ID_LENGTH))
    agent_id: Mapped[str | None] = mapped_column(String(MAX_ID_LENGTH))
    run_id: Mapped[str | None] = mapped_column(String(MAX_ID_LENGTH))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utc_now)


class KVEntryRow(Base):
    """Where the KV tensors of one fact, for one model fingerprint and encoding, are stored (``kv_entries``).

    Attributes:
        text_hash: sha256 hex of the text the KV was encoded from (detects a stale entry after an update).
        fingerprint: identifies the model (weights, dtype, whole config) and tokenizer that produced the KV.
        encoding_key: identifies how and after what the fact was encoded (prefix tokens, context turns, w, mode,
            bucket), so variants coexist.
        n_tokens: the fact's token count (tokens).
        nbytes: size of the stored tensors (bytes).
        location: where the tensors live (a file path or a store key).
        store_id: the id of the K/V folder holding the file (:meth:`inferscale.kv.tiers.DiskTier.store_id`);
            ``NULL`` without a disk tier, or for a row written before revision ``0005_kv_store_id``.
    """

    __tablename__ = "kv_entries"
    __table_args__ = (UniqueConstraint("memory_id", "fingerprint", "encoding_key", name="uq_kv_entries_memory_fp_key"),)

    id: Mapped[int] = mapped_column(_Int64Key, primary_key=True, autoincrement=True)
    memory_id: Mapped[str] = mapped_column(String(ID_LENGTH), ForeignKey("memories.id", ondelete="CASCADE"), index=True)
    text_hash: Mapped[str] = mapped_column(String(HASH_LENGTH))
    fingerprint: Mapped[str] = mapped_column(String(KEY_LENGTH))
    encoding_key: Mapped[str] = mapped_column(String(KEY_LENGTH))
    n_tokens: Mapped[int] = mapped_column(Integer)
    nbytes: Mapped[int] = mapped_column(BigInteger)
    location: Mapped[str] = mapped_column(Text)
    store_id: Mapped[str | None] = mapped_column(String(STORE_ID_LENGTH))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utc_now)
