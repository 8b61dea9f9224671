"""The storage layer: SQLAlchemy models and the :class:`MemoryStore` (SQL is the source of truth).

The async store lives in :mod:`inferscale.storage.async_store` (imported on demand: it needs ``greenlet`` and
``aiosqlite``).
"""

from inferscale.storage.changes import AppliedChanges, ChangeSet, MemoryUpdate, NewMemory
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
    "AppliedChanges",
    "Base",
    "ChangeSet",
    "HistoryEvent",
    "HistoryRecord",
    "HistoryRow",
    "KVEntryRecord",
    "KVEntryRow",
    "MemoryRecord",
    "MemoryRow",
    "MemoryStore",
    "MemoryUpdate",
    "NewMemory",
    "hash_text",
    "make_engine",
]
