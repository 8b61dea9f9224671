"""SQLite files shared by several stores at once: WAL is switched once per file (storage.database.enable_wal)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from inferscale.scope import Scope
from inferscale.storage import MemoryStore

ALICE = Scope(user_id="alice")


def test_stores_opening_one_new_sqlite_file_at_once_never_see_a_locked_database(tmp_path: Path) -> None:
    """Four stores open the same new file at the same moment, then write and read. Before WAL was switched once per
    file (storage.database.enable_wal), each connection switched it and one could get "database is locked" from the
    pragma itself: 6 of 30 rounds failed. Thirty rounds, so that the old race would show with near certainty."""
    for round_ in range(30):
        url = f"sqlite:///{tmp_path}/round{round_}/memory.db"
        barrier = threading.Barrier(4)
        errors: list[BaseException] = []

        def work(
            worker: int, url: str = url, barrier: threading.Barrier = barrier, errors: list[BaseException] = errors
        ) -> None:
            store = MemoryStore(url)
            barrier.wait()
            try:
                for i in range(3):
                    store.add(f"fact {worker}.{i}", ALICE)
                    store.list(ALICE)
            except BaseException as exc:  # reported below; a thread cannot raise into the test
                errors.append(exc)
            finally:
                store.close()

        threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert errors == [], f"round {round_}: {errors}"
        with MemoryStore(url) as check:
            assert len(check.list(ALICE)) == 12


def _switch_after(barrier: Any, path: str, results: Any) -> None:
    from inferscale.errors import ConfigError
    from inferscale.storage.database import enable_wal

    barrier.wait()
    try:
        enable_wal(Path(path))
        results.put("ok")
    except ConfigError as exc:
        results.put(str(exc))


def test_processes_switching_one_new_file_at_once_all_succeed(tmp_path: Path) -> None:
    """Two processes opening one new file at once (tests/api/test_concurrency.py's two workers, in a loaded run):
    SQLite refused one switch at once with "database is locked" (no busy wait while the other process held the
    file's lock mid-switch). Four processes start the switch together, twenty times; every switch must succeed."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    failures = []
    for round_ in range(20):
        path = tmp_path / f"memory-{round_}.db"
        barrier, results = ctx.Barrier(4), ctx.Queue()
        procs = [ctx.Process(target=_switch_after, args=(barrier, str(path), results)) for _ in range(4)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(timeout=60)
        failures += [r for r in (results.get(timeout=5) for _ in procs) if r != "ok"]
    assert failures == []
