"""The clients' shared orchestration (inferscale.derived): recall, memory_kv, metadata-only updates, close."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any, ClassVar, cast

import numpy as np
import pytest
import torch
from served_kv import fresh_as_served

import inferscale.engines.transformers as transformers_engines
import inferscale.memory
from inferscale import AsyncMemoryClient, EngineClosedError, MemoryClient, MemoryConfig
from inferscale.config import EngineConfig, KVConfig
from inferscale.engines.base import Engine
from inferscale.engines.transformers import TransformersEngine

FACTS = [
    {"role": "user", "content": "I have a beagle named Biscuit."},
    {"role": "user", "content": "My sister Ana lives in Lisbon."},
    {"role": "user", "content": "I play chess on Sundays."},
]


class CountingEmbedder:
    """Wraps an embedder and counts the texts it embeds."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.texts: list[str] = []

    @property
    def dim(self) -> int:
        return int(self.inner.dim)

    def embed(self, texts: list[str]) -> np.ndarray:
        self.texts.extend(texts)
        return self.inner.embed(texts)


def _config(tmp_path: Path) -> MemoryConfig:
    return MemoryConfig(data_dir=str(tmp_path), engine=EngineConfig(max_new_tokens=4))


@pytest.mark.slow
def test_recall_returns_the_records_and_scores_search_returns(tmp_path: Path, embedder: Any) -> None:
    with MemoryClient(_config(tmp_path), embedder=embedder) as client:
        client.add(FACTS, user_id="maya", infer=False, encode_kv=False)
        client.add("I have a cat named Tom.", user_id="other", infer=False, encode_kv=False)
        searched = client.search("What is my dog called?", user_id="maya", limit=2)["results"]
        recalled = client.recall("What is my dog called?", user_id="maya", limit=2)
    assert [r.record.id for r in recalled] == [r["id"] for r in searched]
    assert [r.score for r in recalled] == pytest.approx([r["score"] for r in searched], abs=1e-6)
    assert recalled[0].record.text == "I have a beagle named Biscuit."
    assert all(r.record.user_id == "maya" for r in recalled)


@pytest.mark.slow
def test_async_recall_equals_sync_recall(tmp_path: Path, embedder: Any) -> None:
    with MemoryClient(_config(tmp_path), embedder=embedder) as client:
        client.add(FACTS, user_id="maya", infer=False, encode_kv=False)
        expected = client.recall("Where does Ana live?", user_id="maya", limit=3, threshold=0.0)

    async def recall() -> list[Any]:
        async with AsyncMemoryClient(_config(tmp_path), embedder=embedder) as aclient:
            return await aclient.recall("Where does Ana live?", user_id="maya", limit=3, threshold=0.0)

    got = asyncio.run(recall())
    assert [r.record for r in got] == [r.record for r in expected]
    assert [r.score for r in got] == pytest.approx([r.score for r in expected], abs=1e-6)


@pytest.mark.slow
def test_metadata_only_update_neither_re_embeds_nor_drops_kv(tmp_path: Path, embedder: Any) -> None:
    counting = CountingEmbedder(embedder)
    with MemoryClient(_config(tmp_path), embedder=counting) as client:
        memory_id = client.add(FACTS[:1], user_id="maya", infer=False, encode_kv=False)["results"][0]["id"]
        client.index  # noqa: B018  (loads the index)
        embedded = len(counting.texts)
        client.update(memory_id, metadata={"topic": "pets"})
        assert len(counting.texts) == embedded
        assert client.get(memory_id)["metadata"] == {"topic": "pets"}  # replaced whole, as Mem0 does
        client.update(memory_id, text="I have a beagle named Cookie.")
        assert counting.texts[embedded:] == ["I have a beagle named Cookie."]


