"""Lock order between a K/V entry's write and ``reset`` on PostgreSQL. The write locks its memory's row
(``FOR UPDATE``, to check the text and context it was encoded from) and then its ``kv_entries`` row; ``reset`` deleted
every ``kv_entries`` row before the memories, so a write holding its memory while ``reset`` held its entry waited
for each other, and PostgreSQL aborted one with a bare ``DeadlockDetected`` (a review's find). ``reset`` now locks
the memory rows first, as every other writer does, and waits for the write instead. A transaction of the test's own
stands for the write, held at the point between its two locks; ``reset`` runs on a thread until it waits on it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select, text, update
from sqlalchemy.orm import Session

from inferscale.scope import Scope
from inferscale.storage import MemoryStore
from inferscale.storage.models import KVEntryRow, MemoryRow

WAIT_S = 30.0
"""The most the test waits for ``reset`` to queue behind the write (seconds); it takes milliseconds."""


@pytest.fixture
def store(db_url: str) -> Iterator[MemoryStore]:
    if not db_url.startswith("postgresql"):
        pytest.skip("row locks are PostgreSQL's: SQLite's write transaction holds the whole database")
    opened = MemoryStore(db_url)
    yield opened
    opened.close()


def _blocked_by(store: MemoryStore, pid: int) -> int:
    """How many sessions wait on a lock backend ``pid`` holds (a transaction of its own: PostgreSQL keeps one
    snapshot of ``pg_stat_activity`` per transaction)."""
    with store.engine.connect() as watch:
        query = text("SELECT count(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))")
        return int(watch.scalar(query, {"pid": pid}) or 0)


def test_reset_waits_for_a_kv_write_holding_its_memory_instead_of_deadlocking(store: MemoryStore) -> None:
    memory = store.add("My dog is Rex.", Scope(user_id="alice"))
    store.put_kv_entry(memory.id, memory.hash, "fp", "w0", 4, 64, "/kv/1")
    outcome: list[Any] = []

    def reset() -> None:
        try:
            outcome.append(store.reset())
        except Exception as exc:  # the deadlock, reported below
            outcome.append(exc)

    with Session(store.engine) as write:
        with write.begin():
            write.execute(select(MemoryRow.pk).where(MemoryRow.id == memory.id).with_for_update())
            pid = int(write.scalar(text("SELECT pg_backend_pid()")))
            resetting = threading.Thread(target=reset)
            resetting.start()
            deadline = time.monotonic() + WAIT_S
            while not _blocked_by(store, pid) and time.monotonic() < deadline and resetting.is_alive():
                time.sleep(0.01)
            write.execute(update(KVEntryRow).where(KVEntryRow.memory_id == memory.id).values(n_tokens=5))
        resetting.join(WAIT_S)
    assert outcome == [[memory.id]]
    assert store.get(memory.id) is None and store.all_kv_entries() == []
