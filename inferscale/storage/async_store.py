"""The memory store on async SQLAlchemy: aiosqlite for SQLite, psycopg's async mode for PostgreSQL.

Same tables, same statements and the same transaction bodies as :class:`~inferscale.storage.MemoryStore`: reads
``await`` the statements built in :mod:`inferscale.storage.changes`, and writes run the shared session functions
through ``AsyncSession.run_sync`` (SQLAlchemy's greenlet bridge: the driver I/O is awaited on the event loop, no
thread is blocked). Needs ``greenlet`` and ``aiosqlite`` (``pip install 'sqlalchemy[asyncio]' aiosqlite``).
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Sequence

import numpy as np
from sqlalchemy import delete, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.pool import StaticPool

from inferscale.errors import ConfigError, InvalidInputError
from inferscale.filters import Filter
from inferscale.scope import Scope
from inferscale.storage.changes import (
    AppliedChanges,
    ChangeSet,
    apply_in_session,
    delete_scope_in_session,
    reset_in_session,
    select_by_vector_ids,
    select_memories,
    select_vector_ids,
    validate_changes,
)
from inferscale.storage.database import WRITE_OPTION, _sqlite_file, configure_sqlite
from inferscale.storage.models import Base, HistoryRow, KVEntryRow, MemoryRow
from inferscale.storage.repository import (
    HistoryRecord,
    MemoryRecord,
    _check_actor,
    _check_id,
    _check_scope,
    _check_text,
    _check_vector_ids,
    _chunks,
    _scope_clauses,
)


def async_url(url: str) -> str:
    """The async-driver form of a SQLAlchemy URL: ``sqlite://`` → ``sqlite+aiosqlite://``, ``postgresql://`` and
    ``postgresql+psycopg://`` → ``postgresql+psycopg://`` (psycopg 3 runs async too); async drivers pass through.

    Raises:
        ConfigError: for a malformed URL or a database without a supported async driver.
    """
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ConfigError(f"database url {url!r} is not a SQLAlchemy URL: {exc}") from exc
    backend, _, driver = parsed.drivername.partition("+")
    if backend == "sqlite":
        return parsed.set(drivername="sqlite+aiosqlite").render_as_string(hide_password=False)
    if backend == "postgresql":
        if driver in ("asyncpg", "psycopg"):
            return url
        if driver in ("", "psycopg2", "pg8000", "psycopg2cffi"):
            return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    raise ConfigError(f"no async driver for {parsed.drivername!r}; use sqlite or postgresql (psycopg or asyncpg)")


class AsyncMemoryStore:
    """Memories and history in one SQL database, with ``async`` methods. Construction does no I/O; the engine
    and the tables are created on first use.

    Args:
        url: a SQLAlchemy URL in its sync or async form (see :func:`async_url`).

    Raises:
        ConfigError: when ``url`` is empty or has no async driver.
    """

    def __init__(self, url: str) -> None:
        if not isinstance(url, str) or not url.strip():
            raise ConfigError(f"database url must be a non-empty string, got {url!r}")
        self._url = async_url(url)
        self._engine: AsyncEngine | None = None
        self._lock: asyncio.Lock | None = None

    def __repr__(self) -> str:
        return f"AsyncMemoryStore({self._url!r})"

    @property
    def url(self) -> str:
        """The async SQLAlchemy URL in use."""
        return self._url

    async def engine(self) -> AsyncEngine:
        """The async engine, created (and the schema with it) on first call.

        Raises:
            ConfigError: when the driver is not installed.
        """
        if self._engine is not None:
            return self._engine
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._engine is None:
                engine = self._build()
                try:
                    async with engine.execution_options(**{WRITE_OPTION: True}).begin() as conn:
                        await conn.run_sync(Base.metadata.create_all)
                except BaseException:
                    await engine.dispose()
                    raise
                self._engine = engine
        return self._engine

    def _build(self) -> AsyncEngine:
        parsed = make_url(self._url)
        try:
            if parsed.get_backend_name() == "sqlite":
                path = _sqlite_file(parsed)
                if path is None:
                    engine = create_async_engine(parsed, poolclass=StaticPool)
                else:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    engine = create_async_engine(parsed)
                configure_sqlite(engine.sync_engine)
                return engine
            return create_async_engine(parsed, pool_pre_ping=True)
        except ImportError as exc:
            raise ConfigError(
                f"the async driver for {parsed.drivername!r} is not installed ({exc}); "
                "run `pip install 'sqlalchemy[asyncio]' aiosqlite`"
            ) from exc

    async def _session(self, write: bool = False) -> AsyncSession:
        engine = await self.engine()
        if write:
            engine = engine.execution_options(**{WRITE_OPTION: True})
        return AsyncSession(engine, expire_on_commit=False)

    async def dialect(self) -> str:
        """The database's dialect name (``"sqlite"`` or ``"postgresql"``)."""
        return (await self.engine()).dialect.name

    async def close(self) -> None:
        """Dispose the engine's connections; the store reconnects if used again."""
        if self._engine is not None:
            await self._engine.dispose()
            self._engine = None

    # ---- reads -----------------------------------------------------------------------------------------------
    async def get(self, memory_id: str) -> MemoryRecord | None:
        """The memory with id ``memory_id``, or ``None``.

        Raises:
            InvalidInputError: when ``memory_id`` is not a non-empty str.
        """
        memory_id = _check_id(memory_id)
        async with await self._session() as s:
            row = (await s.scalars(select(MemoryRow).where(MemoryRow.id == memory_id))).one_or_none()
            return MemoryRecord.from_row(row) if row is not None else None

    async def find_by_hash(self, text_hash: str, scope: Scope) -> MemoryRecord | None:
        """The oldest memory of ``scope`` whose text hashes to ``text_hash``, or ``None``."""
        text_hash = _check_text(text_hash, "text_hash")
        stmt = (
            select(MemoryRow)
            .where(MemoryRow.hash == text_hash, *_scope_clauses(_check_scope(scope)))
            .order_by(MemoryRow.created_at, MemoryRow.pk)
            .limit(1)
        )
        async with await self._session() as s:
            row = (await s.scalars(stmt)).first()
            return MemoryRecord.from_row(row) if row is not None else None

    async def list(
        self, scope: Scope, limit: int | None = None, filters: Filter | None = None
    ) -> builtins.list[MemoryRecord]:
        """The memories of ``scope`` matching ``filters``, oldest first, at most ``limit``.

        Raises:
            InvalidInputError: for a non-Scope or a bad limit.
        """
        scope = _check_scope(scope)
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise InvalidInputError(f"limit must be a positive int or None, got {limit!r}")
        stmt = select_memories(scope, filters, await self.dialect(), limit)
        async with await self._session() as s:
            return [MemoryRecord.from_row(row) for row in await s.scalars(stmt)]

    async def all_memories(self) -> builtins.list[MemoryRecord]:
        """Every memory of every scope, in vector-id order."""
        async with await self._session() as s:
            return [MemoryRecord.from_row(row) for row in await s.scalars(select(MemoryRow).order_by(MemoryRow.pk))]

    async def vector_ids_in_scope(self, scope: Scope, filters: Filter | None = None) -> np.ndarray:
        """Vector ids of the memories of ``scope`` matching ``filters``: int64 ``[n]``, ascending."""
        stmt = select_vector_ids(_check_scope(scope), filters, await self.dialect())
        async with await self._session() as s:
            ids = (await s.scalars(stmt)).all()
        return np.asarray(ids, dtype=np.int64).reshape(-1)

    async def by_vector_ids(self, ids: Sequence[int] | np.ndarray) -> dict[int, MemoryRecord]:
        """The memories whose vector id is in ``ids``, keyed by vector id; unknown ids are left out."""
        wanted = sorted(set(_check_vector_ids(ids)))
        found: dict[int, MemoryRecord] = {}
        if not wanted:
            return found
        async with await self._session() as s:
            for chunk in _chunks(wanted):
                for row in await s.scalars(select_by_vector_ids(chunk)):
                    found[int(row.pk)] = MemoryRecord.from_row(row)
        return found

    async def history(self, memory_id: str) -> builtins.list[HistoryRecord]:
        """The changes to ``memory_id``, oldest first; ``[]`` for an unknown id."""
        memory_id = _check_id(memory_id)
        stmt = select(HistoryRow).where(HistoryRow.memory_id == memory_id).order_by(HistoryRow.id)
        async with await self._session() as s:
            return [HistoryRecord.from_row(row) for row in await s.scalars(stmt)]

    # ---- writes ----------------------------------------------------------------------------------------------
    async def apply(self, changes: ChangeSet) -> AppliedChanges:
        """Apply a change set in one transaction; see :meth:`MemoryStore.apply`.

        Raises:
            InvalidInputError: for an invalid change. MemoryNotFoundError: with ``strict``, for an unknown id.
        """
        checked = validate_changes(changes)
        async with await self._session(write=True) as s, s.begin():
            return await s.run_sync(apply_in_session, checked)

    async def delete_scope(self, scope: Scope, actor: str | None = None) -> builtins.list[MemoryRecord]:
        """Delete every memory of ``scope`` with a DELETE history row each; returns them, oldest first."""
        scope = _check_scope(scope)
        actor = _check_actor(actor)
        async with await self._session(write=True) as s, s.begin():
            return await s.run_sync(delete_scope_in_session, scope, actor)

    async def delete_kv_entries(self, memory_id: str) -> None:
        """Delete the ``kv_entries`` rows of ``memory_id``."""
        memory_id = _check_id(memory_id)
        async with await self._session(write=True) as s, s.begin():
            await s.execute(delete(KVEntryRow).where(KVEntryRow.memory_id == memory_id))

    async def reset(self) -> None:
        """Delete every row of every table."""
        async with await self._session(write=True) as s, s.begin():
            await s.run_sync(reset_in_session)


__all__ = ["AsyncMemoryStore", "async_url"]
