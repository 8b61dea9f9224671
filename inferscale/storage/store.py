"""The memory store: memories, their history and KV-entry bookkeeping in any SQL database (the source of truth).

:class:`MemoryStore` is a thin shell: each method validates its arguments (:mod:`~inferscale.storage.validation`),
opens a session (a write transaction for writes) and calls one session function of :mod:`.queries`, :mod:`.changes`
or :mod:`.kv_entries`, the same functions :class:`~inferscale.storage.async_store.AsyncMemoryStore` runs.

Everything returned is a frozen record detached from the session, so callers never hold ORM objects. Inputs
are validated before anything is written; a rejected call leaves the database untouched. Scope semantics are
:mod:`~inferscale.storage.queries`'s.
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Callable, Sequence
from typing import Any, Concatenate, ParamSpec, Self, TypeVar

import numpy as np
from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from inferscale.errors import ConfigError
from inferscale.filters import Filter
from inferscale.scope import Scope
from inferscale.storage.change_sets import (
    AppliedChanges,
    ChangeSet,
    add_change,
    delete_change,
    update_change,
    validate_changes,
)
from inferscale.storage.changes import apply_in_session, delete_scope_in_session, reset_in_session
from inferscale.storage.database import make_engine, shown_url
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
    get_memories,
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
from inferscale.storage.schema import MEMORY_SCHEMA, ensure_schema
from inferscale.storage.uninterrupted import guarded_session
from inferscale.storage.validation import (
    check_actor,
    check_id,
    check_ids,
    check_limit,
    check_positive,
    check_scope,
    check_text,
    check_vector_ids,
)

_P = ParamSpec("_P")
_T = TypeVar("_T")


class MemoryStore:
    """Memories, history and KV entries in one SQL database, addressed by a SQLAlchemy URL.

    The constructor does no I/O: the engine is created and the schema created or upgraded (versioned with Alembic,
    :mod:`~inferscale.storage.schema`) on first use, once, under a lock, so a store may be shared by threads and
    several processes may open one new database at once. Every method runs in its own transaction.

    Args:
        url: any SQLAlchemy URL, e.g. ``sqlite:////home/me/.cache/inferscale/memory.db`` or
            ``postgresql+psycopg://postgres@127.0.0.1:5432/inferscale``.

    Raises:
        ConfigError: when ``url`` is not a non-empty string (a malformed URL is reported on first use).

    Every method may also raise ``DatabaseUnavailableError`` when the database cannot be connected to.
    """

    def __init__(self, url: str) -> None:
        if not isinstance(url, str) or not url.strip():
            raise ConfigError(f"database url must be a non-empty string, got {url!r}")
        self._url = url
        self._engine: Engine | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        """The SQLAlchemy URL this store was opened with."""
        return self._url

    def __repr__(self) -> str:
        return f"MemoryStore({shown_url(self._url)!r})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---- lifecycle ---------------------------------------------------------------------------------------

    @property
    def engine(self) -> Engine:
        """The engine, created on first access, with the schema created or upgraded to its head revision
        (:func:`~inferscale.storage.schema.ensure_schema`: safe when processes open one new database at once).

        Raises:
            ConfigError: when the URL is malformed or its driver is not installed.
            SchemaError: when the database is at a revision this InferScale does not know, or holds unversioned
                tables that differ from its schema.
        """
        engine = self._engine
        if engine is not None:
            return engine
        with self._lock:
            if self._engine is None:
                engine = make_engine(self._url)
                try:
                    ensure_schema(engine, MEMORY_SCHEMA)
                except BaseException:
                    engine.dispose()
                    raise
                self._engine = engine
            return self._engine

    def run_read(self, fn: Callable[Concatenate[Session, _P], _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """``fn(session, *args, **kwargs)`` in a read session (``fn``: a session function of :mod:`.queries`)."""
        with guarded_session(self.engine) as s:  # no Ctrl-C leaves it open, sessions take turns on one connection
            return fn(s, *args, **kwargs)

    def run_write(self, fn: Callable[Concatenate[Session, _P], _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """``fn(session, *args, **kwargs)`` in one write transaction (``BEGIN IMMEDIATE`` on SQLite), committed
        when it returns and rolled back when it raises (``fn``: one of :mod:`.changes` or :mod:`.kv_entries`)."""
        with guarded_session(self.engine, write=True) as s:
            return fn(s, *args, **kwargs)

    @property
    def dialect(self) -> str:
        """The database's dialect name, e.g. ``"sqlite"`` or ``"postgresql"`` (opens the engine)."""
        return self.engine.dialect.name

    def close(self) -> None:
        """Dispose the engine's connections; the store reconnects if used again (an in-memory database, emptied)."""
        with self._lock:
            if self._engine is not None:
                self._engine.dispose()
                self._engine = None

    def reset(self) -> list[str]:
        """Delete every row (memories, history, KV entries; the schema stays); returns the ids it knew, sorted."""
        return self.run_write(reset_in_session)

    # ---- memories ----------------------------------------------------------------------------------------

    def add(
        self,
        text: str,
        scope: Scope,
        metadata: dict[str, Any] | None = None,
        context: Sequence[str] | None = None,
        actor: str | None = None,
    ) -> MemoryRecord:
        """Store a new memory and its ``ADD`` history row in one transaction (a text already stored is stored again).

        Args:
            text: the fact; a non-empty string, stored as given.
            scope: the ids the memory belongs to.
            metadata: JSON-serialisable dict (str keys; str/int/float/bool/None/list/dict values).
            context: preceding conversation turns used to encode the fact's KV (oldest first).
            actor: who made the change, recorded in the history.

        Returns:
            The stored memory, with its new UUID4 ``id`` and integer ``vector_id``.

        Raises:
            InvalidInputError: for an empty text, a non-Scope scope, non-JSON metadata or non-str context.
        """
        return self.run_write(apply_in_session, add_change(text, scope, metadata, context, actor)).added[0]

    def get(self, memory_id: str, scope: Scope | None = None) -> MemoryRecord | None:
        """The memory with public id ``memory_id``; ``None`` when there is none or it is outside ``scope``.

        Raises:
            InvalidInputError: when ``memory_id`` is not a non-empty str or ``scope`` is not a Scope.
        """
        return self.run_read(get_memory, check_id(memory_id), check_scope(scope) if scope is not None else None)

    def get_many(self, memory_ids: Sequence[str]) -> dict[str, MemoryRecord]:
        """The memories of ``memory_ids`` keyed by id, read in **any scope** (no scope check: pass only ids the
        caller may read, as the client's derived stores do). One query per :data:`~inferscale.storage.queries.IN_CHUNK`
        ids; unknown ids are left out.

        Raises:
            InvalidInputError: when ``memory_ids`` is a str (a list of ids is needed) or an id is not a non-empty str.
        """
        wanted = check_ids(memory_ids)
        return self.run_read(get_memories, wanted) if wanted else {}

    def memories_with_hash(self, text_hash: str, scope: Scope, limit: int | None = None) -> builtins.list[MemoryRecord]:
        """The memories of exactly ``scope`` whose text hashes to ``text_hash``, oldest first, at most ``limit``.

        Raises:
            InvalidInputError: for a bad ``text_hash`` (not a non-empty str), ``scope`` or ``limit`` (positive).
        """
        checked = (check_text(text_hash, "text_hash"), check_scope(scope), check_limit(limit))
        return self.run_read(memories_with_hash, *checked)

    def list(
        self, scope: Scope, limit: int | None = None, filters: Filter | None = None
    ) -> builtins.list[MemoryRecord]:
        """The memories in ``scope`` that match ``filters``, oldest first, at most ``limit`` (all when ``None``).

        Args:
            scope: the ids to stay inside.
            limit: the most memories to return.
            filters: a parsed filter (:func:`inferscale.filters.parse_filters`), compiled to SQL.

        Raises:
            InvalidInputError: when ``scope`` is not a Scope or ``limit`` is not a positive int.
        """
        return self.run_read(list_memories, check_scope(scope), filters, check_limit(limit))

    def latest(self, scope: Scope, limit: int) -> builtins.list[MemoryRecord]:
        """The ``limit`` memories of exactly ``scope`` stored last (every id it leaves unset unset too), oldest first:
        the neighbours a new memory of that scope is encoded after.

        Raises:
            InvalidInputError: when ``scope`` is not a Scope or ``limit`` is not a positive int.
        """
        return self.run_read(latest_memories, check_scope(scope), check_positive(limit, "limit"))

    def all_memories(self) -> builtins.list[MemoryRecord]:
        """Every memory of every scope, in ``vector_id`` order (used to rebuild a vector index)."""
        return self.run_read(all_memories)

    def by_vector_ids(self, ids: Sequence[int] | np.ndarray) -> dict[int, MemoryRecord]:
        """The memories whose ``vector_id`` is in ``ids``, keyed by vector id; unknown ids are left out.

        Args:
            ids: int64 vector ids, e.g. the ids a FAISS search returned (any order, duplicates allowed).

        Raises:
            InvalidInputError: when ``ids`` holds something other than integers.
        """
        wanted = sorted(set(check_vector_ids(ids)))
        return self.run_read(by_vector_ids, wanted) if wanted else {}

    def vector_ids_in_scope(self, scope: Scope, filters: Filter | None = None) -> np.ndarray:
        """The vector ids of the memories in ``scope`` that match ``filters``: an int64 array ``[n]``, ascending.

        Raises:
            InvalidInputError: when ``scope`` is not a Scope.
        """
        return self.run_read(vector_ids_in_scope, check_scope(scope), filters)

    def history(self, memory_id: str, scope: Scope | None = None) -> builtins.list[HistoryRecord]:
        """The changes to ``memory_id``, oldest first (also once deleted), when it was in ``scope`` (``None``: any).

        Raises:
            InvalidInputError: when ``memory_id`` is not a non-empty str or ``scope`` not a Scope.
        """
        return self.run_read(history, check_id(memory_id), check_scope(scope) if scope is not None else None)

    def apply(self, changes: ChangeSet) -> AppliedChanges:
        """Apply adds, updates and deletes with their history rows in one transaction (all or nothing).

        Returns:
            :class:`~inferscale.storage.change_sets.AppliedChanges`: what was added, updated, deleted and skipped.

        Raises:
            InvalidInputError: for an invalid change (nothing is written).
            MemoryNotFoundError: with ``changes.strict``, for an unknown id (nothing is written).
        """
        return self.run_write(apply_in_session, validate_changes(changes))

    def update(
        self, memory_id: str, text: str | None, metadata: dict[str, Any] | None = None, actor: str | None = None
    ) -> MemoryRecord:
        """Replace a memory's text and/or metadata, and record an ``UPDATE`` history row with old and new.

        A new ``text`` also updates ``hash``; ``metadata``, when given, is merged into the stored dict; ``updated_at``
        is set to now. The row is written even when nothing changes. A new text deletes the memory's KV entries
        in the same transaction (K/V encoded from the old text are never served again); a metadata-only update
        keeps them.

        Raises:
            InvalidInputError: when neither ``text`` nor ``metadata`` is given, or either is invalid.
            MemoryNotFoundError: when no memory has id ``memory_id``.
        """
        return self.run_write(apply_in_session, update_change(memory_id, text, metadata, actor)).updated[0][1]

    def delete(self, memory_id: str, actor: str | None = None) -> MemoryRecord:
        """Delete a memory and its KV entries, recording a ``DELETE`` history row.

        Returns:
            The memory as it was just before deletion (its ``vector_id`` is what to remove from the index).

        Raises:
            InvalidInputError: when ``memory_id`` or ``actor`` is not a non-empty str.
            MemoryNotFoundError: when no memory has id ``memory_id``.
        """
        return self.run_write(apply_in_session, delete_change(memory_id, actor)).deleted[0]

    def delete_scope(self, scope: Scope, actor: str | None = None) -> builtins.list[MemoryRecord]:
        """Delete every memory in ``scope`` (and their KV entries), one ``DELETE`` history row each.

        Returns:
            The deleted memories, oldest first.

        Raises:
            InvalidInputError: when ``scope`` is not a Scope or ``actor`` is not a non-empty str.
        """
        return self.run_write(delete_scope_in_session, check_scope(scope), check_actor(actor))

    # ---- KV entries --------------------------------------------------------------------------------------

    def put_kv_entry(
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
        """Insert or replace the KV entry of ``(memory_id, fingerprint, encoding_key)``; returns it as stored.

        Args:
            memory_id, text_hash: the memory's public id; sha256 hex of the text the KV was encoded from.
            fingerprint, encoding_key: model / dtype / rope / tokenizer fingerprint; how the fact was encoded (<= 255).
            n_tokens, nbytes: the fact's length (tokens, >= 0); size of the stored tensors (bytes, >= 0).
            location: where the tensors live.
            store_id: the id of the K/V folder holding the file (:meth:`inferscale.kv.tiers.DiskTier.store_id`).
            encoded_from: the memory's record as read before encoding: when given, the entry is written only while
                the memory still has its text hash, context and chain start (:class:`NewKVEntry`).

        Raises:
            InvalidInputError: when an argument is empty, too long or negative, or ``encoded_from`` is another's.
            MemoryNotFoundError: when no memory has id ``memory_id`` (``MemoryChangedError`` when it changed).
        """
        new = NewKVEntry.checked(
            memory_id, text_hash, fingerprint, encoding_key, n_tokens, nbytes, location, store_id, encoded_from
        )
        try:
            return self.run_write(put_kv_entry_in_session, new)
        except IntegrityError:  # a concurrent writer inserted the same key: this time the row exists
            return self.run_write(put_kv_entry_in_session, new)

    def get_kv_entry(self, memory_id: str, fingerprint: str, encoding_key: str) -> KVEntryRecord | None:
        """The KV entry of ``(memory_id, fingerprint, encoding_key)``, or ``None``.

        Raises:
            InvalidInputError: when an argument is not a non-empty str.
        """
        key = (check_id(memory_id), check_text(fingerprint, "fingerprint"), check_text(encoding_key, "encoding_key"))
        return self.run_read(get_kv_entry, *key)

    def delete_kv_entries(self, memory_id: str) -> builtins.list[KVEntryRecord]:
        """Delete every KV entry of ``memory_id`` and return them (so their tensors can be removed too).

        Raises:
            InvalidInputError: when ``memory_id`` is not a non-empty str.
        """
        return self.run_write(delete_kv_entries_in_session, check_id(memory_id))

    def versions(self, scope: Scope | None = None, filters: Filter | None = None) -> MemoryVersions:
        """Vector ids, ids, text hashes of ``scope``'s memories matching ``filters`` (all for ``None``); reconcile."""
        return self.run_read(memory_versions, check_scope(scope) if scope is not None else None, filters)

    def memory_states(self, memory_ids: Sequence[str]) -> dict[str, bool]:
        """Of ``memory_ids``, those this database ever stored: ``True`` while stored, ``False`` once deleted."""
        return self.run_read(memory_states, [check_id(memory_id) for memory_id in memory_ids])

    def all_kv_entries(self) -> builtins.list[KVEntryRecord]:
        """Every KV entry, by row id."""
        return self.run_read(all_kv_entries)

    def delete_kv_entry_rows(self, row_ids: Sequence[int]) -> int:
        """Delete the KV entries with these row ids; returns how many were deleted (ids already gone count 0)."""
        return self.run_write(delete_kv_entry_rows_in_session, check_vector_ids(row_ids))


__all__ = ["MemoryStore"]
