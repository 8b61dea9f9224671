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
from uuid import uuid4

import pytest
from databases import database_url
from sqlalchemy import Connection, Engine, event, text
from sqlalchemy.orm import Session

import inferscale.storage.database
from inferscale.errors import DatabaseUnavailableError
from inferscale.scope import Scope
from inferscale.storage import ChangeSet, MemoryStore, NewMemory, make_engine
from inferscale.storage.changes import apply_in_session, delete_scope_in_session
from inferscale.storage.contexts import context_lock_key
from inferscale.storage.locks import MAX_ADVISORY_KEYS, advisory_key, current_schema, escalation_key, lock_keys
from inferscale.storage.uninterrupted import guarded_session

pytestmark = pytest.mark.postgres


def fresh_keys(n: int) -> list[int]:
    """``n`` advisory keys no other test (in this process or a parallel worker) locks: advisory locks are
    database-wide, and only the escalation lock is per schema."""
    tag = uuid4().hex
    return [advisory_key("test", tag, str(i)) for i in range(n)]


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
        keys = fresh_keys(n_keys)
        lock_keys(conn, [*keys, keys[0]])  # a duplicate is locked once
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
    "case",
    [
        "many-then-one",  # many keys (exclusive) keep out a transaction with one key
        "one-then-many",  # one key (shared escalation) keeps out a transaction with many
        "same-key",  # the same key, both under the bound
    ],
)
def test_escalated_and_single_key_transactions_exclude_each_other(pg_engine: Engine, case: str) -> None:
    one, many = fresh_keys(1), fresh_keys(100)
    holder, waiter = {"many-then-one": (many, one), "one-then-many": (one, many), "same-key": (one, one)}[case]
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
    keys = fresh_keys(100)
    thread = threading.Thread(target=_holds, args=(pg_engine, keys, entered, release))
    thread.start()
    try:
        assert entered.wait(30)
        with database_url("postgres", tmp_path) as other_url:
            other = make_engine(other_url)
            try:
                with other.begin() as conn:
                    conn.execute(SHORT_WAIT)
                    lock_keys(conn, keys)  # the same keys, escalated too, in its own schema
                    assert _escalation_modes(conn) == {"ExclusiveLock"}
            finally:
                other.dispose()
    finally:
        release.set()
        thread.join(30)


def test_disjoint_keys_under_the_bound_do_not_wait(pg_engine: Engine) -> None:
    entered, release = threading.Event(), threading.Event()
    first, second = fresh_keys(3), fresh_keys(2)
    thread = threading.Thread(target=_holds, args=(pg_engine, first, entered, release))
    thread.start()
    try:
        assert entered.wait(30)
        with pg_engine.begin() as conn:
            conn.execute(SHORT_WAIT)
            lock_keys(conn, second)
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
    user = f"u-{uuid4().hex[:8]}"  # context keys are not per schema: no other test's scope
    nested = Scope(user_id=user, run_id="r1")
    with MemoryStore(postgres_url_or_none) as store:
        store.add("I like tea.", Scope(user_id=user))
        store.add("I like coffee.", nested)
        holder = make_engine(postgres_url_or_none)
        try:
            for held, call in (
                (context_lock_key(nested), lambda: store.delete_scope(Scope(user_id=user))),
                (advisory_key(f"any write {user}"), store.reset),
            ):
                with holder.begin() as conn:  # an add of that scope, between its neighbours' read and its commit
                    lock_keys(conn, [held])
                    with pytest.raises(DatabaseUnavailableError, match="lock"):
                        call()
                assert len(store.list(Scope(user_id=user))) == 2  # nothing was deleted
            assert len(store.delete_scope(Scope(user_id=user))) == 2  # the locks are free: it goes through
        finally:
            holder.dispose()


def test_delete_all_leaves_a_scope_that_gets_its_first_memory_meanwhile_to_the_adds_beside_it(
    postgres_url_or_none: str | None,
) -> None:
    """A reviewer's interleaving: ``delete_all`` read its exact scopes, then a new exact scope E of it got its first
    memory "x", and an add "y" to E, encoded after "x", took E's lock and wrote. ``delete_all`` locked the scopes it
    had read but deleted every memory of its scope, "x" among them, and "y" committed with "x" in its context. Now it
    deletes only the scopes it locked: "x" and "y" count as added after it."""
    if postgres_url_or_none is None:
        pytest.skip("no PostgreSQL server answers (advisory locks are PostgreSQL's)")
    user = f"u-{uuid4().hex[:8]}"
    new_scope = Scope(user_id=user, run_id="r1")
    with MemoryStore(postgres_url_or_none) as store:
        store.add("seed", Scope(user_id=user))
        engine = store.engine
        paused, go = threading.Event(), threading.Event()
        deleted: list[str] = []

        def pause_before_locking(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if "pg_advisory_xact_lock" in statement and not paused.is_set():
                paused.set()
                go.wait(30)  # the exact scopes are read; the new scope is not among them

        def delete_all() -> None:
            with guarded_session(engine, write=True) as s:
                event.listen(s.connection(), "before_cursor_execute", pause_before_locking)
                deleted.extend(r.text for r in delete_scope_in_session(s, Scope(user_id=user), None))

        thread = threading.Thread(target=delete_all)
        thread.start()
        try:
            assert paused.wait(30)
            store.add("x", new_scope)
            other = make_engine(postgres_url_or_none)
            with Session(other) as adding, adding.begin():
                apply_in_session(adding, ChangeSet(new_scope, adds=(NewMemory("y", context=("x",), neighbours=1),)))
                go.set()
                thread.join(30)
            other.dispose()
        finally:
            go.set()
            thread.join(30)
        assert deleted == ["seed"]
        left = {r.text: r.context for r in store.list(Scope(user_id=user))}
        assert left == {"x": [], "y": ["x"]}  # every text in a stored context is still stored
