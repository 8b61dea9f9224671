"""The memory store with ``async`` methods: SQLite sessions on worker threads, PostgreSQL's on the event loop.

Same tables, same statements and the same transaction bodies as :class:`~inferscale.storage.MemoryStore`: every
method validates its arguments and runs one session function of :mod:`~inferscale.storage.queries`,
:mod:`~inferscale.storage.changes` or :mod:`~inferscale.storage.kv_entries` through the database's
:mod:`~inferscale.storage.async_sessions` runner (a worker thread for SQLite, which has no async I/O and whose
transactions a cancellation must not cut short; psycopg's async mode through ``AsyncSession.run_sync`` for
PostgreSQL). PostgreSQL needs ``greenlet`` (``sqlalchemy[asyncio]``, a core dependency).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

import numpy as np
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from inferscale.errors import ConfigError
from inferscale.filters import Filter
from inferscale.scope import Scope
from inferscale.storage.async_sessions import session_runner
from inferscale.storage.change_sets import (
    AppliedChanges,
    ChangeSet,
    add_change,
    delete_change,
    update_change,
    validate_changes,
)
from inferscale.storage.changes import apply_in_session, delete_scope_in_session, reset_in_session
from inferscale.storage.database import shown_url
from inferscale.storage.kv_entries import (
    NewKVEntry,
    delete_kv_entries_in_session,
    delete_kv_entry_rows_in_session,
    put_kv_entry_in_session,
)
from inferscale.storage.queries import (
    all_kv_entries,
    all_memories,
    by_vector_ids,
    get_kv_entry,
    get_memory,
    history,
    latest_memories,
    list_memories,
    memories_with_hash,
    memory_states,
    memory_versions,
    vector_ids_in_scope,
)
from inferscale.storage.records import HistoryRecord, KVEntryRecord, MemoryRecord, MemoryVersions
from inferscale.storage.store import MemoryStore
from inferscale.storage.validation import (
    check_actor,
    check_id,
    check_limit,
    check_positive,
    check_scope,
    check_text,
    check_vector_ids,
)

_P = ParamSpec("_P")
_T = TypeVar("_T")


class AsyncMemoryStore:
    """Memories, history and KV entries in one SQL database, with ``async`` methods. Construction does no I/O;
    the database is opened and the schema created or upgraded on first use.

    Args:
        url: a SQLAlchemy URL in its sync or async form (see :func:`~inferscale.storage.async_sessions.session_url`).
        sqlite_store: for a SQLite ``url``, the sync store of the same database to share the engine of (one
            in-memory database, one connection pool); a new one when ``None``.

    Raises:
        ConfigError: when ``url`` is empty or has no async driver, or ``sqlite_store`` is on another database.

    Every method may also raise ``ConfigError`` or ``SchemaError`` on the database's first use and
    ``DatabaseUnavailableError`` when the database cannot be used (as :class:`~inferscale.storage.MemoryStore`'s).
    """

    def __init__(self, url: str, sqlite_store: MemoryStore | None = None) -> None:
        if not isinstance(url, str) or not url.strip():
            raise ConfigError(f"database url must be a non-empty string, got {url!r}")
        self._sessions = session_runner(url, sqlite_store)

    def __repr__(self) -> str:
        return f"AsyncMemoryStore({shown_url(self.url)!r})"

    @property
    def url(self) -> str:
        """The SQLAlchemy URL in use: SQLite's sync form, PostgreSQL's async driver form."""
        return self._sessions.url

    async def run_read(self, fn: Callable[Concatenate[Session, _P], _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """``fn(session, *args, **kwargs)`` in a read session (``fn``: a session function of :mod:`.queries`), as
        :meth:`MemoryStore.run_read <inferscale.storage.MemoryStore.run_read>`."""
        return await self._sessions.read(fn, *args, **kwargs)

    async def _write(self, fn: Callable[Concatenate[Session, _P], _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """``fn(session, *args, **kwargs)`` in one write transaction (``BEGIN IMMEDIATE`` on SQLite); committed when it
        returns and rolled back when it raises. A caller cancelled meanwhile: on SQLite a write whose session has
        begun still commits (it runs on a thread), one still queued is dropped; on PostgreSQL it is rolled back unless
        its commit had been sent."""
        return await self._sessions.write(fn, *args, **kwargs)

    async def dialect(self) -> str:
        """The database's dialect name (``"sqlite"`` or ``"postgresql"``)."""
        return await self._sessions.dialect()

    async def close(self) -> None:
        """Release the database connections (on SQLite once the writes queued before have run; on PostgreSQL, the
        running loop's engine and those of closed loops); the store reconnects if used again, except that an
        in-memory SQLite database is dropped with its connection."""
        await self._sessions.close()

    # ---- reads -----------------------------------------------------------------------------------------------
    async def get(self, memory_id: str, scope: Scope | None = None) -> MemoryRecord | None:
        """The memory with id ``memory_id``; ``None`` when there is none or it is outside ``scope`` (checked in SQL).

        Raises:
            InvalidInputError: when ``memory_id`` is not a non-empty str or ``scope`` is not a Scope.
        """
        memory_id = check_id(memory_id)
        checked = check_scope(scope) if scope is not None else None
        return await self.run_read(get_memory, memory_id, checked)

    async def memories_with_hash(self, text_hash: str, scope: Scope, limit: int | None = None) -> list[MemoryRecord]:
        """The memories of exactly ``scope`` whose text hashes to ``text_hash``, oldest first, at most ``limit``;
        see :meth:`MemoryStore.memories_with_hash <inferscale.storage.MemoryStore.memories_with_hash>`.

        Raises:
            InvalidInputError: as the sync store's.
        """
        checked = (check_text(text_hash, "text_hash"), check_scope(scope), check_limit(limit))
        return await self.run_read(memories_with_hash, *checked)

    async def list(
        self, scope: Scope, limit: int | None = None, filters: Filter | None = None
    ) -> builtins.list[MemoryRecord]:
        """The memories of ``scope`` matching ``filters``, oldest first, at most ``limit``.

        Raises:
            InvalidInputError: for a non-Scope or a bad limit.
        """
        scope = check_scope(scope)
        return await self.run_read(list_memories, scope, filters, check_limit(limit))

    async def latest(self, scope: Scope, limit: int) -> builtins.list[MemoryRecord]:
        """The ``limit`` memories of exactly ``scope`` stored last, oldest first; see :meth:`MemoryStore.latest`."""
        return await self.run_read(latest_memories, check_scope(scope), check_positive(limit, "limit"))

    async def all_memories(self) -> builtins.list[MemoryRecord]:
        """Every memory of every scope, in vector-id order."""
        return await self.run_read(all_memories)

    async def vector_ids_in_scope(self, scope: Scope, filters: Filter | None = None) -> np.ndarray:
        """Vector ids of the memories of ``scope`` matching ``filters``: int64 ``[n]``, ascending.

        Raises:
            InvalidInputError: when ``scope`` is not a Scope.
        """
        return await self.run_read(vector_ids_in_scope, check_scope(scope), filters)

    async def by_vector_ids(self, ids: Sequence[int] | np.ndarray) -> dict[int, MemoryRecord]:
        """The memories whose vector id is in ``ids``, keyed by vector id; unknown ids are left out.

        Raises:
            InvalidInputError: when ``ids`` holds something other than integers.
        """
        wanted = sorted(set(check_vector_ids(ids)))
        return await self.run_read(by_vector_ids, wanted) if wanted else {}

    async def history(self, memory_id: str, scope: Scope | None = None) -> builtins.list[HistoryRecord]:
        """The changes to ``memory_id``, oldest first; see :meth:`MemoryStore.history`.

        Raises:
            InvalidInputError: when ``memory_id`` is not a non-empty str or ``scope`` not a Scope.
        """
        return await self.run_read(history, check_id(memory_id), check_scope(scope) if scope is not None else None)

    async def get_kv_entry(self, memory_id: str, fingerprint: str, encoding_key: str) -> KVEntryRecord | None:
        """The KV entry of ``(memory_id, fingerprint, encoding_key)``, or ``None``.

        Raises:
            InvalidInputError: when an argument is not a non-empty str.
        """
        memory_id = check_id(memory_id)
        fingerprint = check_text(fingerprint, "fingerprint")
        encoding_key = check_text(encoding_key, "encoding_key")
        return await self.run_read(get_kv_entry, memory_id, fingerprint, encoding_key)

    # ---- writes ----------------------------------------------------------------------------------------------
    async def apply(self, changes: ChangeSet) -> AppliedChanges:
        """Apply a change set in one transaction; see :meth:`MemoryStore.apply`.

        Raises:
            InvalidInputError: for an invalid change. MemoryNotFoundError: with ``strict``, for an unknown id.
        """
        return await self._write(apply_in_session, validate_changes(changes))

    async def add(
        self,
        text: str,
        scope: Scope,
        metadata: dict[str, Any] | None = None,
        context: Sequence[str] | None = None,
        actor: str | None = None,
    ) -> MemoryRecord:
        """Store a new memory and its ``ADD`` history row; see :meth:`MemoryStore.add`.

        Raises:
            InvalidInputError: for an empty text, a non-Scope scope, non-JSON metadata or non-str context.
        """
        return (await self._write(apply_in_session, add_change(text, scope, metadata, context, actor))).added[0]

    async def update(
        self,
        memory_id: str,
        text: str | None,
        metadata: dict[str, Any] | None = None,
        actor: str | None = None,
    ) -> MemoryRecord:
        """Replace a memory's text and/or metadata with an ``UPDATE`` history row; see :meth:`MemoryStore.update`.

        Raises:
            InvalidInputError: when neither ``text`` nor ``metadata`` is given, or either is invalid.
            MemoryNotFoundError: when no memory has id ``memory_id``.
        """
        applied = await self._write(apply_in_session, update_change(memory_id, text, metadata, actor))
        return applied.updated[0][1]

    async def delete(self, memory_id: str, actor: str | None = None) -> MemoryRecord:
        """Delete a memory and its KV entries with a ``DELETE`` history row; returns it as it was before.

        Raises:
            InvalidInputError: when ``memory_id`` or ``actor`` is not a non-empty str.
            MemoryNotFoundError: when no memory has id ``memory_id``.
        """
        return (await self._write(apply_in_session, delete_change(memory_id, actor))).deleted[0]

    async def delete_scope(self, scope: Scope, actor: str | None = None) -> builtins.list[MemoryRecord]:
        """Delete every memory of ``scope`` with a DELETE history row each; returns them, oldest first.

        Raises:
            InvalidInputError: when ``scope`` is not a Scope or ``actor`` is not a non-empty str.
        """
        scope = check_scope(scope)
        return await self._write(delete_scope_in_session, scope, check_actor(actor))

    async def reset(self) -> builtins.list[str]:
        """Delete every row of every table; returns the ids of the memories it knew (as :meth:`MemoryStore.reset`)."""
        return await self._write(reset_in_session)

    async def put_kv_entry(
        self,
        memory_id: str,
        text_hash: str,
        fingerprint: str,
        encoding_key: str,
        n_tokens: int,
        nbytes: int,
        location: str,
        store_id: str | None = None,
        encoded_from: MemoryRecord | None = None,
    ) -> KVEntryRecord:
        """Insert or replace the KV entry of ``(memory_id, fingerprint, encoding_key)``; see
        :meth:`MemoryStore.put_kv_entry` (same arguments).

        Raises:
            InvalidInputError: when an argument is empty, too long or negative, or ``encoded_from`` is another's.
            MemoryNotFoundError: when no memory has id ``memory_id`` (``MemoryChangedError`` when it changed).
        """
        new = NewKVEntry.checked(
            memory_id, text_hash, fingerprint, encoding_key, n_tokens, nbytes, location, store_id, encoded_from
        )
        try:
            return await self._write(put_kv_entry_in_session, new)
        except IntegrityError:  # a concurrent writer inserted the same key: this time the row exists
            return await self._write(put_kv_entry_in_session, new)

    async def delete_kv_entries(self, memory_id: str) -> builtins.list[KVEntryRecord]:
        """Delete the KV entries of ``memory_id`` and return them, oldest first.

        Raises:
            InvalidInputError: when ``memory_id`` is not a non-empty str.
        """
        return await self._write(delete_kv_entries_in_session, check_id(memory_id))

    async def versions(self, scope: Scope | None = None, filters: Filter | None = None) -> MemoryVersions:
        """Vector ids, ids, text hashes of ``scope``'s memories matching ``filters`` (all for ``None``); reconcile."""
        return await self.run_read(memory_versions, check_scope(scope) if scope is not None else None, filters)

    async def memory_states(self, memory_ids: Sequence[str]) -> dict[str, bool]:
        """Of ``memory_ids``, those this database ever stored: ``True`` while stored, ``False`` once deleted."""
        return await self.run_read(memory_states, [check_id(memory_id) for memory_id in memory_ids])

    async def all_kv_entries(self) -> builtins.list[KVEntryRecord]:
        """Every KV entry, by row id."""
        return await self.run_read(all_kv_entries)

    async def delete_kv_entry_rows(self, row_ids: Sequence[int]) -> int:
        """Delete the KV entries with these row ids; returns how many were deleted (ids already gone count 0)."""
        return await self._write(delete_kv_entry_rows_in_session, check_vector_ids(row_ids))


__all__ = ["AsyncMemoryStore"]
