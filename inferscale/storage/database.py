"""Engine construction for any SQLAlchemy URL, with the SQLite settings a concurrent memory store needs."""

from __future__ import annotations

import re
import sqlite3
import threading
import weakref
from contextlib import AbstractContextManager, closing, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, ExceptionContext, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.pool import Pool, StaticPool
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_random_exponential

from inferscale.errors import ConfigError, DatabaseUnavailableError, SchemaError
from inferscale.storage.case_fold import SQLITE_FUNCTION, sqlite_fold

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

SQLITE_BUSY_TIMEOUT_MS = 10_000
POSTGRES_LOCK_TIMEOUT_MS = 10_000
"""How long a PostgreSQL statement waits for a lock another transaction holds (``lock_timeout``, ms) before the call
is refused with :class:`~inferscale.errors.DatabaseUnavailableError`: as long as SQLite's busy timeout, so a stuck
transaction elsewhere (a ``LOCK TABLE``, a migration that hangs) fails a call on both backends rather than hanging it
for good on one."""
WRITE_OPTION = "inferscale_write"
"""Execution option that marks a connection as a writer: on SQLite its transactions start ``BEGIN IMMEDIATE``."""


def sqlite_file(url: URL) -> Path | None:
    """The database file of a SQLite URL, a leading ``~`` expanded (:func:`make_engine` opens it so), or ``None``
    for an in-memory database or another backend's URL."""
    database = url.database
    if url.get_backend_name() != "sqlite" or not database:
        return None
    if database == ":memory:" or database.startswith("file:") or url.query.get("mode"):  # in memory
        return None
    return Path(database).expanduser()


_TURNS: weakref.WeakKeyDictionary[Pool, threading.Lock] = weakref.WeakKeyDictionary()
_TURNS_MADE = threading.Lock()


def session_turn(engine: Engine) -> AbstractContextManager[Any]:
    """What a session on ``engine`` holds while it runs: for an engine whose pool is one connection shared by every
    thread (``StaticPool``: an in-memory SQLite database, :func:`make_engine`), that pool's lock, since two sessions
    at once interleaved their transactions on it: one's ``COMMIT`` ended the other's, so writes failed ("cannot
    start a transaction within a transaction") or raised yet were stored. For any other pool, nothing."""
    pool = engine.pool
    if not isinstance(pool, StaticPool):
        return nullcontext()
    with _TURNS_MADE:
        return _TURNS.setdefault(pool, threading.Lock())


_WAL_SWITCH = threading.Lock()


def _journal_mode(cursor: Any) -> str:
    cursor.execute("PRAGMA journal_mode")
    return str(cursor.fetchone()[0]).lower()


def _locked(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite refusing a lock another connection holds."""
    return isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)


def _switch_to_wal(path: Path) -> str:
    """One attempt: the journal mode of ``path`` after asking for WAL where it is not WAL yet."""
    with _WAL_SWITCH, closing(sqlite3.connect(path, timeout=SQLITE_BUSY_TIMEOUT_MS / 1000)) as conn:
        mode = _journal_mode(conn.cursor())
        if mode != "wal":
            conn.execute("PRAGMA journal_mode=WAL")
            mode = _journal_mode(conn.cursor())
    return mode


def enable_wal(path: Path) -> None:
    """Create the parent folder of the SQLite file ``path`` and switch the file to WAL mode (readers do not block
    the writer), once, before any pooled connection opens it. WAL is kept in the file, so later connections need
    no switch. The switch takes an exclusive lock that SQLite refuses at once ("database is locked", without
    waiting on its busy handler) to a second connection switching the same new file: this process's switches take
    turns under one lock, and a switch that another process holds the lock against is tried again, with jittered
    backoff, for up to the busy timeout (``SQLITE_BUSY_TIMEOUT_MS``).

    Raises:
        ConfigError: when the folder or the file cannot be created or opened, or the file cannot be switched to
            WAL (e.g. a read-only file, or a file system without shared memory).
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        retrying = Retrying(
            retry=retry_if_exception(_locked),
            stop=stop_after_delay(SQLITE_BUSY_TIMEOUT_MS / 1000),
            wait=wait_random_exponential(multiplier=0.01, max=0.5),
            reraise=True,
        )
        mode = retrying(_switch_to_wal, path)
    except (OSError, sqlite3.Error) as exc:
        raise ConfigError(f"cannot open the SQLite database {path} ({exc}); check the path and permissions") from exc
    if mode != "wal":
        raise ConfigError(f"the SQLite database {path} cannot use WAL journaling (it stays in {mode!r} mode)")


def _set_sqlite_pragmas(dbapi_connection: Any, connection_record: Any) -> None:
    # The driver's own implicit BEGIN is turned off: SQLAlchemy's "begin" event emits it (see _sqlite_begin).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        # A plain file was switched to WAL when its engine was made (enable_wal), and WAL stays in the file: asking
        # costs no lock. A ``file:`` URI naming a file is switched here. In-memory databases answer "memory".
        if _journal_mode(cursor) not in ("wal", "memory"):
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")  # durable under WAL except against power loss
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()
    # The icontains filter's case folding, the same as PostgreSQL's (see inferscale.storage.case_fold).
    dbapi_connection.create_function(SQLITE_FUNCTION, 1, sqlite_fold, deterministic=True)


def _set_postgres_lock_timeout(dbapi_connection: Any, connection_record: Any) -> None:
    # Committed: a SET inside a transaction that is rolled back (the pool's reset on return) would be undone.
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"SET lock_timeout = {int(POSTGRES_LOCK_TIMEOUT_MS)}")
    finally:
        cursor.close()
    dbapi_connection.commit()


