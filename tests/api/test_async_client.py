"""AsyncMemoryClient: the Mem0 API as coroutines on async SQLAlchemy (aiosqlite / psycopg async), on SQLite and
PostgreSQL, with fakes. Also: concurrent tasks interleave (SQL is awaited, CPU work runs in threads)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

pytest.importorskip("aiosqlite", reason="the async client needs aiosqlite (pip install aiosqlite)")
pytest.importorskip("greenlet", reason="async SQLAlchemy needs greenlet (pip install 'sqlalchemy[asyncio]')")

from mem0_fakes import (
    HashEmbedder,
    ScriptedGenerator,
    facts,
    fake_config,
    shown_memories,
)

from inferscale import AsyncMemory, AsyncMemoryClient
from inferscale.errors import InvalidInputError, MemoryNotFoundError, ScopeError
from inferscale.storage.async_store import async_url


def make(tmp_path: Path, db_url: str, generator: ScriptedGenerator | None = None) -> AsyncMemoryClient:
    return AsyncMemory(
        fake_config(tmp_path, db_url), embedder=HashEmbedder(), generator=generator or ScriptedGenerator()
    )


def texts(results: dict[str, list[dict[str, object]]]) -> list[object]:
    return [r["memory"] for r in results["results"]]


def test_async_url_maps_drivers() -> None:
    assert async_url("sqlite:////tmp/m.db") == "sqlite+aiosqlite:////tmp/m.db"
    assert async_url("postgresql://u@h/db") == "postgresql+psycopg://u@h/db"
    assert async_url("postgresql+psycopg://u@h/db") == "postgresql+psycopg://u@h/db"
    assert async_url("postgresql+asyncpg://u@h/db") == "postgresql+asyncpg://u@h/db"


def test_async_api_round_trip(tmp_path: Path, db_url: str) -> None:
    async def scenario() -> None:
        async with make(tmp_path, db_url) as m:
            a = (await m.add("Likes chess", user_id="alice", metadata={"kind": "game"}, infer=False))["results"]
            await m.add("Likes tennis", user_id="bob", infer=False)
            assert texts(await m.search("chess", user_id="alice", limit=1)) == ["Likes chess"]
            assert texts(await m.search("chess", filters={"user_id": "alice"}, top_k=1)) == ["Likes chess"]
            assert texts(await m.get_all(filters={"AND": [{"user_id": "alice"}, {"kind": "game"}]})) == ["Likes chess"]
            assert (await m.get_all(user_id="alice", filters={"kind": "sport"}))["results"] == []
            memory_id = a[0]["id"]
            assert (await m.get(memory_id))["memory"] == "Likes chess"  # type: ignore[index]
            await m.update(memory_id, data="Likes chess and go")
            assert texts(await m.search("go", user_id="alice", limit=1)) == ["Likes chess and go"]
            await m.delete(memory_id)
            assert await m.get(memory_id) is None
            rows = await m.history(memory_id)
            assert [r["event"] for r in rows] == ["ADD", "UPDATE", "DELETE"]
            assert rows[-1]["old_memory"] == "Likes chess and go"
            with pytest.raises(MemoryNotFoundError):
                await m.delete(memory_id)
            with pytest.raises(ScopeError):
                await m.delete_all()
            with pytest.raises(ScopeError):
                await m.search("x")
            with pytest.raises(InvalidInputError):
                await m.add("x", user_id="a", metadata={"agent_id": "g"}, infer=False)
            assert (await m.delete_all(user_id="bob"))["deleted"] == 1
            await m.reset()
            await m.add("Likes go", user_id="alice", infer=False)
            assert texts(await m.get_all(user_id="alice")) == ["Likes go"]

    asyncio.run(scenario())


def test_async_reconcile_update_and_unknown_id(tmp_path: Path, db_url: str) -> None:
    def update(messages: list[dict[str, str]]) -> str:
        shown = shown_memories(messages)
        lisbon = next(s["id"] for s in shown if s["text"] == "Lives in Lisbon")
        return json.dumps(
            {
                "memory": [
                    {"id": lisbon, "text": "Lives in Porto", "event": "UPDATE", "old_memory": "Lives in Lisbon"},
                    {"id": "9", "text": "x", "event": "DELETE"},
                ]
            }
        )

    gen = ScriptedGenerator(facts=[facts("Lives in Lisbon"), facts("Lives in Porto")], decisions=update)

    async def scenario() -> None:
        async with make(tmp_path, db_url, gen) as m:
            first = (await m.add("I live in Lisbon", user_id="u"))["results"]
            second = (await m.add("I moved to Porto", user_id="u"))["results"]
            assert [(r["id"], r["event"]) for r in second] == [(first[0]["id"], "UPDATE")]
            assert texts(await m.get_all(user_id="u")) == ["Lives in Porto"]

    asyncio.run(scenario())


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
