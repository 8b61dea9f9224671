"""PostgreSQL advisory locks stay bounded per transaction (:func:`inferscale.storage.locks.lock_keys` escalates past
``MAX_ADVISORY_KEYS``), and escalation still keeps the transactions it must keep apart.

A tester's find: ``add`` of 20,000 messages to one scope on PostgreSQL failed with SQLAlchemy's untyped
``OperationalError`` "out of shared memory ... increase max_locks_per_transaction", where SQLite stored them all: the
add took one advisory lock per text (and one per given id), and the server's shared lock table (64 x 100 slots by
default) filled up."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from databases import database_url
from sqlalchemy import Connection, Engine, event, text

import inferscale.storage.database
from inferscale.errors import DatabaseUnavailableError
from inferscale.scope import Scope
from inferscale.storage import ChangeSet, MemoryStore, NewMemory, make_engine
from inferscale.storage.contexts import context_lock_key
from inferscale.storage.locks import MAX_ADVISORY_KEYS, advisory_key, current_schema, escalation_key, lock_keys

pytestmark = pytest.mark.postgres

HELD = text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()")
SHORT_WAIT = text("SET LOCAL lock_timeout = '300ms'")


@pytest.fixture
def pg_engine(postgres_url_or_none: str | None) -> Iterator[Engine]:
    """An engine on a fresh PostgreSQL schema of its own (the escalation lock is per schema: tests running beside
    this one, each in its own schema, never take this one's)."""
    if postgres_url_or_none is None:
        pytest.skip("no PostgreSQL server answers (advisory locks are PostgreSQL's)")
    engine = make_engine(postgres_url_or_none)
    yield engine
    engine.dispose()


def _escalation_modes(conn: Connection) -> set[str]:
    """The modes this session holds its schema's escalation lock in."""
    query = text(
        "SELECT mode FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND objsubid = 1 "
        "AND ((classid::bigint << 32) | objid::bigint) = :key"
    )
    return set(conn.execute(query, {"key": escalation_key(current_schema(conn))}).scalars())


@pytest.mark.parametrize("n_keys", [1, MAX_ADVISORY_KEYS, MAX_ADVISORY_KEYS + 1, 20_000])
def test_a_transaction_holds_at_most_max_keys_plus_one_advisory_locks(pg_engine: Engine, n_keys: int) -> None:
    """Up to the bound, the shared escalation lock and one lock per key; past it, the exclusive escalation lock
    alone. 20,000 keys one by one overflowed the server's lock table before."""
    with pg_engine.begin() as conn:
        lock_keys(conn, [*range(n_keys), 0])  # a duplicate is locked once
        held = conn.execute(HELD).scalar_one()
        modes = _escalation_modes(conn)
    if n_keys <= MAX_ADVISORY_KEYS:
        assert held == n_keys + 1
        assert modes == {"ShareLock"}
    else:
        assert held == 1
        assert modes == {"ExclusiveLock"}


def _holds(engine: Engine, keys: list[int], entered: threading.Event, release: threading.Event) -> None:
    with engine.begin() as conn:
        lock_keys(conn, keys)
        entered.set()
        release.wait(30)


@pytest.mark.parametrize(
    ("holder", "waiter"),
    [
        (list(range(100, 200)), [7]),  # many keys (exclusive) keep out a transaction with one key
        ([7], list(range(100, 200))),  # one key (shared escalation) keeps out a transaction with many
        ([7], [7]),  # the same key, both under the bound
    ],
    ids=["many-then-one", "one-then-many", "same-key"],
)
def test_escalated_and_single_key_transactions_exclude_each_other(
    pg_engine: Engine, holder: list[int], waiter: list[int]
) -> None:
    entered, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=_holds, args=(pg_engine, holder, entered, release))
    thread.start()
    try:
        assert entered.wait(30)
        with pytest.raises(DatabaseUnavailableError, match="lock"), pg_engine.begin() as conn:
            conn.execute(SHORT_WAIT)
            lock_keys(conn, waiter)
    finally:
        release.set()
        thread.join(30)
    with pg_engine.begin() as conn:  # the holder committed: the same locks are free now
        conn.execute(SHORT_WAIT)
        lock_keys(conn, waiter)


def test_no_keys_take_no_lock_and_the_schema_lock_stands_alone(pg_engine: Engine) -> None:
    """A change set with nothing to lock takes nothing; the schema lock (``escalate=False``) takes no escalation lock,
    so a migration never holds a lock that writers wait for (a reviewer's find: its DDL could deadlock with an
    escalated write that had read the table)."""
    with pg_engine.begin() as conn:
        lock_keys(conn, [])
        assert conn.execute(HELD).scalar_one() == 0
        lock_keys(conn, [advisory_key("inferscale.schema", "x")], escalate=False)
        assert conn.execute(HELD).scalar_one() == 1 and _escalation_modes(conn) == set()


