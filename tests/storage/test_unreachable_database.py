"""A database that cannot be connected to raises ``DatabaseUnavailableError`` (an InferScale error, and a
``ConnectionError``) on every store and client, naming the URL without its password (the CLI prints it as one line:
tests/cli/test_cli_options_and_errors.py).

Two ways to fail: a port nothing listens on (needs only psycopg), and a database the running PostgreSQL server does
not have (skipped without a server). On an open connection: a session the server ended (the pool replaces it before
a call; during a call it is DatabaseUnavailableError), and a SQLite file locked past the busy timeout. Other errors
on an open connection keep their own types (tests/storage)."""

from __future__ import annotations

import asyncio
import importlib.util
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from databases import postgres_base_url
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import make_url

import inferscale.storage.database
from inferscale import AsyncMemoryClient, ConfigError, DatabaseUnavailableError, MemoryClient, MemoryConfig
from inferscale.config import KVConfig
from inferscale.errors import SchemaError
from inferscale.mem0_config import from_mem0_dict
from inferscale.scope import Scope
from inferscale.server.keys import KeyStore
from inferscale.storage import MemoryStore, make_engine
from inferscale.storage.async_store import AsyncMemoryStore
from inferscale.storage.database import shown_url

REFUSED = "postgresql+psycopg://inferscale:s3cret@127.0.0.1:1/memories"
"""Port 1: nothing listens there, so the connection is refused at once."""


def _missing_database() -> str:
    base = postgres_base_url()
    if base is None:
        pytest.skip("no PostgreSQL server answers on 127.0.0.1:5432 (or psycopg is missing)")
    return make_url(base).set(database="inferscale_no_such_database").render_as_string(hide_password=False)


@pytest.fixture(params=["refused", "missing"])
def url(request: pytest.FixtureRequest) -> str:
    pytest.importorskip("psycopg", reason="the PostgreSQL driver (pip install 'inferscale-memory[postgres]')")
    return REFUSED if request.param == "refused" else _missing_database()


def _assert_unavailable(exc: DatabaseUnavailableError, url: str) -> None:
    message = str(exc)
    assert message.startswith(f"cannot connect to the database {make_url(url).render_as_string(hide_password=True)}")
    assert "s3cret" not in message
    assert isinstance(exc, ConnectionError)


def test_the_sync_store_the_key_store_and_the_client_raise_database_unavailable(url: str, tmp_path: Path) -> None:
    with pytest.raises(DatabaseUnavailableError) as caught:
        MemoryStore(url).list(Scope(user_id="maya"))
    _assert_unavailable(caught.value, url)
    with pytest.raises(DatabaseUnavailableError):
        KeyStore(url).list()
    client = MemoryClient(MemoryConfig(data_dir=str(tmp_path), db_url=url))
    with client, pytest.raises(DatabaseUnavailableError):
        client.get_all(user_id="maya")


def test_a_password_in_the_urls_query_is_hidden_too() -> None:
    """libpq takes the password as a query parameter too, and a Mem0 connection string of key=value words becomes
    one (``postgresql+psycopg://?host=...&password=...``): the message showed it in clear."""
    pytest.importorskip("psycopg", reason="the PostgreSQL driver (pip install 'inferscale-memory[postgres]')")
    given = {"connection_string": "host=127.0.0.1 port=1 dbname=memories user=inferscale password=s3cret"}
    url = str(from_mem0_dict({"vector_store": {"provider": "pgvector", "config": given}}).db_url)
    assert "password=s3cret" in url  # passed to psycopg as it is
    with pytest.raises(DatabaseUnavailableError) as caught:
        MemoryStore(url).list(Scope(user_id="maya"))
    assert "s3cret" not in str(caught.value) and "password=%2A%2A%2A" in str(caught.value)
    assert "s3cret" not in shown_url(url) and "s3cret" not in repr(MemoryStore(url))


def test_the_async_store_and_client_raise_database_unavailable(url: str, tmp_path: Path) -> None:
    pytest.importorskip("sqlalchemy.ext.asyncio")

    async def main() -> None:
        with pytest.raises(DatabaseUnavailableError) as caught:
            await AsyncMemoryStore(url).list(Scope(user_id="maya"))
        _assert_unavailable(caught.value, url)
        client = AsyncMemoryClient(MemoryConfig(data_dir=str(tmp_path), db_url=url))
        try:
            with pytest.raises(DatabaseUnavailableError):
                await client.search("dog", user_id="maya")
        finally:
            await client.close()

    asyncio.run(main())


