"""The facts one ``add(infer=True)`` call extracts share the call's context turns: their encoding prefills those
turns once, and each fact's stored K/V equal its own fresh encoding (issue #16: encoding throughput).

The real :class:`TransformersEngine` on a tiny random Llama and the byte-level chat tokenizer, the real client with
eager encoding; extraction is scripted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from inferscale import MemoryClient, MemoryConfig
from inferscale.config import EngineConfig, KVConfig
from inferscale.engines.transformers import TransformersEngine
from inferscale.kv.encode import EncodeRequest
from tests.mem0_fakes import HashEmbedder, ScriptedGenerator, facts
from tests.tiny_models import byte_chat_tokenizer, tiny_model

EXTRACTED = ("Has a beagle named Biscuit", "Sister Ana lives in Lisbon", "Plays chess on Sundays")
CONVERSATION = [
    {"role": "user", "content": "I have a beagle named Biscuit, and my sister Ana lives in Lisbon."},
    {"role": "assistant", "content": "Lovely! Do you have hobbies?"},
    {"role": "user", "content": "I play chess on Sundays."},
]


def test_the_facts_of_one_add_prefill_its_context_once_and_equal_their_own_encodings(tmp_path: Path) -> None:
    engine = TransformersEngine(
        EngineConfig(dtype="float32", device="cpu"),
        "Memories:\n",
        model=tiny_model("llama", seed=0),
        tokenizer=byte_chat_tokenizer(),
    ).load()
    calls: list[list[EncodeRequest]] = []
    encode = engine.encode_facts

    def recorded(requests: list[EncodeRequest]) -> Any:
        calls.append(list(requests))
        return encode(requests)

    engine.encode_facts = recorded  # type: ignore[method-assign]
    config = MemoryConfig(
        data_dir=str(tmp_path), system_prompt="Memories:\n", kv=KVConfig(context_window=5, encode_on_add="eager")
    )
    generator = ScriptedGenerator(facts=facts(*EXTRACTED))
    with MemoryClient(config, engine=engine, embedder=HashEmbedder(), generator=generator) as client:
        before = engine._encoder.tokens_prefilled  # the encoder's own count (the cached system prefix is not in it)
        added = client.add(CONVERSATION, user_id="maya")["results"]
        prefilled = engine._encoder.tokens_prefilled - before
        records = [client.db.get(r["id"]) for r in added]
        stored = client.memory_kv([r for r in records if r is not None])

    assert [r["memory"] for r in added] == list(EXTRACTED)
    (requests,) = calls  # one encode call holds the three facts
    prefix = engine.system_prefix_ids()
    contexts = {tuple(r.context_ids) for r in requests}
    assert len(requests) == 3 and len(contexts) == 1
    (context,) = contexts
    turns = len(context) - len(prefix)
    assert turns > 0 and list(context[: len(prefix)]) == prefix  # the call's turns, after the system prefix
    assert prefilled == turns + sum(len(r.fact_ids) for r in requests)  # not 3 * turns + the facts
    for request, fact in zip(requests, stored, strict=True):
        (alone,) = encode([request])  # the fact's own encoding, with nothing to share
        assert fact.encoded_at == alone.encoded_at == len(context)
        torch.testing.assert_close(fact.keys, alone.keys, rtol=0, atol=1e-5)
        torch.testing.assert_close(fact.values, alone.values, rtol=0, atol=1e-5)