@pytest.mark.slow
def test_metadata_only_update_keeps_the_stored_kv(tmp_path: Path, smollm2_fp32: tuple[Any, Any], embedder: Any) -> None:
    model, tokenizer = smollm2_fp32
    config = _config(tmp_path)
    engine = TransformersEngine(
        EngineConfig(dtype="float32", device="cpu"), config.system_prompt, model=model, tokenizer=tokenizer
    )
    with MemoryClient(config, engine=engine, embedder=embedder) as client:
        memory_id = client.add(FACTS[:1], user_id="maya", infer=False, encode_kv=True)["results"][0]["id"]
        record = client.db.get(memory_id)
        assert record is not None
        key = client.fact_kv.key(record)
        before = client.db.get_kv_entry(memory_id, key.fingerprint, key.encoding_key)
        assert before is not None
        client.update(memory_id, metadata={"topic": "pets"})
        assert client.db.get_kv_entry(memory_id, key.fingerprint, key.encoding_key) == before
        client.update(memory_id, text="I have a beagle named Cookie.")
        assert client.db.get_kv_entry(memory_id, key.fingerprint, key.encoding_key) is None


@pytest.mark.slow
def test_memory_kv_equals_a_fresh_encoding(tmp_path: Path, smollm2_fp32: tuple[Any, Any], embedder: Any) -> None:
    model, tokenizer = smollm2_fp32
    config = _config(tmp_path)
    engine = TransformersEngine(
        EngineConfig(dtype="float32", device="cpu"), config.system_prompt, model=model, tokenizer=tokenizer
    )
    with MemoryClient(config, engine=engine, embedder=embedder) as client:
        client.add(FACTS, user_id="maya", infer=False, encode_kv=True)
        records = [r.record for r in client.recall("chess", user_id="maya", limit=3)]
        served = client.memory_kv(records)
        fresh = fresh_as_served(engine, client.fact_kv, records)
    assert len(served) == 3
    for got, want in zip(served, fresh, strict=True):
        assert torch.equal(got.token_ids, want.token_ids)
        assert got.encoded_at == want.encoded_at
        torch.testing.assert_close(got.keys, want.keys, rtol=0, atol=1e-5)
        torch.testing.assert_close(got.values, want.values, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_8bit_storage_serves_chat_the_dequantised_fresh_encoding(
    tmp_path: Path, smollm2_fp32: tuple[Any, Any], embedder: Any
) -> None:
    model, tokenizer = smollm2_fp32
    config = _config(tmp_path).model_copy(update={"kv": KVConfig(storage_format="int8")})
    engine = TransformersEngine(
        EngineConfig(dtype="float32", device="cpu"), config.system_prompt, model=model, tokenizer=tokenizer
    )
    with MemoryClient(config, engine=engine, embedder=embedder) as client:
        client.add(FACTS, user_id="maya", infer=False, encode_kv=True)
        result = client.chat("What do I play on Sundays?", user_id="maya", limit=3, max_new_tokens=4)
        records = [r for r in (client.db.get(memory_id) for memory_id in result.memory_ids) if r is not None]
        served = client.memory_kv(records)
        fresh = fresh_as_served(engine, client.fact_kv, records)
        stats = client.kv_store.stats()
        # add stored every encoding of each memory: two for each with turns (the first message has none)
        every = [client.kv_store.get(client.fact_kv.key(r, e)) for r, e in client.fact_kv.every_encoding(records)]
        reference = engine.generate_kv("What do I play on Sundays?", [f.dequantized() for f in served], 4)
    assert len(served) == 3 and all(f.storage_format == "int8" for f in served)
    assert len(every) == 5 and all(f is not None and f.storage_format == "int8" for f in every)
    assert stats.nbytes["host"] == sum(f.nbytes for f in every if f is not None)  # the budget counts the 8-bit bytes
    for got, want in zip(served, fresh, strict=True):
        quantised = want.quantized("int8")
        assert torch.equal(got.keys, quantised.keys) and torch.equal(got.values, quantised.values)
    assert result.answer == reference.text


class FakeEngine:
    """Stands in for the engine a client builds from its config; records close()."""

    instances: ClassVar[list[FakeEngine]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.closed = 0
        FakeEngine.instances.append(self)

    def close(self) -> None:
        self.closed += 1


def test_close_releases_the_engine_the_client_built_but_not_one_passed_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    FakeEngine.instances.clear()
    monkeypatch.setattr(transformers_engines, "TransformersEngine", FakeEngine)
    client = MemoryClient(_config(tmp_path))
    built = client.engine
    assert isinstance(built, FakeEngine)
    client.close()
    assert built.closed == 1
    client.close()  # a second close has nothing left to release
    assert built.closed == 1

    passed = FakeEngine()
    with MemoryClient(_config(tmp_path), engine=cast(Engine, passed)) as other:
        assert other.engine is passed
    assert passed.closed == 0


def test_async_close_releases_the_engine_the_client_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transformers_engines, "TransformersEngine", FakeEngine)

    async def build_and_close() -> FakeEngine:
        client = AsyncMemoryClient(_config(tmp_path))
        built = client.engine
        await client.close()
        return cast(FakeEngine, built)

    assert asyncio.run(build_and_close()).closed == 1


def test_close_drops_the_local_json_generator_built_on_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default extraction LLM is the engine's own model: close() must drop the generator that holds it, or a
    reused client would extract with the released model while a new engine loads a second copy."""

    class ModelEngine(FakeEngine):
        model, tokenizer, model_lock = object(), object(), threading.RLock()

    class StubGenerator:
        def __init__(self, model: object, tokenizer: object, lock: object = None) -> None:
            self.model = model
            self.lock = lock

    monkeypatch.setattr(transformers_engines, "TransformersEngine", ModelEngine)
    monkeypatch.setattr(inferscale.memory, "TransformersJSONGenerator", StubGenerator)
    client = MemoryClient(_config(tmp_path))
    generator = client._json_generator()
    assert isinstance(generator, StubGenerator) and generator.model is ModelEngine.model
    assert generator.lock is ModelEngine.model_lock  # its decoding holds the engine's lock
    client.close()
    assert client._generator is None and client._engine is None
    passed = StubGenerator(object(), object())
    with MemoryClient(_config(tmp_path), generator=cast(Any, passed)) as other:
        assert other._json_generator() is passed
    assert other._generator is passed  # a generator passed in is left to its owner


class LoadedOnDemand(FakeEngine):
    """An engine the client builds from its config, with the load every chat asks for first."""

    def load(self) -> None:
        return None


class WaitedFor:
    """The client's lock, telling when another thread waits for it."""

    def __init__(self, lock: Any) -> None:
        self._lock = lock
        self.waited = threading.Event()

    def __enter__(self) -> None:
        if not self._lock.acquire(blocking=False):
            self.waited.set()
            self._lock.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self._lock.release()


def test_a_chat_that_waited_while_close_released_the_engine_does_not_build_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chat waiting for the client's lock (another chat opening its answer) when close() released the engine took
    the lock afterwards and built and loaded the model again, for a closed client, before failing (a review)."""
    FakeEngine.instances.clear()
    monkeypatch.setattr(transformers_engines, "TransformersEngine", LoadedOnDemand)
    client = MemoryClient(_config(tmp_path))
    assert isinstance(client.engine, LoadedOnDemand)
    lock = WaitedFor(client._lock)
    client._lock = lock  # type: ignore[assignment]  # the same lock, observed
    raised: list[BaseException] = []

    def chat() -> None:
        try:
            client.chat("Hi", user_id="maya", memory_ids=[])
        except BaseException as exc:  # reported below; a thread cannot raise into the test
            raised.append(exc)

    with lock:  # stands for another chat opening its answer
        waiting = threading.Thread(target=chat)
        waiting.start()
        assert lock.waited.wait(10)
        client.close()  # the same thread holds the lock: close() releases the engine now
    waiting.join(30)
    assert [type(exc) for exc in raised] == [EngineClosedError]
    assert client._engine is None and len(FakeEngine.instances) == 1  # no engine built for the closed client


@pytest.mark.parametrize("stream", [False, True])
def test_an_async_chat_closed_while_it_chose_its_memories_does_not_build_the_engine_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    FakeEngine.instances.clear()
    monkeypatch.setattr(transformers_engines, "TransformersEngine", LoadedOnDemand)

    async def close_during_retrieval() -> AsyncMemoryClient:
        client = AsyncMemoryClient(_config(tmp_path))
        retrieving, go_on = asyncio.Event(), asyncio.Event()

        async def slow_retrieval(request: Any) -> list[Any]:
            retrieving.set()
            await go_on.wait()
            return []

        client._achat_records = slow_retrieval  # type: ignore[method-assign]
        chat = asyncio.ensure_future(client.chat("Hi", user_id="maya", stream=stream))
        await retrieving.wait()
        await client.close()
        go_on.set()
        with pytest.raises(EngineClosedError):
            await chat
        return client

    closed = asyncio.run(close_during_retrieval())
    assert closed._engine is None and len(FakeEngine.instances) == 1
