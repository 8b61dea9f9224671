"""An async call cancelled at any point never leaves a transaction open. On SQLite through aiosqlite, a cancellation
that landed inside the commit, the rollback or the pool's reset of a returned connection left that connection in its
transaction: SQLite's write lock stayed held, and every other writer failed after the busy timeout until the garbage
collector found the connection (6 of 8 runs of 300 randomly cancelled writes). SQLite's sessions now run on worker
threads, which a cancellation does not stop halfway (storage.async_sessions); those threads never wait behind the
event loop's other work, and a forked child gets threads of its own."""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from mem0_fakes import HashEmbedder, fake_config
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlite_lock import write_lock_is_free

from inferscale import AsyncMemoryClient
from inferscale.scope import Scope
from inferscale.server.keys import KeyStore
from inferscale.storage import MemoryStore
from inferscale.storage.async_sessions import SQLITE_READ_THREADS
from inferscale.storage.async_store import AsyncMemoryStore

MAYA = Scope(user_id="maya")
CANCELLED_WRITES = 600


def no_transaction_is_open(url: str) -> bool:
    """Whether no connection is left inside a transaction on the memories table: SQLite's write lock can be taken,
    or PostgreSQL's ``ACCESS EXCLUSIVE`` lock on the table can (it conflicts with every open transaction that read
    or wrote it), within half a second on both. A transaction left open holds its lock until the garbage collector
    finds its connection; a COMMIT that a write had sent before it was cancelled ends on the server a few
    milliseconds after the call returns (the PostgreSQL check took the lock without waiting, and failed 1 run in 4:
    each time the connection was idle after its COMMIT milliseconds later, as docs/api.md describes)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        assert parsed.database is not None
        return write_lock_is_free(parsed.database)
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("set local lock_timeout = '500ms'"))
            conn.execute(text("lock table memories in access exclusive mode"))
        return True
    except OperationalError:
        return False
    finally:
        engine.dispose()


async def _cancel_writes_at_random(client: AsyncMemoryClient, url: str, seed: int) -> int | None:
    """Writes (adds and deletes) each cancelled 0-30 ms after it began, by ``wait_for``'s timeout or by
    ``Task.cancel``; the index of the first write after which a transaction stayed open, or ``None``."""
    rng = random.Random(seed)
    for i in range(CANCELLED_WRITES):
        if i % 3 == 2:
            write = client.delete_all(user_id="maya")
        else:
            write = client.add(f"fact {i} about green tea", user_id="maya", infer=False)
        task = asyncio.ensure_future(write)
        if i % 2:
            await asyncio.wait({task}, timeout=rng.uniform(0, 0.03))
        else:
            await asyncio.sleep(rng.uniform(0, 0.03))
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if not no_transaction_is_open(url):
            return i
    return None


def test_randomly_cancelled_writes_never_leave_a_transaction_open(db_url: str, tmp_path: Path) -> None:
    async def run() -> int | None:
        async with AsyncMemoryClient(fake_config(tmp_path, db_url), embedder=HashEmbedder()) as client:
            await client.add("seed fact", user_id="maya", infer=False)
            held_after = await _cancel_writes_at_random(client, db_url, seed=5)
            await client.add("after the cancellations", user_id="maya", infer=False)  # writes still go through
            return held_after

    assert asyncio.run(run()) is None
    assert no_transaction_is_open(db_url)


def test_transactions_still_running_when_asyncio_run_ends_are_finished(db_url: str) -> None:
    """``asyncio.run`` cancels the tasks left running: no transaction is left open (shielding the transactions from
    cancellation held SQLite's lock 10 of 10 times here: the loop's end cancelled them anyway), and the store takes
    writes afterwards. On SQLite a write whose session had begun commits, and one still queued is dropped; on
    PostgreSQL a cancelled one rolls back."""
    store = AsyncMemoryStore(db_url)

    async def leave_writes_running() -> None:
        await store.list(MAYA)
        left_running = [asyncio.ensure_future(store.add(f"fact {i}", MAYA)) for i in range(20)]
        await asyncio.sleep(0)  # each task runs to its first await: its session is queued
        assert not all(write.done() for write in left_running)

    asyncio.run(leave_writes_running())
    asyncio.run(store.close())  # on SQLite, after the writes queued before it
    assert no_transaction_is_open(db_url)
    with MemoryStore(db_url) as check:
        stored = check.list(MAYA)
        assert {m.text for m in stored} <= {f"fact {i}" for i in range(20)}
        check.add("a write after the loop ended", MAYA)


def test_a_cancelled_close_leaves_no_transaction_open(db_url: str) -> None:
    store = AsyncMemoryStore(db_url)

    async def close_cancelled_during_writes() -> None:
        await store.list(MAYA)
        writes = [asyncio.ensure_future(store.add(f"fact {i}", MAYA)) for i in range(10)]
        await asyncio.sleep(0.001)
        closing = asyncio.ensure_future(store.close())
        await asyncio.sleep(0)
        closing.cancel()
        await asyncio.gather(closing, *writes, return_exceptions=True)

    asyncio.run(close_cancelled_during_writes())
    asyncio.run(store.close())
    assert no_transaction_is_open(db_url)
    assert len(asyncio.run(store.list(MAYA))) == 10  # every write ran to its end; the store reopens after close()
    asyncio.run(store.close())


def test_sqlite_sessions_do_not_wait_for_the_event_loops_busy_worker_threads(tmp_path: Path) -> None:
    """The async client generates, embeds and encodes on the event loop's default executor: with every one of its
    threads busy (a chat generating for seconds), a SQLite read still runs."""
    store = AsyncMemoryStore(f"sqlite:///{tmp_path}/m.db")
    release = threading.Event()

    async def read_while_the_default_executor_is_busy() -> list[str]:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=2))
        busy = [loop.run_in_executor(None, release.wait, 30) for _ in range(2)]
        try:
            await asyncio.wait_for(store.add("written meanwhile", MAYA), timeout=10)
            return [m.text for m in await asyncio.wait_for(store.list(MAYA), timeout=10)]
        finally:
            release.set()
            await asyncio.gather(*busy)
            await store.close()

    assert asyncio.run(read_while_the_default_executor_is_busy()) == ["written meanwhile"]


@pytest.mark.parametrize("url", ["sqlite+aiosqlite:///{tmp}/m.db", "sqlite:///{tmp}/m.db"])
def test_sqlite_in_either_form_is_one_database_for_every_event_loop(url: str, tmp_path: Path) -> None:
    store = AsyncMemoryStore(url.format(tmp=tmp_path))
    assert store.url == f"sqlite:///{tmp_path}/m.db"
    asyncio.run(store.add("written in the first loop", MAYA))
    assert [m.text for m in asyncio.run(store.list(MAYA))] == ["written in the first loop"]
    assert asyncio.run(store.dialect()) == "sqlite"
    asyncio.run(store.close())


def test_reads_do_not_wait_for_writes_that_wait_for_another_writers_lock(tmp_path: Path) -> None:
    """Writes queued behind another process's write lock (each waits up to the 10 s busy timeout) held every session
    thread, so a read of that database, or of any other, waited as long: 9.8 s (a review's reproducer)."""
    url = f"sqlite:///{tmp_path}/a.db"
    store, other = AsyncMemoryStore(url), AsyncMemoryStore(f"sqlite:///{tmp_path}/b.db")
    asyncio.run(store.add("stored before the lock was taken", MAYA))
    outsider = sqlite3.connect(tmp_path / "a.db")
    outsider.execute("BEGIN IMMEDIATE")  # another process's writer holds the lock

    async def read_while_writes_wait() -> tuple[list[str], list[str]]:
        waiting = [asyncio.ensure_future(store.add(f"fact {i}", MAYA)) for i in range(SQLITE_READ_THREADS + 2)]
        await asyncio.sleep(0.05)
        try:
            same = await asyncio.wait_for(store.list(MAYA), timeout=2)
            elsewhere = await asyncio.wait_for(other.list(MAYA), timeout=2)
        finally:
            outsider.rollback()
            await asyncio.gather(*waiting)
        return [m.text for m in same], [m.text for m in elsewhere]

    try:
        assert asyncio.run(read_while_writes_wait()) == (["stored before the lock was taken"], [])
    finally:
        outsider.close()
    assert len(asyncio.run(store.list(MAYA))) == SQLITE_READ_THREADS + 3  # the waiting writes went through after


def test_concurrent_sessions_on_an_in_memory_database_take_turns() -> None:
    """An in-memory database is one connection: sessions on several threads interleaved their transactions, so some
    writes failed ("cannot start a transaction within a transaction") and some that raised were stored anyway."""
    store = AsyncMemoryStore("sqlite://")

    async def add_at_once() -> list[BaseException | object]:
        writes = [store.add(f"fact {i}", MAYA) for i in range(50)]
        reads = [store.list(MAYA) for _ in range(20)]
        return await asyncio.gather(*writes, *reads, return_exceptions=True)

    outcomes = asyncio.run(add_at_once())
    assert [o for o in outcomes if isinstance(o, BaseException)] == []
    assert sorted(m.text for m in asyncio.run(store.list(MAYA))) == sorted(f"fact {i}" for i in range(50))

    sync_store = MemoryStore("sqlite://")
    with ThreadPoolExecutor(max_workers=8) as threads:
        added = list(threads.map(lambda i: sync_store.add(f"fact {i}", MAYA).text, range(50)))
    assert sorted(m.text for m in sync_store.list(MAYA)) == sorted(added)

    keys = KeyStore("sqlite://")  # every store whose sessions are guarded takes turns, the key store too
    with ThreadPoolExecutor(max_workers=8) as threads:
        created = list(threads.map(lambda i: keys.create(f"app {i}", user_ids=[f"u{i}"])[0].key_id, range(50)))
    assert sorted(key.key_id for key in keys.list()) == sorted(created)


def test_an_in_memory_sqlite_store_is_shared_by_its_event_loops() -> None:
    """One in-memory database per store (through aiosqlite, each event loop had an empty database of its own)."""
    store = AsyncMemoryStore("sqlite://")
    asyncio.run(store.add("kept between loops", MAYA))
    assert [m.text for m in asyncio.run(store.list(MAYA))] == ["kept between loops"]


def _count_in_a_forked_child(url: str, results: Any) -> None:
    async def add_and_count() -> int:
        store = AsyncMemoryStore(url)
        await store.add("written in the child", MAYA)
        count = len(await store.list(MAYA))
        await store.close()
        return count

    results.put(asyncio.run(add_and_count()))


def test_a_forked_child_runs_its_own_sqlite_sessions(tmp_path: Path) -> None:
    """The session threads are the process's: a child forked after the parent had used them got the parent's pool,
    which counted the parent's threads (absent in the child) as idle and never ran a session (the child hung)."""
    url = f"sqlite:///{tmp_path}/m.db"
    asyncio.run(AsyncMemoryStore(url).add("written in the parent", MAYA))  # the parent's session threads started
    fork = multiprocessing.get_context("fork")
    results = fork.Queue()
    child = fork.Process(target=_count_in_a_forked_child, args=(url, results))
    child.start()
    child.join(timeout=60)
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0 and results.get(timeout=5) == 2
