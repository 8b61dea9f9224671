"""Fidelity regression (fp32, SmolLM2): the default serving settings stay much closer to prompt mode than pure
injection, and pure injection stays exactly the block-diagonal prefill of the paper's Theorem 3.

The ten cases (tests/data/fidelity_cases.json) are original: eight memories each, LoCoMo-style lines, each with
the turns before it in a conversation added in one call (up to five) as its context."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest
from tiny_models import block_diagonal_logits

from inferscale.config import EngineConfig, KVConfig, MemoryConfig
from inferscale.engines.transformers import TransformersEngine
from inferscale.eval.fidelity import FidelitySetting, run_fidelity
from inferscale.eval.fidelity_cases import load_cases
from inferscale.kv import EncodeRequest
from inferscale.kv.serving import ServingSettings

CASES = Path(__file__).parents[1] / "data" / "fidelity_cases.json"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(smollm2_fp32: tuple[Any, Any]) -> TransformersEngine:
    model, tokenizer = smollm2_fp32
    return TransformersEngine(
        EngineConfig(dtype="float32", device="cpu"), MemoryConfig().system_prompt, model=model, tokenizer=tokenizer
    ).load()


def test_default_settings_halve_the_divergence_of_pure_injection(engine: TransformersEngine) -> None:
    default = FidelitySetting.from_kv(KVConfig(), name="default")
    pure = FidelitySetting(name="pure", context_window=0)  # no context turns, no request-time remedy
    rows = run_fidelity({"default": engine}, [load_cases(CASES)], [default, pure], generate=False)
    kl = {name: statistics.fmean(r["kl"] for r in rows if r["setting"] == name) for name in ("default", "pure")}
    assert len(rows) == 20
    assert kl["pure"] > 0.05  # the slice does show the divergence the remedies are for
    assert kl["default"] < 0.5 * kl["pure"], kl
    assert engine.serving == ServingSettings()  # settings travel per request; the engine's own are untouched


@pytest.mark.parametrize("case_index", [0, 4, 9])
def test_pure_injection_matches_the_block_diagonal_reference(engine: TransformersEngine, case_index: int) -> None:
    case = load_cases(CASES).cases[case_index]
    fact_ids = [engine.fact_token_ids(t) for t in case.memories]
    query = engine.query_token_ids(case.question)
    prefix = engine.system_prefix_ids()
    standalone = engine.encode_facts([EncodeRequest(ids) for ids in fact_ids])
    reference = block_diagonal_logits(engine.model, prefix, fact_ids, query)
    assert (engine.first_token_logits(case.question, standalone) - reference).abs().max().item() <= 1e-4
    # Encoded after the prefix at their exact serving offsets, the facts equal a block-diagonal prefill in which each
    # fact also sees the prefix.
    offsets, start = [], 0
    for ids in fact_ids:
        offsets.append(start)
        start += len(ids)
    at_offset = engine.encode_facts(
        [EncodeRequest(ids, prefix, position_gap=o) for ids, o in zip(fact_ids, offsets, strict=True)]
    )
    reference = block_diagonal_logits(engine.model, prefix, fact_ids, query, fact_context=True)
    assert (engine.first_token_logits(case.question, at_offset) - reference).abs().max().item() <= 1e-4
