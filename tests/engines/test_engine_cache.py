"""The preallocated in-place cache and the engine's greedy decode loop."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from inferscale.config import EngineConfig
from inferscale.engines.transformers import TransformersEngine
from inferscale.engines.transformers.cache import PreallocatedCache, PreallocatedLayer


def test_layer_writes_in_place_and_grows() -> None:
    keys = torch.zeros(1, 2, 4, 3)
    values = torch.zeros(1, 2, 4, 3)
    keys[:, :, :2] = 1.0
    layer = PreallocatedLayer(keys, values, length=2)
    assert layer.get_seq_length() == 2
    k_all, _ = layer.update(torch.full((1, 2, 1, 3), 2.0), torch.full((1, 2, 1, 3), 5.0))
    assert k_all.shape == (1, 2, 3, 3)
    assert keys[0, 0, :, 0].tolist() == [1.0, 1.0, 2.0, 0.0]  # written into the caller's buffer
    k_all, v_all = layer.update(torch.full((1, 2, 3, 3), 3.0), torch.full((1, 2, 3, 3), 6.0))  # past capacity
    assert layer.get_seq_length() == 6
    assert k_all[0, 1, :, 2].tolist() == [1.0, 1.0, 2.0, 3.0, 3.0, 3.0]
    assert v_all[0, 0, :, 0].tolist() == [0.0, 0.0, 5.0, 6.0, 6.0, 6.0]


def test_layer_rejects_bad_buffers() -> None:
    with pytest.raises(ValueError, match="capacity"):
        PreallocatedLayer(torch.zeros(1, 2, 4, 3), torch.zeros(1, 2, 4, 3), length=5)
    with pytest.raises(ValueError, match="buffers"):
        PreallocatedLayer(torch.zeros(2, 4, 3), torch.zeros(2, 4, 3), length=1)


def test_cache_reports_length_per_layer() -> None:
    cache = PreallocatedCache(torch.zeros(3, 2, 10, 4), torch.zeros(3, 2, 10, 4), length=7)
    assert cache.get_seq_length(0) == 7 and len(cache.layers) == 3


def test_divide_keys_scales_the_filled_slots_of_every_layer() -> None:
    cache = PreallocatedCache(torch.full((2, 1, 6, 2), 3.0), torch.full((2, 1, 6, 2), 3.0), length=4)
    cache.divide_keys(1, 3, 2.0)
    for layer in cache.layers:
        assert layer.keys is not None and layer.values is not None
        assert layer.keys[0, 0, :, 0].tolist() == [3.0, 1.5, 1.5, 3.0]
        assert layer.values[0, 0, :, 0].tolist() == [3.0] * 4
    with pytest.raises(ValueError, match="filled"):
        cache.divide_keys(2, 5, 2.0)


@pytest.mark.slow
def test_prompt_mode_decode_matches_transformers_generate(smollm2_fp32: tuple[Any, Any]) -> None:
    model, tokenizer = smollm2_fp32
    engine = TransformersEngine(
        EngineConfig(dtype="float32", device="cpu"), "Memories:\n", model=model, tokenizer=tokenizer
    ).load()
    fact_ids = [engine.fact_token_ids("Maya lives in Porto."), engine.fact_token_ids("Biscuit is a beagle.")]
    query = "Where does Maya live?"
    ours = engine.generate_prompt(query, fact_ids, max_new_tokens=10)
    ids = engine.system_prefix_ids() + [t for f in fact_ids for t in f] + engine.query_token_ids(query)
    with torch.no_grad():
        reference = model.generate(
            input_ids=torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=10,
            do_sample=False,
        )[0, len(ids) :].tolist()
    stop = {tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id}
    expected = []
    for token in reference:
        if token in stop:
            break
        expected.append(token)
    assert ours.token_ids == expected
    assert ours.prompt_tokens == len(ids)


@pytest.mark.slow
def test_reused_workspace_leaks_nothing_between_requests(smollm2_fp32: tuple[Any, Any]) -> None:
    from inferscale.kv import EncodeRequest

    model, tokenizer = smollm2_fp32
    texts = ["Maya lives in Porto.", "Biscuit is a beagle.", "Raj plays chess.", "Clara teaches.", "Ines runs."]

    def fresh_engine() -> TransformersEngine:
        return TransformersEngine(
            EngineConfig(dtype="float32", device="cpu"), "Memories:\n", model=model, tokenizer=tokenizer
        ).load()

    engine = fresh_engine()
    facts = engine.encode_facts([EncodeRequest(engine.fact_token_ids(t)) for t in texts])
    engine.generate_kv("Who plays chess?", facts, max_new_tokens=4)  # fills the workspace further
    after_long = engine.first_token_logits("Where does Maya live?", facts[:2])
    alone = fresh_engine().first_token_logits("Where does Maya live?", facts[:2])
    assert torch.equal(after_long, alone)


@pytest.mark.slow
def test_close_keeps_a_given_model_and_reloads(smollm2_fp32: tuple[Any, Any]) -> None:
    """close() drops what the engine built (prefix K/V, table) but never a model the caller passed in; the next use
    loads again and answers the same."""
    model, tokenizer = smollm2_fp32
    engine = TransformersEngine(
        EngineConfig(dtype="float32", device="cpu"), "Memories:\n", model=model, tokenizer=tokenizer
    )
    before = engine.first_token_logits("Where does Maya live?", None, [engine.fact_token_ids("Maya lives in Porto.")])
    engine.close()
    engine.close()
    assert engine.model is model and engine.tokenizer is tokenizer
    after = engine.first_token_logits("Where does Maya live?", None, [engine.fact_token_ids("Maya lives in Porto.")])
    assert torch.equal(before, after)
