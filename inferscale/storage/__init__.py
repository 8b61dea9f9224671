"""The storage layer: SQLAlchemy models and the :class:`MemoryStore` (SQL is the source of truth).

Modules, each importing only those before it: ``database`` (engines), ``models`` (tables), ``records`` (frozen
copies of rows), ``validation`` (input checks), ``filter_sql`` (filters → ``WHERE``), ``queries`` (every read),
``change_sets`` (what a change is), ``contexts`` (stored contexts keep only texts their scope holds), ``changes``
and ``kv_entries`` (every write, as session functions), then the shells ``store`` (sync), ``async_sessions``
(where the async store runs a session: a worker thread for SQLite, the event loop for PostgreSQL) and
``async_store`` (async).

The async store lives in :mod:`inferscale.storage.async_store` (imported on demand: PostgreSQL's async sessions
need ``greenlet``).
"""

from inferscale.storage.change_sets import AppliedChanges, ChangeSet, MemoryUpdate, NewMemory, PastChange
from inferscale.storage.database import make_engine
from inferscale.storage.models import Base, HistoryRow, KVEntryRow, MemoryRow
from inferscale.storage.records import HistoryEvent, HistoryRecord, KVEntryRecord, MemoryRecord, hash_text
from inferscale.storage.store import MemoryStore

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
    "PastChange",
    "hash_text",
    "make_engine",
]