def test_a_sqlite_file_that_cannot_be_opened_names_the_file_and_a_fix_for_files(tmp_path: Path) -> None:
    """A ``file:`` URI is opened by the driver on first connect (a plain path is opened, and refused with a
    ``ConfigError``, when the store is made)."""
    url = f"sqlite:///file:{tmp_path}/no_such_folder/memory.db?mode=ro&uri=true"
    with pytest.raises(DatabaseUnavailableError) as caught:
        MemoryStore(url).list(Scope(user_id="maya"))
    message = str(caught.value)
    shown = make_url(url).render_as_string(hide_password=True)
    assert message.startswith(f"cannot connect to the database {shown}: unable to open database file")
    assert message.endswith(
        "check that the file's folder exists and may be written, and that no other process holds it locked"
    )


@pytest.mark.parametrize(
    ("url", "hint"),
    [
        ("mysql+pymysql://u@h/d", "install the pymysql package SQLAlchemy names for mysql (InferScale is tested on"),
        (
            "postgresql+psycopg2://u@h/d",
            "'inferscale-memory[postgres]'` (psycopg), or install psycopg2; postgresql+psycopg://",
        ),
    ],
)
def test_a_missing_driver_is_named_with_what_to_install_for_it(url: str, hint: str) -> None:
    """A MySQL URL without its driver was told to install InferScale's PostgreSQL extra."""
    for module in ("pymysql", "psycopg2"):
        if module in url and importlib.util.find_spec(module) is not None:
            pytest.skip(f"{module} is installed here")
    with pytest.raises(ConfigError, match=re.escape(hint)), MemoryStore(url) as store:
        store.list(Scope(user_id="u"))


def test_a_missing_async_driver_is_named_with_what_to_install_for_it(tmp_path: Path) -> None:
    """The async client on ``postgresql+asyncpg://`` without asyncpg was told to install aiosqlite."""
    if importlib.util.find_spec("asyncpg") is not None:
        pytest.skip("asyncpg is installed here")
    client = AsyncMemoryClient(MemoryConfig(data_dir=str(tmp_path), db_url="postgresql+asyncpg://u@127.0.0.1:1/d"))

    async def first_read() -> None:
        try:
            await client.get_all(user_id="u")
        finally:
            await client.close()

    with pytest.raises(ConfigError, match=r"or install asyncpg; postgresql\+psycopg:// serves the sync and async"):
        asyncio.run(first_read())


def _terminate(url: str, pid: int) -> None:
    """End the PostgreSQL session ``pid`` from another connection (as a failover or an idle timeout would)."""
    admin = create_engine(url)
    with admin.begin() as conn:
        assert conn.execute(text("select pg_terminate_backend(:pid)"), {"pid": pid}).scalar() is True
    admin.dispose()


def test_a_pooled_connection_the_server_ended_is_replaced_and_one_lost_mid_call_is_unavailable(
    db_url: str, tmp_path: Path
) -> None:
    """The hook that turns a failure to connect into DatabaseUnavailableError also caught the pool's pre-ping, so a
    pooled session the server had ended failed the next call ("cannot connect to the database ?") instead of being
    replaced. A session lost during a call raised sqlalchemy's OperationalError."""
    if not db_url.startswith("postgresql"):
        pytest.skip("server-ended sessions are PostgreSQL's; SQLite has no server")
    with MemoryClient(MemoryConfig(data_dir=str(tmp_path), db_url=db_url, kv=KVConfig(encode_on_add=False))) as client:
        client.add("I like tea.", user_id="u", infer=False)
        with client.db.engine.connect() as conn:
            pid = conn.execute(text("select pg_backend_pid()")).scalar()
        assert isinstance(pid, int)
        _terminate(db_url, pid)  # the one pooled connection: the next call's pre-ping finds it dead
        assert [r["memory"] for r in client.get_all(user_id="u")["results"]] == ["I like tea."]
    engine = make_engine(db_url)
    with engine.connect() as conn:
        _terminate(db_url, conn.execute(text("select pg_backend_pid()")).scalar())
        with pytest.raises(DatabaseUnavailableError, match="the connection was lost during the call") as caught:
            conn.execute(text("select 1"))
    assert str(caught.value).startswith("cannot use the database postgresql")
    engine.dispose()