def _sqlite_begin(conn: Connection) -> None:
    """Start every transaction explicitly: ``BEGIN IMMEDIATE`` for writers, ``BEGIN`` for readers.

    A deferred transaction that reads and then writes cannot wait for the write lock (SQLite answers "database
    is locked" at once, since its snapshot may be stale); taking the write lock up front makes writers queue on
    ``busy_timeout`` instead, across threads and processes.
    """
    mode = "IMMEDIATE" if conn.get_execution_options().get(WRITE_OPTION) else "DEFERRED"
    conn.exec_driver_sql(f"BEGIN {mode}")


POSTGRES_LOCK_NOT_AVAILABLE = "55P03"
"""PostgreSQL's SQLSTATE for a lock not obtained within ``lock_timeout``."""

POSTGRES_UNDEFINED_TABLE = "42P01"
"""PostgreSQL's SQLSTATE for a table that does not exist (:func:`_lost_table`)."""

SQLITE_UNAVAILABLE = (
    "database is locked",
    "database table is locked",
    "database or disk is full",
    "readonly database",
    "disk i/o error",
)
"""SQLite errors on an open connection that say the database cannot be used now (another writer held it past the
busy timeout, a full disk, a read-only file, a file the system cannot read or write), not that the call was
wrong."""


def _unavailable(context: ExceptionContext) -> str | None:
    """Why the DBAPI error of ``context`` means the database cannot be used now, or ``None`` for any other error.

    - No connection yet: it could not be opened (a server down, a refused port, an unknown database, role or
      password; a SQLite file that cannot be opened).
    - An open connection lost (``is_disconnect``: the server ended the session, a failover).
    - SQLite refusing on an open connection for a reason of the file's, not the call's (:data:`SQLITE_UNAVAILABLE`);
      PostgreSQL refusing a lock held past :data:`POSTGRES_LOCK_TIMEOUT_MS` (SQLSTATE 55P03).

    The pool's liveness check (``pool_pre_ping``) is never one: SQLAlchemy replaces a dead pooled connection and
    goes on, which this hook must not cut short.
    """
    if context.is_pre_ping or not isinstance(context.sqlalchemy_exception, DBAPIError):
        return None
    url = context.engine.url if context.engine is not None else None
    sqlite = url is not None and url.get_backend_name() == "sqlite"
    if context.connection is None:
        if sqlite:
            return "check that the file's folder exists and may be written, and that no other process holds it locked"
        return "check that its server runs and that the URL's host, port, database, user and password are right"
    if context.is_disconnect:
        return (
            "the connection was lost during the call, so its transaction was rolled back, unless the loss came during "
            "its commit; check that the server runs, then make the call again"
        )
    if getattr(context.original_exception, "sqlstate", None) == POSTGRES_LOCK_NOT_AVAILABLE:
        return (
            "the call was rolled back; a lock it needed stayed held by another transaction past the lock timeout "
            f"({POSTGRES_LOCK_TIMEOUT_MS / 1000:g} s): make the call again once that transaction ends"
        )
    message = str(context.original_exception).lower()
    if isinstance(context.original_exception, sqlite3.OperationalError) and any(
        reason in message for reason in SQLITE_UNAVAILABLE
    ):
        return (
            f"the call was rolled back; the file stayed locked by another writer past the busy timeout "
            f"({SQLITE_BUSY_TIMEOUT_MS / 1000:g} s), or its disk is full, read-only or failing: make the call again "
            "once it is free"
        )
    return None