def test_an_escalated_write_in_one_schema_does_not_hold_back_another_schema(pg_engine: Engine, tmp_path: Path) -> None:
    """Advisory locks are database-wide, so the escalation lock names the schema: one schema's exclusive lock (an
    import of many memories) leaves a store in another schema of the same database free to write."""
    entered, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=_holds, args=(pg_engine, list(range(100, 200)), entered, release))
    thread.start()
    try:
        assert entered.wait(30)
        with database_url("postgres", tmp_path) as other_url:
            other = make_engine(other_url)
            try:
                with other.begin() as conn:
                    conn.execute(SHORT_WAIT)
                    lock_keys(conn, list(range(100, 200)))  # the same keys, escalated too, in its own schema
                    assert _escalation_modes(conn) == {"ExclusiveLock"}
            finally:
                other.dispose()
    finally:
        release.set()
        thread.join(30)


def test_disjoint_keys_under_the_bound_do_not_wait(pg_engine: Engine) -> None:
    entered, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=_holds, args=(pg_engine, [1, 2, 3], entered, release))
    thread.start()
    try:
        assert entered.wait(30)
        with pg_engine.begin() as conn:
            conn.execute(SHORT_WAIT)
            lock_keys(conn, [4, 5])
    finally:
        release.set()
        thread.join(30)


def test_an_add_of_many_messages_takes_two_advisory_locks_and_many_given_ids_escalate(
    postgres_url_or_none: str | None,
) -> None:
    """The add's lock statements, counted on the wire: the scope's lock under the shared escalation lock, whatever
    the number of texts (each text took one more before, 2,001 here); given ids past the bound take the exclusive
    escalation lock alone."""
    if postgres_url_or_none is None:
        pytest.skip("no PostgreSQL server answers (advisory locks are PostgreSQL's)")
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "pg_advisory" in statement:
            statements.append(statement)

    scope = Scope(user_id="alice")
    with MemoryStore(postgres_url_or_none) as store:
        store.list(scope)  # the schema first: its own lock is not the add's
        event.listen(Engine, "before_cursor_execute", seen)
        try:
            _add_many(store, scope, statements)
        finally:
            event.remove(Engine, "before_cursor_execute", seen)


def _mode(statement: str) -> str:
    return "shared" if statement.startswith("SELECT pg_advisory_xact_lock_shared(") else "exclusive"


def _add_many(store: MemoryStore, scope: Scope, statements: list[str]) -> None:
    texts = [f"fact {i}" for i in range(2_000)]
    applied = store.apply(ChangeSet(scope, adds=tuple(NewMemory(t) for t in texts)))
    assert len(applied.added) == 2_000
    assert [_mode(s) for s in statements] == ["shared", "exclusive"]
    statements.clear()
    with_ids = tuple(NewMemory(f"given {i}", memory_id=f"00000000-0000-4000-8000-{i:012d}") for i in range(40))
    assert len(store.apply(ChangeSet(scope, adds=with_ids)).added) == 40
    assert [_mode(s) for s in statements] == ["exclusive"]
    assert len(store.list(scope)) == 2_040


def test_delete_all_and_reset_wait_for_an_add_of_their_scope(
    postgres_url_or_none: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An add holds its scope's stored-contexts lock from reading its neighbours' texts to its commit. ``delete_all``
    took no advisory lock, so an add running beside it committed a memory whose context held the texts it deleted
    (a tester's find: 2 such memories in 20 s of three adders and a deleter on PostgreSQL, none on SQLite). Now
    ``delete_all`` takes the lock of every exact scope it deletes from, and ``reset`` the schema's exclusive one."""
    if postgres_url_or_none is None:
        pytest.skip("no PostgreSQL server answers (advisory locks are PostgreSQL's)")
    monkeypatch.setattr(inferscale.storage.database, "POSTGRES_LOCK_TIMEOUT_MS", 300)
    nested = Scope(user_id="u", run_id="r1")
    with MemoryStore(postgres_url_or_none) as store:
        store.add("I like tea.", Scope(user_id="u"))
        store.add("I like coffee.", nested)
        holder = make_engine(postgres_url_or_none)
        try:
            for held, call in (
                (context_lock_key(nested), lambda: store.delete_scope(Scope(user_id="u"))),
                (advisory_key("any write"), store.reset),
            ):
                with holder.begin() as conn:  # an add of that scope, between its neighbours' read and its commit
                    lock_keys(conn, [held])
                    with pytest.raises(DatabaseUnavailableError, match="lock"):
                        call()
                assert len(store.list(Scope(user_id="u"))) == 2  # nothing was deleted
            assert len(store.delete_scope(Scope(user_id="u"))) == 2  # the locks are free: it goes through
        finally:
            holder.dispose()