def test_a_sqlite_file_locked_past_the_busy_timeout_is_unavailable_and_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process holding the write lock past the busy timeout made add and update raise sqlalchemy's
    OperationalError ("database is locked"), no InferScale error; reads go on."""
    monkeypatch.setattr(inferscale.storage.database, "SQLITE_BUSY_TIMEOUT_MS", 200)
    config = MemoryConfig(data_dir=str(tmp_path), kv=KVConfig(encode_on_add=False))
    with MemoryClient(config) as client:
        memory_id = client.add("I like tea.", user_id="u", infer=False)["results"][0]["id"]
        holder = sqlite3.connect(tmp_path / "memory.db", isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            for write in (
                lambda: client.add("I like coffee.", user_id="u", infer=False),
                lambda: client.update(memory_id, "I like green tea."),
            ):
                with pytest.raises(DatabaseUnavailableError, match="database is locked; the call was rolled back"):
                    write()
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert [r["memory"] for r in client.get_all(user_id="u")["results"]] == ["I like tea."]
        client.add("I like coffee.", user_id="u", infer=False)
        assert len(client.get_all(user_id="u")["results"]) == 2


def test_a_sqlite_disk_io_error_is_unavailable_and_nothing_is_written(tmp_path: Path) -> None:
    """An SRE made the ``-wal`` file immutable: ``add`` answered 500 ``internal_error`` (sqlalchemy's
    ``OperationalError``: "disk I/O error") where a full or read-only disk answers 503. The driver's error is raised
    here where the cursor would write, as a failing disk raises it."""
    config = MemoryConfig(data_dir=str(tmp_path), kv=KVConfig(encode_on_add=False))
    with MemoryClient(config) as client:
        client.add("I like tea.", user_id="u", infer=False)
        failing = True

        def disk_fails(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if failing and statement.startswith("INSERT"):
                raise sqlite3.OperationalError("disk I/O error")

        event.listen(client.db.engine, "before_cursor_execute", disk_fails)
        with pytest.raises(DatabaseUnavailableError, match="disk I/O error; the call was rolled back"):
            client.add("I like coffee.", user_id="u", infer=False)
        failing = False
        assert [r["memory"] for r in client.get_all(user_id="u")["results"]] == ["I like tea."]
        client.add("I like coffee.", user_id="u", infer=False)  # the disk is back
        assert len(client.get_all(user_id="u")["results"]) == 2


def test_a_postgresql_table_locked_past_the_lock_timeout_is_unavailable_and_nothing_is_written(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another transaction holding a lock (a ``LOCK TABLE``, a hung migration) made every call wait for good on
    PostgreSQL, where SQLite gives up after its busy timeout (tester report). Both clients, sync and async."""
    if not db_url.startswith("postgresql"):
        pytest.skip("PostgreSQL's lock_timeout; SQLite's busy timeout has its own test above")
    monkeypatch.setattr(inferscale.storage.database, "POSTGRES_LOCK_TIMEOUT_MS", 300)
    config = MemoryConfig(data_dir=str(tmp_path), db_url=db_url, kv=KVConfig(encode_on_add=False))
    with MemoryClient(config) as client:
        client.add("I like tea.", user_id="u", infer=False)
        holder = create_engine(db_url)
        with holder.connect() as conn:
            conn.execute(text("lock table memories in access exclusive mode"))  # held until this block's rollback
            with pytest.raises(DatabaseUnavailableError, match="past the lock timeout"):
                client.add("I like coffee.", user_id="u", infer=False)

            async def async_add() -> None:
                async with AsyncMemoryClient(config) as aclient:
                    await aclient.add("I like cocoa.", user_id="u", infer=False)

            with pytest.raises(DatabaseUnavailableError, match="past the lock timeout"):
                asyncio.run(async_add())
        holder.dispose()
        assert [r["memory"] for r in client.get_all(user_id="u")["results"]] == ["I like tea."]


def test_tables_dropped_under_a_running_store_are_a_schema_error_naming_the_fix(db_url: str) -> None:
    """An operator's find: a PostgreSQL database dropped and made again under a running server answered every call
    with a bare ProgrammingError (500 internal_error) until a restart. Its calls now raise SchemaError, saying what
    happened and what to do, on both backends and the async store alike."""
    alice = Scope(user_id="alice")
    with MemoryStore(db_url) as store:
        store.add("I like tea", alice)
        with store.engine.begin() as conn:  # what a dropped and remade database leaves: none of the tables
            conn.execute(text("drop table memory_history"))
            conn.execute(text("drop table kv_entries"))
            conn.execute(text("drop table memories"))
        for call in (lambda: store.list(alice), lambda: store.add("I like coffee", alice)):
            with pytest.raises(SchemaError, match=r"has lost InferScale's tables .*restart the process") as lost:
                call()
            assert "memor" in str(lost.value)  # the driver's own message names the table

    async def read() -> None:
        store = AsyncMemoryStore(db_url)
        try:
            await store.list(alice)
        finally:
            await store.close()

    with pytest.raises(SchemaError, match="has lost InferScale's tables"):
        asyncio.run(read())
