"""Serve-time recompute of each fact's first m tokens (attention-sink remedy)."""

from __future__ import annotations

from typing import Any

import pytest

from inferscale.config import EngineConfig
from inferscale.engines.transformers import TransformersEngine
from inferscale.kv import EncodeRequest

FACTS = ["Maya lives in Porto.", "Biscuit is a three-year-old beagle.", "Daniel's birthday is on June 14."]
QUERY = "Where does Maya live?"


def _engine(smollm2_fp32: tuple[Any, Any], m: int) -> TransformersEngine:
    model, tokenizer = smollm2_fp32
    return TransformersEngine(
        EngineConfig(dtype="float32", device="cpu"),
        "Memories:\n",
        model=model,
        tokenizer=tokenizer,
        recompute_head_tokens=m,
    ).load()


@pytest.mark.parametrize("after_prefix", [False, True])
def test_recomputing_every_token_equals_prompt_mode(smollm2_fp32: tuple[Any, Any], after_prefix: bool) -> None:
    engine = _engine(smollm2_fp32, m=10_000)
    fact_ids = [engine.fact_token_ids(t) for t in FACTS]
    context = engine.system_prefix_ids() if after_prefix else []
    facts = engine.encode_facts([EncodeRequest(ids, context) for ids in fact_ids])
    kv = engine.first_token_logits(QUERY, facts)
    prompt = engine.first_token_logits(QUERY, None, fact_ids)
    assert (kv - prompt).abs().max().item() <= 1e-4


def test_partial_recompute_lies_between_injection_and_prompt(smollm2_fp32: tuple[Any, Any]) -> None:
    plain = _engine(smollm2_fp32, m=0)
    fact_ids = [plain.fact_token_ids(t) for t in FACTS]
    facts = plain.encode_facts([EncodeRequest(ids) for ids in fact_ids])  # standalone: each grows a sink
    prompt = plain.first_token_logits(QUERY, None, fact_ids).log_softmax(-1)
    injected = plain.first_token_logits(QUERY, facts).log_softmax(-1)
    healed = _engine(smollm2_fp32, m=2).first_token_logits(QUERY, facts).log_softmax(-1)

    def kl(p: Any, q: Any) -> float:
        return float((p.exp() * (p - q)).sum())

    assert (healed - injected).abs().max().item() > 1e-3  # it changes the cache
    assert kl(prompt, healed) < kl(prompt, injected)  # and moves the answer distribution toward prompt mode


def test_recompute_keeps_the_cache_length(smollm2_fp32: tuple[Any, Any]) -> None:
    engine = _engine(smollm2_fp32, m=3)
    facts = engine.encode_facts([EncodeRequest(engine.fact_token_ids(t)) for t in FACTS])
    assembled, cache = engine._kv_cache(facts, extra_capacity=4)
    assert cache.get_seq_length(0) == assembled.n_tokens
    with pytest.raises(ValueError, match="recompute_head_tokens"):
        TransformersEngine(EngineConfig(), "x", recompute_head_tokens=-1)
