"""The memory store on async SQLAlchemy: aiosqlite for SQLite, psycopg's async mode for PostgreSQL.

Same tables, same statements and the same transaction bodies as :class:`~inferscale.storage.MemoryStore`: every
method validates its arguments and runs one session function of :mod:`~inferscale.storage.queries`,
:mod:`~inferscale.storage.changes` or :mod:`~inferscale.storage.kv_entries` through ``AsyncSession.run_sync``
(SQLAlchemy's greenlet bridge: the driver I/O is awaited on the event loop, no thread is blocked). Needs
``greenlet`` and ``aiosqlite`` (``pip install 'sqlalchemy[asyncio]' aiosqlite``).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

import numpy as np
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
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
from inferscale.storage.database import WRITE_OPTION, make_async_engine, shown_url
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
from inferscale.storage.schema import MEMORY_SCHEMA, MIGRATION_LOCK, SchemaChain, SchemaUpgrade, upgrade_schema
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


def async_url(url: str) -> str:
    """The async-driver form of a SQLAlchemy URL: ``sqlite://`` → ``sqlite+aiosqlite://``, ``postgresql://`` and
    ``postgresql+psycopg://`` → ``postgresql+psycopg://`` (psycopg 3 runs async too); async drivers pass through.

    Raises:
        ConfigError: for a malformed URL or a database without a supported async driver.
    """
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:  # ValueError: a port that is not a number
        raise ConfigError(f"database url {shown_url(url)!r} is not a SQLAlchemy URL: {exc}") from exc
    backend, _, driver = parsed.drivername.partition("+")
    if backend == "sqlite":
        return parsed.set(drivername="sqlite+aiosqlite").render_as_string(hide_password=False)
    if backend == "postgresql":
        if driver in ("asyncpg", "psycopg"):
            return url
        if driver in ("", "psycopg2", "pg8000", "psycopg2cffi"):
            return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    raise ConfigError(f"no async driver for {parsed.drivername!r}; use sqlite or postgresql (psycopg or asyncpg)")


MIGRATION_POLL_S = 0.005
"""How often a coroutine asks for the process's migration lock while another chain runs (seconds)."""

ENGINE_POLL_S = 0.005
"""How often a coroutine asks to create its loop's engine while another coroutine creates one (seconds)."""


async def ensure_schema_async(engine: AsyncEngine, chain: SchemaChain) -> SchemaUpgrade:
    """Upgrade ``chain`` on ``engine``'s database to its head in one write transaction, through ``run_sync``; see
    :func:`~inferscale.storage.schema.upgrade_schema`. The process's :data:`~inferscale.storage.schema.MIGRATION_LOCK`
    is polled for (every :data:`MIGRATION_POLL_S` seconds) rather than waited on: a coroutine that holds it awaits
    the database on this event loop, which a blocking wait would stop.

    Raises:
        SchemaError: see :func:`~inferscale.storage.schema.upgrade_schema` (nothing is changed).
    """
    while not MIGRATION_LOCK.acquire(blocking=False):
        await asyncio.sleep(MIGRATION_POLL_S)
    try:
        async with engine.execution_options(**{WRITE_OPTION: True}).begin() as conn:
            return await conn.run_sync(upgrade_schema, chain)
    finally:
        MIGRATION_LOCK.release()


