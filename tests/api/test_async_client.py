"""What only the async client has: async drivers for the database URL, and concurrent tasks that interleave (SQL is
awaited, CPU work runs in threads). Its Mem0 API runs with the sync client's in test_memory_api.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

from event_loops import run_on_own_loops
from mem0_fakes import HashEmbedder, ScriptedGenerator, fake_config

from inferscale import AsyncMemory, AsyncMemoryClient
from inferscale.scope import Scope
from inferscale.storage.async_sessions import LoopSessions, ThreadSessions, session_runner, session_url


def make(tmp_path: Path, db_url: str, generator: ScriptedGenerator | None = None) -> AsyncMemoryClient:
    return AsyncMemory(
        fake_config(tmp_path, db_url), embedder=HashEmbedder(), generator=generator or ScriptedGenerator()
    )


def test_session_url_maps_drivers() -> None:
    assert session_url("sqlite:////tmp/m.db") == "sqlite:////tmp/m.db"  # SQLite runs on worker threads
    assert session_url("sqlite+aiosqlite:////tmp/m.db") == "sqlite:////tmp/m.db"
    assert session_url("postgresql://u@h/db") == "postgresql+psycopg://u@h/db"
    assert session_url("postgresql+psycopg://u@h/db") == "postgresql+psycopg://u@h/db"
    assert session_url("postgresql+asyncpg://u@h/db") == "postgresql+asyncpg://u@h/db"
    assert isinstance(session_runner("sqlite:////tmp/m.db"), ThreadSessions)
    assert isinstance(session_runner("sqlite+aiosqlite://"), ThreadSessions)
    assert isinstance(session_runner("postgresql://u@h/db"), LoopSessions)


def test_an_in_memory_database_is_one_for_the_async_store_and_the_sync_one(tmp_path: Path) -> None:
    """The async client's SQL store and its sync one (which the index, the K/V bookkeeping and the background encoder
    read) had an engine each: on ``sqlite://`` two databases, so the sync side never saw an async add."""

    async def add_then_read() -> list[str]:
        async with make(tmp_path, "sqlite://") as client:
            await client.add("I live in Porto.", user_id="maya", infer=False)
            found = await client.search("Where do I live?", user_id="maya")
            assert [m["memory"] for m in found["results"]] == ["I live in Porto."]
            return [m.text for m in client.db.list(Scope(user_id="maya"))]

    assert asyncio.run(add_then_read()) == ["I live in Porto."]


def test_concurrent_tasks_interleave(tmp_path: Path) -> None:
    """Many adds and reads as concurrent tasks on one SQLite file; a ticker task keeps running meanwhile."""
    db_url = f"sqlite:///{tmp_path}/memory.db"

    async def scenario() -> None:
        async with make(tmp_path, db_url) as m:
            ticks = 0
            done = asyncio.Event()

            async def ticker() -> None:
                nonlocal ticks
                while not done.is_set():
                    ticks += 1
                    await asyncio.sleep(0)

            async def writer(i: int) -> None:
                await m.add(f"fact {i} about the sea", user_id="shared", infer=False)
                await m.search(f"fact {i}", user_id="shared", limit=2)

            tick = asyncio.create_task(ticker())
            await asyncio.gather(*(writer(i) for i in range(20)))
            done.set()
            await tick
            assert ticks > 20
            stored = (await m.get_all(user_id="shared"))["results"]
            assert len(stored) == 20
            for memory in stored:
                assert [r["event"] for r in await m.history(memory["id"])] == ["ADD"]

    asyncio.run(scenario())


def test_one_client_serves_several_event_loops_whose_first_calls_overlap(tmp_path: Path, db_url: str) -> None:
    """The store created its engine under an asyncio.Lock, which binds to the first loop that waits on it: after
    ``close()``, a second ``asyncio.run`` whose first calls overlapped raised "bound to a different event loop", and
    threads each running their own loop with overlapping first calls hung for good (tester report). With one engine
    for all loops, threads whose calls outnumbered its pool (5 connections) raised the same from the pool's queue."""
    m = make(tmp_path, db_url)

    async def adds(tag: str) -> list[str]:
        done = await asyncio.gather(*(m.add(f"{tag} fact {i}", user_id="u", infer=False) for i in range(4)))
        await m.close()
        return [r["results"][0]["event"] for r in done]

    assert asyncio.run(adds("first")) == ["ADD"] * 4
    assert asyncio.run(adds("second")) == ["ADD"] * 4  # a new loop after close(), as a test runner makes per test

    async def reads_then_add(i: int) -> object:
        await asyncio.gather(*(m.get_all(user_id="u") for _ in range(8)))  # more than the pool's 5 connections
        return (await m.add(f"thread {i} fact", user_id="u", infer=False))["results"][0]["event"]

    assert run_on_own_loops(reads_then_add, 4) == dict.fromkeys(range(4), "ADD")

    async def count() -> int:
        async with make(tmp_path, db_url) as again:
            return len((await again.get_all(user_id="u"))["results"])

    assert asyncio.run(count()) == 12