def shown_url(url: str) -> str:
    """``url`` as messages and logs show it: its password replaced by ``***`` (:func:`hidden_password`; also in a
    string SQLAlchemy cannot parse, as far as it has a ``//user:password@`` part)."""
    try:
        return hidden_password(make_url(url))
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        return re.sub(r"(//[^/:@]*:)[^@/]*@", r"\1***@", url)


def hidden_password(url: URL) -> str:
    """``url`` rendered with its password as ``***``, the one before the host and a ``password`` query parameter both
    (libpq takes either; a Mem0 connection string of ``key=value`` words becomes the second)."""
    if "password" in url.query:
        url = url.update_query_dict({"password": "***"})
    return url.render_as_string(hide_password=True)


def _lost_table(context: ExceptionContext) -> bool:
    """Whether the DBAPI error of ``context`` says a table does not exist: the store created its tables on first
    use, so the database was dropped and made again (or its tables dropped) under the running process."""
    error = context.original_exception
    if getattr(error, "sqlstate", None) == POSTGRES_UNDEFINED_TABLE:
        return True
    return isinstance(error, sqlite3.OperationalError) and str(error).startswith("no such table")


def _report_unusable(context: ExceptionContext) -> None:
    """A ``handle_error`` hook: a DBAPI error that says the database cannot be used now (:func:`_unavailable`)
    becomes :class:`DatabaseUnavailableError`, and one that says its tables are gone (:func:`_lost_table`)
    :class:`SchemaError`, each naming the URL without its password and the driver's own message."""
    url = context.engine.url if context.engine is not None else None
    reason = str(context.original_exception).strip().splitlines()
    shown = hidden_password(url) if url is not None else "?"
    if isinstance(context.sqlalchemy_exception, DBAPIError) and _lost_table(context):
        raise SchemaError(  # was a bare ProgrammingError on every call (500 internal_error), an operator's find
            f"the database {shown} has lost InferScale's tables ({reason[0] if reason else 'no such table'}): it was "
            "dropped and made again, or its tables were dropped; restore it, or, to start it empty, drop what is left "
            "of InferScale's tables (their version tables too: inferscale_schema_version and the server's) and "
            "restart the process, which creates them"
        ) from context.original_exception
    fix = _unavailable(context)
    if fix is None:
        return
    verb = "cannot connect to" if context.connection is None else "cannot use"
    raise DatabaseUnavailableError(
        f"{verb} the database {shown}: {reason[0] if reason else type(context.original_exception).__name__}; {fix}"
    ) from context.original_exception


def report_unavailable_database(engine: Engine) -> None:
    """Make a database that cannot be used raise :class:`~inferscale.errors.DatabaseUnavailableError` on ``engine``
    (also an async engine's ``sync_engine``) instead of the driver's ``OperationalError``: a failure to connect (a
    server down, a refused port, an unknown database or role, a wrong password), a connection lost during a call, a
    SQLite file locked past the busy timeout, full or read-only (:func:`_unavailable`); and a database whose tables
    are gone raise :class:`~inferscale.errors.SchemaError` (:func:`_lost_table`). Other errors (a constraint) are
    left as they are."""
    event.listen(engine, "handle_error", _report_unusable)


def configure_sqlite(engine: Engine) -> None:
    """Install the SQLite connection settings (pragmas, explicit BEGIN, the ``icontains`` case-folding function) on
    ``engine`` (also an async engine's ``sync_engine``)."""
    event.listen(engine, "connect", _set_sqlite_pragmas)
    event.listen(engine, "begin", _sqlite_begin)


def make_engine(url: str) -> Engine:
    """Create an engine for ``url`` (any SQLAlchemy URL, e.g. ``sqlite:////tmp/m.db`` or
    ``postgresql+psycopg://user@host:5432/db``). Connects lazily: no I/O happens here except, for a SQLite file,
    creating its folder and switching it to WAL (:func:`enable_wal`).

    SQLite connections get ``foreign_keys=ON``, a
    ``busy_timeout`` of :data:`SQLITE_BUSY_TIMEOUT_MS` milliseconds, and ``BEGIN IMMEDIATE`` on connections that
    carry the :data:`WRITE_OPTION` execution option. An in-memory SQLite database is shared by
    every thread through one connection (``StaticPool``). Other databases get ``pool_pre_ping``, and PostgreSQL
    connections a ``lock_timeout`` of :data:`POSTGRES_LOCK_TIMEOUT_MS`. A database that
    cannot be used (no connection, one lost during a call, a SQLite file locked past the busy timeout, full or
    read-only) raises :class:`~inferscale.errors.DatabaseUnavailableError` (:func:`report_unavailable_database`).

    Raises:
        ConfigError: when ``url`` is not a valid SQLAlchemy URL or names a driver that is not installed.
    """
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(f"database url must be a non-empty string, got {url!r}")
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:  # ValueError: a port that is not a number
        raise ConfigError(f"database url {shown_url(url)!r} is not a SQLAlchemy URL: {exc}") from exc

    parsed = _home_expanded(parsed)
    try:
        engine = create_engine(parsed, **_engine_options(parsed, in_memory={"check_same_thread": False}))
        _configure(engine, parsed)
        return engine
    except ArgumentError as exc:  # includes NoSuchModuleError: an unknown dialect or driver name
        raise ConfigError(f"database url {shown_url(url)!r} names no known SQLAlchemy dialect: {exc}") from exc
    except ImportError as exc:
        hint = _install_hint(parsed)
        raise ConfigError(f"the driver for {parsed.drivername!r} is not installed ({exc}); {hint}") from exc