class AsyncMemoryStore:
    """Memories, history and KV entries in one SQL database, with ``async`` methods. Construction does no I/O;
    the engine is created and the schema created or upgraded on first use.

    Args:
        url: a SQLAlchemy URL in its sync or async form (see :func:`async_url`).

    Raises:
        ConfigError: when ``url`` is empty or has no async driver.
    """

    def __init__(self, url: str) -> None:
        if not isinstance(url, str) or not url.strip():
            raise ConfigError(f"database url must be a non-empty string, got {url!r}")
        self._url = async_url(url)
        # One engine per event loop (an async pool belongs to its loop: shared, a second asyncio.run or threads each
        # running a loop raised or hung), made under a polled thread lock (an asyncio.Lock is bound to one loop too)
        self._engines: dict[asyncio.AbstractEventLoop, AsyncEngine] = {}
        self._schema_ready = False
        self._creating = threading.Lock()

    def __repr__(self) -> str:
        return f"AsyncMemoryStore({shown_url(self._url)!r})"

    @property
    def url(self) -> str:
        """The async SQLAlchemy URL in use."""
        return self._url

    async def engine(self) -> AsyncEngine:
        """The running event loop's async engine, created on its first call there; the schema is created or upgraded
        to its head revision on the store's first call (:func:`ensure_schema_async`). Engines of loops that are
        closed are disposed meanwhile.

        Raises:
            ConfigError: when the driver is not installed.
            SchemaError: when the database is at a revision this InferScale does not know, or holds unversioned
                tables that differ from its schema.
        """
        loop = asyncio.get_running_loop()
        engine = self._engines.get(loop)
        if engine is not None:
            return engine
        while not self._creating.acquire(blocking=False):  # another coroutine, on any loop, is creating one
            await asyncio.sleep(ENGINE_POLL_S)
        try:
            engine = self._engines.get(loop)
            if engine is None:
                await self._dispose_closed_loops()
                engine = await asyncio.to_thread(make_async_engine, self._url)  # SQLite is switched to WAL: I/O
                try:
                    if not self._schema_ready:
                        await ensure_schema_async(engine, MEMORY_SCHEMA)
                        self._schema_ready = True
                except BaseException:
                    await engine.dispose()
                    raise
                self._engines[loop] = engine
        finally:
            self._creating.release()
        return engine

    async def _dispose_closed_loops(self) -> None:
        """Dispose the engines of loops that are closed (their connections are closed from this loop)."""
        for loop in [loop for loop in self._engines if loop.is_closed()]:
            with contextlib.suppress(Exception):  # a connection its loop's end left broken: nothing to keep
                await self._engines.pop(loop).dispose()

    async def _read(self, fn: Callable[Concatenate[Session, _P], _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """``fn(session, *args, **kwargs)`` in a read session, through ``run_sync``."""
        async with AsyncSession(await self.engine(), expire_on_commit=False) as s:
            return await s.run_sync(fn, *args, **kwargs)

    async def _write(self, fn: Callable[Concatenate[Session, _P], _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """``fn(session, *args, **kwargs)`` in one write transaction (``BEGIN IMMEDIATE`` on SQLite), through
        ``run_sync``; committed when it returns and rolled back when it raises."""
        engine = (await self.engine()).execution_options(**{WRITE_OPTION: True})
        async with AsyncSession(engine, expire_on_commit=False) as s, s.begin():
            return await s.run_sync(fn, *args, **kwargs)

    async def dialect(self) -> str:
        """The database's dialect name (``"sqlite"`` or ``"postgresql"``)."""
        return (await self.engine()).dialect.name

    async def close(self) -> None:
        """Dispose the running loop's engine and those of closed loops (engines of other running loops are left to
        them); the store reconnects if used again."""
        engine = self._engines.pop(asyncio.get_running_loop(), None)
        if engine is not None:
            await engine.dispose()
        await self._dispose_closed_loops()

    # ---- reads -----------------------------------------------------------------------------------------------
    async def get(self, memory_id: str, scope: Scope | None = None) -> MemoryRecord | None:
        """The memory with id ``memory_id``; ``None`` when there is none or it is outside ``scope`` (checked in SQL).

        Raises:
            InvalidInputError: when ``memory_id`` is not a non-empty str or ``scope`` is not a Scope.
        """
        memory_id = check_id(memory_id)
        checked = check_scope(scope) if scope is not None else None
        return await self._read(get_memory, memory_id, checked)

    async def memories_with_hash(self, text_hash: str, scope: Scope, limit: int | None = None) -> list[MemoryRecord]:
        """The memories of exactly ``scope`` whose text hashes to ``text_hash``, oldest first, at most ``limit``;
        see :meth:`MemoryStore.memories_with_hash <inferscale.storage.MemoryStore.memories_with_hash>`.

        Raises:
            InvalidInputError: as the sync store's.
        """
        checked = (check_text(text_hash, "text_hash"), check_scope(scope), check_limit(limit))
        return await self._read(memories_with_hash, *checked)

    async def list(
        self, scope: Scope, limit: int | None = None, filters: Filter | None = None
    ) -> builtins.list[MemoryRecord]:
        """The memories of ``scope`` matching ``filters``, oldest first, at most ``limit``.

        Raises:
            InvalidInputError: for a non-Scope or a bad limit.
        """
        scope = check_scope(scope)
        return await self._read(list_memories, scope, filters, check_limit(limit))

    async def latest(self, scope: Scope, limit: int) -> builtins.list[MemoryRecord]:
        """The ``limit`` memories of exactly ``scope`` stored last, oldest first; see :meth:`MemoryStore.latest`."""
        return await self._read(latest_memories, check_scope(scope), check_positive(limit, "limit"))

    async def all_memories(self) -> builtins.list[MemoryRecord]:
        """Every memory of every scope, in vector-id order."""
        return await self._read(all_memories)

    async def vector_ids_in_scope(self, scope: Scope, filters: Filter | None = None) -> np.ndarray:
        """Vector ids of the memories of ``scope`` matching ``filters``: int64 ``[n]``, ascending.

        Raises:
            InvalidInputError: when ``scope`` is not a Scope.
        """
        return await self._read(vector_ids_in_scope, check_scope(scope), filters)

    async def by_vector_ids(self, ids: Sequence[int] | np.ndarray) -> dict[int, MemoryRecord]:
        """The memories whose vector id is in ``ids``, keyed by vector id; unknown ids are left out.

        Raises:
            InvalidInputError: when ``ids`` holds something other than integers.
        """
        wanted = sorted(set(check_vector_ids(ids)))
        return await self._read(by_vector_ids, wanted) if wanted else {}

    async def history(self, memory_id: str, scope: Scope | None = None) -> builtins.list[HistoryRecord]:
        """The changes to ``memory_id``, oldest first; see :meth:`MemoryStore.history`.

        Raises:
            InvalidInputError: when ``memory_id`` is not a non-empty str or ``scope`` not a Scope.
        """
        return await self._read(history, check_id(memory_id), check_scope(scope) if scope is not None else None)

    async def get_kv_entry(self, memory_id: str, fingerprint: str, encoding_key: str) -> KVEntryRecord | None:
        """The KV entry of ``(memory_id, fingerprint, encoding_key)``, or ``None``.

        Raises:
            InvalidInputError: when an argument is not a non-empty str.
        """
        memory_id = check_id(memory_id)
        fingerprint = check_text(fingerprint, "fingerprint")
        encoding_key = check_text(encoding_key, "encoding_key")
        return await self._read(get_kv_entry, memory_id, fingerprint, encoding_key)

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
    ) -> KVEntryRecord:
        """Insert or replace the KV entry of ``(memory_id, fingerprint, encoding_key)``; see
        :meth:`MemoryStore.put_kv_entry`.

        Raises:
            InvalidInputError: when an argument is empty, too long or negative.
            MemoryNotFoundError: when no memory has id ``memory_id``.
        """
        new = NewKVEntry.checked(memory_id, text_hash, fingerprint, encoding_key, n_tokens, nbytes, location, store_id)
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
        return await self._read(memory_versions, check_scope(scope) if scope is not None else None, filters)

    async def memory_states(self, memory_ids: Sequence[str]) -> dict[str, bool]:
        """Of ``memory_ids``, those this database ever stored: ``True`` while stored, ``False`` once deleted."""
        return await self._read(memory_states, [check_id(memory_id) for memory_id in memory_ids])

    async def all_kv_entries(self) -> builtins.list[KVEntryRecord]:
        """Every KV entry, by row id."""
        return await self._read(all_kv_entries)

    async def delete_kv_entry_rows(self, row_ids: Sequence[int]) -> int:
        """Delete the KV entries with these row ids; returns how many were deleted (ids already gone count 0)."""
        return await self._write(delete_kv_entry_rows_in_session, check_vector_ids(row_ids))


__all__ = ["AsyncMemoryStore", "async_url", "ensure_schema_async"]
