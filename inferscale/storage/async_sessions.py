"""How the async store runs a session function: on a worker thread for SQLite, on the event loop for PostgreSQL.

Both runners take the session functions of :mod:`~inferscale.storage.queries`, :mod:`~inferscale.storage.changes`
and :mod:`~inferscale.storage.kv_entries`, the ones the sync store runs, and give the same results and errors.

- :class:`ThreadSessions` (SQLite): the sync engine of a :class:`~inferscale.storage.store.MemoryStore`, each session
  on a thread: reads on the process's :data:`SQLITE_READS` pool, writes on the store's own write thread. SQLite has
  no asynchronous I/O (aiosqlite runs every connection on a thread of its own), and a session on a thread cannot be
  cancelled halfway: a cancelled caller stops waiting, while a write whose session has begun commits (or rolls back
  on an error) and its connection goes back to the pool. Run on the event loop through aiosqlite, a cancellation
  that landed inside the commit, the rollback or the pool's reset of a returned connection left that connection in
  its transaction, holding SQLite's write lock, so every other writer failed after the busy timeout until the
  garbage collector found it (6 of 8 runs of 300 randomly cancelled writes). These threads are apart from the event
  loop's default executor (where the async client embeds and searches) and from its model threads (generation,
  extraction, encoding: :mod:`inferscale.worker_threads`); and SQLite takes one writer at a time, so one write
  thread per store queues its writes in order, and a write waiting for another process's lock holds no thread that
  reads need.
- :class:`LoopSessions` (PostgreSQL): an async engine per event loop (psycopg's async mode, or asyncpg), the
  session function run through ``AsyncSession.run_sync`` (SQLAlchemy's greenlet bridge): the driver I/O is awaited
  on the loop and no thread is blocked. A call cancelled mid-transaction rolls back (1,259 randomly cancelled calls
  left no transaction open). Known limit: a call still running when its event loop ends (``asyncio.run`` returning
  with tasks left) can leave its connection idle in its transaction until the garbage collector finalises it (14
  of 90 runs of a review's reproducer), holding a lock on the tables it read: await or cancel the tasks before the
  loop ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from inferscale.errors import ConfigError
from inferscale.storage.database import WRITE_OPTION, make_async_engine, shown_url
from inferscale.storage.schema import MEMORY_SCHEMA, MIGRATION_LOCK, SchemaChain, SchemaUpgrade, upgrade_schema
from inferscale.storage.store import MemoryStore
from inferscale.worker_threads import ProcessThreads, on_threads

_P = ParamSpec("_P")
_T = TypeVar("_T")

MIGRATION_POLL_S = 0.005
"""How often a coroutine asks for the process's migration lock while another chain runs (seconds)."""

ENGINE_POLL_S = 0.005
"""How often a coroutine asks to create its loop's engine while another coroutine creates one (seconds)."""

SQLITE_READ_THREADS = 8
"""Threads that run the SQLite read sessions of every async store of the process (WAL lets readers run beside the
one writer)."""


SQLITE_READS = ProcessThreads(SQLITE_READ_THREADS, "inferscale-sqlite-read")
"""The threads :class:`ThreadSessions` runs read sessions on, shared by every store of the process."""


