"""The facts one ``add(infer=True)`` call extracts share the call's context turns: their encoding prefills those
turns once, and each fact's stored K/V equal its own fresh encoding (issue #16: encoding throughput).

The real :class:`TransformersEngine` on a tiny random Llama and the byte-level chat tokenizer, the real client with
eager encoding; extraction is scripted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch
from mem0_fakes import HashEmbedder, ScriptedGenerator, facts
from tiny_models import byte_chat_tokenizer, tiny_model

from inferscale import MemoryClient, MemoryConfig
from inferscale.config import EngineConfig, KVConfig
from inferscale.engines.transformers import TransformersEngine
from inferscale.kv.encode import EncodeRequest
from inferscale.kv.fact import FactKV

EXTRACTED = ("Has a beagle named Biscuit", "Sister Ana lives in Lisbon", "Plays chess on Sundays")
CONVERSATION = [
    {"role": "user", "content": "I have a beagle named Biscuit, and my sister Ana lives in Lisbon."},
    {"role": "assistant", "content": "Lovely! Do you have hobbies?"},
    {"role": "user", "content": "I play chess on Sundays."},
]


SYSTEM_PROMPT = "Memories:\n"


def recording_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[TransformersEngine, list[list[EncodeRequest]], Callable[[Sequence[EncodeRequest]], list[FactKV]]]:
    """A loaded engine on a tiny Llama whose ``encode_facts`` records each call's requests; with the list it fills
    and the original ``encode_facts`` (which records nothing)."""
    engine = TransformersEngine(
        EngineConfig(dtype="float32", device="cpu"),
        SYSTEM_PROMPT,
        model=tiny_model("llama", seed=0),
        tokenizer=byte_chat_tokenizer(),
    ).load()
    calls: list[list[EncodeRequest]] = []
    encode = engine.encode_facts

    def recorded(requests: Sequence[EncodeRequest]) -> list[FactKV]:
        calls.append(list(requests))
        return encode(requests)

    monkeypatch.setattr(engine, "encode_facts", recorded)
    return engine, calls, encode


def test_the_facts_of_one_add_prefill_its_context_once_and_equal_their_own_encodings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, calls, encode = recording_engine(monkeypatch)
    config = MemoryConfig(
        data_dir=str(tmp_path), system_prompt=SYSTEM_PROMPT, kv=KVConfig(context_window=5, encode_on_add="eager")
    )
    generator = ScriptedGenerator(facts=facts(*EXTRACTED))
    with MemoryClient(config, engine=engine, embedder=HashEmbedder(), generator=generator) as client:
        before = engine._encoder.tokens_prefilled  # the encoder's own count (the cached system prefix is not in it)
        added = client.add(CONVERSATION, user_id="maya")["results"]
        prefilled = engine._encoder.tokens_prefilled - before
        records = [client.db.get(r["id"]) for r in added]
        stored = client.memory_kv([r for r in records if r is not None])

    assert [r["memory"] for r in added] == list(EXTRACTED)
    # One encode call holds the three facts after the call's turns, then their context-free encodings
    # (kv.first_memory_context_free), each after the system prefix alone.
    (requests,) = calls
    in_context, context_free = requests[:3], requests[3:]
    prefix = engine.system_prefix_ids()
    contexts = {tuple(r.context_ids) for r in in_context}
    assert len(requests) == 6 and len(contexts) == 1
    assert [list(r.context_ids) for r in context_free] == [prefix] * 3
    assert [r.fact_ids for r in context_free] == [r.fact_ids for r in in_context]
    (context,) = contexts
    turns = len(context) - len(prefix)
    assert turns > 0 and list(context[: len(prefix)]) == prefix  # the call's turns, after the system prefix
    assert prefilled == turns + 2 * sum(len(r.fact_ids) for r in in_context)  # not 3 * turns + the facts
    # Served in this order, the first fact from its context-free encoding, the others after the turns.
    for request, fact in zip([context_free[0], *in_context[1:]], stored, strict=True):
        (alone,) = encode([request])  # the fact's own encoding, with nothing to share
        assert fact.encoded_at == alone.encoded_at == len(request.context_ids)
        torch.testing.assert_close(fact.keys, alone.keys, rtol=0, atol=1e-5)
        torch.testing.assert_close(fact.values, alone.values, rtol=0, atol=1e-5)


OTHER_EXTRACTED = ("Works as a nurse", "Lives in Porto", "Has two cats")
OTHER_CONVERSATION = [
    {"role": "user", "content": "I'm a nurse in Porto."},
    {"role": "assistant", "content": "Any pets?"},
    {"role": "user", "content": "Two cats."},
]


def test_the_background_encoder_keeps_each_add_s_facts_in_one_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of at most 4 over two adds of 3 facts each: [3, 3] (each call's turns prefilled once), not [4, 2]
    (the second add's turns prefilled in both chunks). The six context-free encodings (kv.first_memory_context_free)
    come after them and share no turns, so the first of them fills the second chunk: [3, 4, 4, 1]."""
    engine, calls, _ = recording_engine(monkeypatch)
    kv = KVConfig(context_window=5, encode_on_add="lazy", encode_chunk_size=4)
    config = MemoryConfig(data_dir=str(tmp_path), system_prompt=SYSTEM_PROMPT, kv=kv)
    generator = ScriptedGenerator(facts=[facts(*EXTRACTED), facts(*OTHER_EXTRACTED)])
    with MemoryClient(config, engine=engine, embedder=HashEmbedder(), generator=generator) as client:
        ids = [r["id"] for r in client.add(CONVERSATION, user_id="maya")["results"]]
        ids += [r["id"] for r in client.add(OTHER_CONVERSATION, user_id="ana")["results"]]
        before = engine._encoder.tokens_prefilled
        client.derived.encode_queued(ids)  # the background encoder's batch, run here
        prefilled = engine._encoder.tokens_prefilled - before

    assert [len(call) for call in calls] == [3, 4, 4, 1]
    prefix = engine.system_prefix_ids()
    with_turns = [call[:3] for call in calls[:2]]  # each add's facts, after its turns
    turns = [len(call[0].context_ids) - len(prefix) for call in with_turns]
    assert all(t > 0 for t in turns)
    assert all({tuple(r.context_ids) for r in call} == {tuple(call[0].context_ids)} for call in with_turns)
    context_free = [r for call in calls for r in call if r not in [q for c in with_turns for q in c]]
    assert len(context_free) == 6 and all(list(r.context_ids) == prefix for r in context_free)
    assert prefilled == sum(turns) + sum(len(r.fact_ids) for call in calls for r in call)  # each add's turns once
