"""The async client's model work (generation, LLM extraction, K/V encoding) runs on threads of its own, so a search,
which needs a thread for milliseconds, never waits behind it. Before, both shared the event loop's default executor
(6 threads on a 2-core machine): a search waited 2.9 s behind 3 s extractions (a review's reproducer)."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from mem0_fakes import HashEmbedder, ScriptedGenerator, facts, fake_config

from inferscale import AsyncMemoryClient, MemoryClient, async_client
from inferscale.worker_threads import MODEL_WORK_THREADS

DEFAULT_EXECUTOR_THREADS = 2
MODEL_CALLS = 4  # more than the default executor holds, fewer than the model threads
WAIT_S = 10.0  # a bound for a failing run only: a passing one never waits for it

assert DEFAULT_EXECUTOR_THREADS < MODEL_CALLS <= MODEL_WORK_THREADS


class Gate:
    """Model calls wait here until released, counting those that began."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self._began = 0
        self._lock = threading.Lock()

    def enter(self) -> None:
        with self._lock:
            self._began += 1
        if not self.released.wait(30):
            raise TimeoutError("the test never released the model calls")

    @property
    def began(self) -> int:
        with self._lock:
            return self._began


class BlockingExtraction(ScriptedGenerator):
    """Extracts one fact per call after waiting at the gate, as an LLM decoding for seconds would."""

    def __init__(self, gate: Gate) -> None:
        super().__init__(facts=facts("Maya plays chess on Sundays."))
        self._gate = gate

    def generate_json(self, messages: list[dict[str, str]], schema: dict[str, Any], max_new_tokens: int) -> str:
        self._gate.enter()
        return super().generate_json(messages, schema, max_new_tokens)


class LoadedEngine:
    """The engine's load, the one engine call a chat makes before generating (``_generate`` is replaced below)."""

    def load(self) -> None:
        return None


async def began(gate: Gate, count: int) -> bool:
    """Whether ``count`` model calls began within :data:`WAIT_S`."""
    deadline = time.monotonic() + WAIT_S
    while gate.began < count and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return gate.began >= count


async def search_beside(client: AsyncMemoryClient, gate: Gate, model_calls: list[asyncio.Future[Any]]) -> list[str]:
    """The memories a search finds while ``model_calls`` wait at the gate, once the default executor could be full;
    then every model call released and awaited."""
    try:
        assert await began(gate, DEFAULT_EXECUTOR_THREADS)
        hits = await asyncio.wait_for(client.search("Where does Maya live?", user_id="maya"), WAIT_S)
        assert await began(gate, MODEL_CALLS)  # they run at once, not one per free default thread
        return [hit["memory"] for hit in hits["results"]]
    finally:
        gate.released.set()
        await asyncio.gather(*model_calls, return_exceptions=True)


def test_a_search_answers_while_extractions_hold_more_threads_than_the_default_executor(
    tmp_path: Path, db_url: str
) -> None:
    gate = Gate()

    async def scenario() -> list[str]:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(DEFAULT_EXECUTOR_THREADS))
        config = fake_config(tmp_path, db_url)
        async with AsyncMemoryClient(config, embedder=HashEmbedder(), generator=BlockingExtraction(gate)) as client:
            await client.add("Maya lives in Porto.", user_id="maya", infer=False)
            adds = [asyncio.ensure_future(client.add(f"turn {i}", user_id=f"user-{i}")) for i in range(MODEL_CALLS)]
            return await search_beside(client, gate, adds)

    assert asyncio.run(scenario()) == ["Maya lives in Porto."]


def test_a_search_answers_while_chats_generate_on_more_threads_than_the_default_executor(
    tmp_path: Path, db_url: str
) -> None:
    gate = Gate()

    def generating(*args: Any) -> None:
        gate.enter()

    async def scenario() -> list[str]:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(DEFAULT_EXECUTOR_THREADS))
        config = fake_config(tmp_path, db_url)
        async with AsyncMemoryClient(config, embedder=HashEmbedder()) as writer:  # the model's tokenizer fits it
            await writer.add("Maya lives in Porto.", user_id="maya", infer=False)
        engine: Any = LoadedEngine()
        async with AsyncMemoryClient(config, engine=engine, embedder=HashEmbedder()) as client:
            client._generate = generating  # type: ignore[method-assign]  # stands for decoding
            chats = [asyncio.ensure_future(client.chat("Hi", user_id="maya")) for _ in range(MODEL_CALLS)]
            return await search_beside(client, gate, chats)

    assert asyncio.run(scenario()) == ["Maya lives in Porto."]


def test_a_search_answers_while_k_v_encodings_hold_more_threads_than_the_default_executor(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``memory_kv`` and ``prepare_kv`` encode the K/V they lack: model work too."""
    gate = Gate()

    def encoding(*args: Any) -> list[Any]:
        gate.enter()
        return []

    async def scenario() -> list[str]:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(DEFAULT_EXECUTOR_THREADS))
        async with AsyncMemoryClient(fake_config(tmp_path, db_url), embedder=HashEmbedder()) as client:
            added = await client.add("Maya lives in Porto.", user_id="maya", infer=False)
            monkeypatch.setattr(client.derived, "memory_kv", encoding)
            monkeypatch.setattr(async_client, "prepare_kv", encoding)
            memory_id = added["results"][0]["id"]
            half = MODEL_CALLS // 2
            encodings = [asyncio.ensure_future(client.memory_kv([memory_id])) for _ in range(half)]
            encodings += [asyncio.ensure_future(client.prepare_kv(user_id="maya")) for _ in range(MODEL_CALLS - half)]
            return await search_beside(client, gate, encodings)

    assert asyncio.run(scenario()) == ["Maya lives in Porto."]


def test_the_first_search_loads_the_index_and_embeds_what_it_lacks_on_a_model_thread(
    tmp_path: Path, db_url: str
) -> None:
    """A client's first use of the index loads it (and the embedder) and embeds every memory it lacks: seconds of
    model work, which ran on the default executor (a review) while reconcile(), the same work, ran on model threads."""
    config = fake_config(tmp_path, db_url)
    with MemoryClient(config, embedder=HashEmbedder()) as writer:
        writer.add([{"role": "user", "content": f"Maya note {i}."} for i in range(20)], user_id="maya", infer=False)
    (tmp_path / "index.faiss").unlink(missing_ok=True)  # lost: the first search embeds all 20 again
    release = threading.Event()

    async def first_search_beside_a_full_default_executor() -> int:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(1))
        busy = loop.run_in_executor(None, release.wait, 30)
        async with AsyncMemoryClient(config, embedder=HashEmbedder()) as client:
            try:
                hits = await asyncio.wait_for(client.search("Maya note", user_id="maya", limit=20), WAIT_S)
            finally:  # before the client closes: close() releases its files on the default executor
                release.set()
                await busy
            return len(hits["results"])

    assert asyncio.run(first_search_beside_a_full_default_executor()) == 20