def _install_hint(url: URL) -> str:
    """What to install for ``url``'s driver: the extras InferScale is tested with, else SQLAlchemy's own docs."""
    driver = url.get_driver_name()
    if url.get_backend_name() == "sqlite":
        if driver != "pysqlite":
            return f"InferScale runs SQLite through Python's own sqlite3: use sqlite:// instead of {url.drivername}://"
        return "this Python was built without its sqlite3 module: install one built with it (e.g. libsqlite3-dev)"
    if url.get_backend_name() == "postgresql":
        hint = "run `pip install 'inferscale-memory[postgres]'` (psycopg)"
        if driver != "psycopg":
            hint += f", or install {driver}; postgresql+psycopg:// serves the sync and async clients both"
        return hint
    return (
        f"install the {driver} package SQLAlchemy names for {url.get_backend_name()} (InferScale is tested on SQLite "
        "and PostgreSQL)"
    )


def make_async_engine(url: str) -> AsyncEngine:
    """Create an async engine for ``url``, an async SQLAlchemy URL (``postgresql+psycopg://...``: the async store runs
    SQLite with the sync engine on threads, :mod:`~inferscale.storage.async_sessions`), with :func:`make_engine`'s
    settings: ``pool_pre_ping``, PostgreSQL's ``lock_timeout``, and
    :class:`~inferscale.errors.DatabaseUnavailableError` for a failure to connect.

    Raises:
        ConfigError: when the async driver is not installed.
    """
    from sqlalchemy.ext.asyncio import create_async_engine

    parsed = _home_expanded(make_url(url))
    try:
        engine = create_async_engine(parsed, **_engine_options(parsed, in_memory={}))
    except ImportError as exc:
        raise ConfigError(
            f"the async driver for {parsed.drivername!r} is not installed ({exc}); {_install_hint(parsed)}"
        ) from exc
    _configure(engine.sync_engine, parsed)
    return engine


def _home_expanded(parsed: URL) -> URL:
    """``parsed`` with a SQLite file's leading ``~`` expanded, as :func:`sqlite_file` reads it. The driver opens the
    path as written: ``sqlite:///~/m.db`` was switched to WAL at ``$HOME/m.db`` (a file made there) and then opened
    at ``./~/m.db``, which failed (a review's find)."""
    path = sqlite_file(parsed)
    return parsed.set(database=str(path)) if path is not None and (parsed.database or "").startswith("~") else parsed


def _engine_options(parsed: URL, in_memory: dict[str, Any]) -> dict[str, Any]:
    """The engine's keyword arguments for ``parsed``, the one place both engines' settings are chosen: for an
    in-memory SQLite database, one connection shared by every thread (``StaticPool``, with ``in_memory`` as the
    driver's ``connect_args``); for a SQLite file, none (the file is switched to WAL here: :func:`enable_wal`);
    elsewhere ``pool_pre_ping``."""
    if parsed.get_backend_name() != "sqlite":
        return {"pool_pre_ping": True}
    path = sqlite_file(parsed)
    if path is None:
        return {"poolclass": StaticPool, "connect_args": in_memory}
    enable_wal(path)
    return {}


def _configure(engine: Engine, parsed: URL) -> None:
    """Install the connection settings on ``engine`` (an async engine's ``sync_engine``): SQLite's pragmas and
    explicit ``BEGIN`` (:func:`configure_sqlite`), PostgreSQL's ``lock_timeout`` (:data:`POSTGRES_LOCK_TIMEOUT_MS`),
    and :class:`DatabaseUnavailableError` for a database that cannot be used (:func:`report_unavailable_database`)."""
    if parsed.get_backend_name() == "sqlite":
        configure_sqlite(engine)
    elif parsed.get_backend_name() == "postgresql":
        event.listen(engine, "connect", _set_postgres_lock_timeout)
    report_unavailable_database(engine)
