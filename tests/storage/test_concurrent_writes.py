"""Concurrent writers on one database, SQLite and PostgreSQL: adds of one text to one scope store it once (threads
and, marked slow, processes), and processes updating one memory leave its last acknowledged text and a complete,
ordered history (one UPDATE row per acknowledged update, each starting from the text the previous one left)."""

from __future__ import annotations

import threading

import pytest
from store_workers import FIRST_SCOPE, HEADS, SCOPE, revisions, run_workers, share_new_database

from inferscale.scope import Scope
from inferscale.storage import ChangeSet, MemoryStore, NewMemory, make_engine

ROUNDS = 5
WRITERS = 4


def test_threads_adding_one_text_at_once_store_it_once(db_url: str) -> None:
    """Four threads, each with its own store (its own connections), add the same text to the same scope at the same
    moment, five texts in turn, as ``add`` does (a change set that skips a text already stored). Before the adds took
    an advisory lock on (scope, text) on PostgreSQL, its READ COMMITTED check-then-insert stored 2 to 4 copies."""
    stores = [MemoryStore(db_url) for _ in range(WRITERS)]
    for store in stores:
        store.list(SCOPE)  # the engines and the schema first: the adds race, not the first use
    barrier = threading.Barrier(WRITERS)
    added = [0] * WRITERS
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for round_ in range(ROUNDS):
                barrier.wait()
                applied = stores[i].apply(ChangeSet(SCOPE, adds=(NewMemory(f"I really like coffee {round_}"),)))
                added[i] += len(applied.added)
        except BaseException as exc:  # reported below; a thread cannot raise into the test
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    texts = [m.text for m in stores[0].list(SCOPE)]
    assert sorted(texts) == [f"I really like coffee {r}" for r in range(ROUNDS)]
    assert sum(added) == ROUNDS
    for store in stores:
        store.close()


def test_the_guard_keeps_plain_adds_and_other_scopes_apart(db_url: str) -> None:
    """The guard is for change sets that skip duplicates: ``MemoryStore.add`` still stores a text twice on purpose,
    and the same text in another scope is another memory."""
    with MemoryStore(db_url) as store:
        store.add("I really like coffee", SCOPE)
        store.add("I really like coffee", SCOPE)
        other = store.apply(ChangeSet(Scope(user_id="u2"), adds=(NewMemory("I really like coffee"),)))
        again = store.apply(ChangeSet(SCOPE, adds=(NewMemory("I really like coffee"),)))
        assert len(store.list(SCOPE)) == 2
        assert len(other.added) == 1
        assert again.added == []


PROCESSES = 3
UPDATES = 10


@pytest.mark.slow  # three Python processes (the storage layer only, no torch): about 3 s on two cores
def test_processes_sharing_one_new_database_stay_consistent(db_url: str) -> None:
    """Three processes share one new database (a SQLite file; a PostgreSQL schema), each phase started at once in all:

    - first use: each opens a memory store and a key store and adds a fact: all succeed, both schemas at their head
      (before the schema lock, PostgreSQL raised IntegrityError from CREATE TABLE in all but one);
    - duplicates: all add the same five texts, each at once: each text is stored once;
    - updates: all update the memory of the first text ten times: every acknowledged update has one UPDATE row, the
      rows form one chain (each old text is the previous row's new text, times never go back, each process's
      updates in its order), and the memory holds the last row's text and time.
    """
    texts = [f"I really like coffee {r}" for r in range(ROUNDS)]
    reports = run_workers(share_new_database, PROCESSES, lambda i: (i, texts, UPDATES), db_url)
    engine = make_engine(db_url)
    assert revisions(engine) == HEADS
    engine.dispose()
    with MemoryStore(db_url) as store:
        firsts = sorted(m.id for m in store.list(FIRST_SCOPE))
        assert firsts == sorted(r["first"] for r in reports)
        assert len(firsts) == PROCESSES
        assert sum(r["stored"] for r in reports) == ROUNDS
        (memory_id,) = {r["memory_id"] for r in reports}
        final = store.get(memory_id)
        rows = store.history(memory_id)
        stored = [m.text for m in store.list(SCOPE)]
    assert final is not None
    assert sorted(stored) == sorted([*texts[1:], final.text])
    assert [r.event for r in rows] == ["ADD"] + ["UPDATE"] * (PROCESSES * UPDATES)
    updates = rows[1:]
    acknowledged = [r["acknowledged"] for r in reports]
    assert sorted(r.new_text or "" for r in updates) == sorted(t for texts in acknowledged for t in texts)
    assert [r.old_text for r in updates] == [r.new_text for r in rows[:-1]]
    assert [r.created_at for r in rows] == sorted(r.created_at for r in rows)
    for own in acknowledged:
        assert [r.new_text for r in updates if r.new_text in own] == own
    assert (final.text, final.updated_at) == (updates[-1].new_text, updates[-1].created_at)
