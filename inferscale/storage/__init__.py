"""The storage layer: SQLAlchemy models and the :class:`MemoryStore` (SQL is the source of truth)."""

from inferscale.storage.database import make_engine
from inferscale.storage.models import Base, HistoryRow, KVEntryRow, MemoryRow
from inferscale.storage.repository import (
    HistoryEvent,
    HistoryRecord,
    KVEntryRecord,
    MemoryRecord,
    MemoryStore,
    hash_text,
)

__all__ = [
    "Base",
    "HistoryEvent",
    "HistoryRecord",
    "HistoryRow",
    "KVEntryRecord",
    "KVEntryRow",
    "MemoryRecord",
    "MemoryRow",
    "MemoryStore",
    "hash_text",
    "make_engine",
]