class SessionRunner(Protocol):
    """Runs ``fn(session, *args, **kwargs)`` in a session of one database, from a coroutine. Every method may raise
    ``ConfigError`` or ``SchemaError`` on the database's first use (a driver missing, a schema this InferScale does
    not know) and ``DatabaseUnavailableError`` when the database cannot be used."""

    @property
    def url(self) -> str:
        """The SQLAlchemy URL the runner connects with."""
        ...

    async def read(self, fn: Callable[Concatenate[Session, _P], _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """``fn`` in a read session."""
        ...

    async def write(self, fn: Callable[Concatenate[Session, _P], _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """``fn`` in one write transaction, committed when it returns and rolled back when it raises."""
        ...

    async def dialect(self) -> str:
        """The database's dialect name (opens the database)."""
        ...

    async def close(self) -> None:
        """Release the connections; the runner reconnects if used again."""
        ...


def session_url(url: str) -> str:
    """The URL the async store connects with: SQLite in its sync form (``sqlite+aiosqlite://`` → ``sqlite://``:
    :class:`ThreadSessions` runs it), PostgreSQL in an async driver's form (``postgresql://`` and
    ``postgresql+psycopg://`` → ``postgresql+psycopg://``, psycopg 3 runs async too; ``asyncpg`` passes through).

    Raises:
        ConfigError: for a malformed URL or a database without a supported async driver.
    """
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:  # ValueError: a port that is not a number
        raise ConfigError(f"database url {shown_url(url)!r} is not a SQLAlchemy URL: {exc}") from exc
    backend, _, driver = parsed.drivername.partition("+")
    if backend == "sqlite":
        if driver == "aiosqlite":
            return parsed.set(drivername="sqlite").render_as_string(hide_password=False)
        return url
    if backend == "postgresql":
        if driver in ("asyncpg", "psycopg"):
            return url
        if driver in ("", "psycopg2", "pg8000", "psycopg2cffi"):
            return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    raise ConfigError(f"no async driver for {parsed.drivername!r}; use sqlite or postgresql (psycopg or asyncpg)")


def session_runner(url: str, sqlite_store: MemoryStore | None = None) -> SessionRunner:
    """The runner for ``url`` (see :func:`session_url`): :class:`ThreadSessions` for SQLite, over ``sqlite_store``
    when given (the sync store of the same database, so that both share one engine: one in-memory database, one
    pool), :class:`LoopSessions` otherwise. Does no I/O.

    Raises:
        ConfigError: as :func:`session_url`, or when ``sqlite_store`` is on another database.
    """
    url = session_url(url)
    if make_url(url).get_backend_name() != "sqlite":
        return LoopSessions(url)
    if sqlite_store is None:
        return ThreadSessions(MemoryStore(url))
    if session_url(sqlite_store.url) != url:
        raise ConfigError(f"the sync store is on {shown_url(sqlite_store.url)!r}, not {shown_url(url)!r}")
    return ThreadSessions(sqlite_store)


class ThreadSessions:
    """Sessions on threads over one sync engine (``store``'s: created, and the schema upgraded, on first use), shared
    by every event loop and thread: reads on :data:`SQLITE_READS`, writes in order on the store's own write thread (a
    forked child makes its own). See the module's docstring.

    Every method may raise what ``store``'s first use raises (``ConfigError``, ``SchemaError``) and
    ``DatabaseUnavailableError`` when the database cannot be used.
    """

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self._writes = ProcessThreads(1, "inferscale-sqlite-write")

    @property
    def url(self) -> str:
        """The sync SQLAlchemy URL in use."""
        return self._store.url

    async def read(self, fn: Callable[Concatenate[Session, _P], _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """``fn(session, *args, **kwargs)`` in a read session, on a thread of :data:`SQLITE_READS`."""
        return await on_threads(SQLITE_READS, functools.partial(self._store.run_read, fn, *args, **kwargs))

    async def write(self, fn: Callable[Concatenate[Session, _P], _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """``fn(session, *args, **kwargs)`` in one write transaction (``BEGIN IMMEDIATE``) on the store's write
        thread, after the writes queued before it. A caller cancelled meanwhile stops waiting: a write still queued is
        dropped, one whose session has begun runs on and commits unless it raises."""
        return await on_threads(self._writes, functools.partial(self._store.run_write, fn, *args, **kwargs))

    async def dialect(self) -> str:
        """``"sqlite"`` (opens the database)."""
        return await on_threads(SQLITE_READS, lambda: self._store.dialect)

    async def close(self) -> None:
        """Dispose the engine's pooled connections once the writes queued before have run (a read still running
        returns its connection when it ends). An in-memory database is dropped with its connection."""
        await on_threads(self._writes, self._store.close)


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


class LoopSessions:
    """Sessions on the event loop over an async engine, one per loop (an async pool belongs to its loop: shared, a
    second ``asyncio.run`` or threads each running a loop raised or hung), made under a polled thread lock (an
    ``asyncio.Lock`` is bound to one loop too). The schema is created or upgraded on the first engine's creation."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._engines: dict[asyncio.AbstractEventLoop, AsyncEngine] = {}
        self._schema_ready = False
        self._creating = threading.Lock()

    @property
    def url(self) -> str:
        """The async SQLAlchemy URL in use."""
        return self._url

    async def engine(self) -> AsyncEngine:
        """The running event loop's async engine, created on its first call there; the schema is created or upgraded
        to its head revision on the runner's first call (:func:`ensure_schema_async`). Engines of loops that are
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
                engine = make_async_engine(self._url)  # no I/O (the driver's first import aside): on the loop
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

    async def read(self, fn: Callable[Concatenate[Session, _P], _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """``fn(session, *args, **kwargs)`` in a read session, through ``run_sync``."""
        async with AsyncSession(await self.engine(), expire_on_commit=False) as s:
            return await s.run_sync(fn, *args, **kwargs)

    async def write(self, fn: Callable[Concatenate[Session, _P], _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """``fn(session, *args, **kwargs)`` in one write transaction, through ``run_sync``."""
        engine = (await self.engine()).execution_options(**{WRITE_OPTION: True})
        async with AsyncSession(engine, expire_on_commit=False) as s, s.begin():
            return await s.run_sync(fn, *args, **kwargs)

    async def dialect(self) -> str:
        """The database's dialect name (opens the running loop's engine)."""
        return (await self.engine()).dialect.name

    async def close(self) -> None:
        """Dispose the running loop's engine and those of closed loops (engines of other running loops are left to
        them)."""
        engine = self._engines.pop(asyncio.get_running_loop(), None)
        if engine is not None:
            await engine.dispose()
        await self._dispose_closed_loops()


__all__ = [
    "LoopSessions",
    "SessionRunner",
    "ThreadSessions",
    "ensure_schema_async",
    "session_runner",
    "session_url",
]
