"""KV injection equals a block-diagonal prefill (paper Theorem 3), on tiny models and on SmolLM2, in float32.

The tiny models cover every supported architecture and rope type (see ``tiny_models``): Llama with default,
``llama3`` (3.1-style), ``linear``, ``yarn`` and static ``longrope`` RoPE; Mistral; Qwen2 (biases); Qwen3 (k_norm);
StableLM and Phi (partial rotary, k_layernorm); Gemma 3 (per-layer-type rotary tables, scaled embeddings, k_norm,
sliding window wider than the test sequences).
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from tiny_models import SUPPORTED_ARCHS, block_diagonal_logits, tiny_model
from transformers import DynamicCache

from inferscale.config import EngineConfig
from inferscale.engines.transformers import TransformersEngine
from inferscale.kv import EncodeRequest, FactEncoder, PrefixKV, RopeTable, assemble

ARCHS = list(SUPPORTED_ARCHS)


@functools.cache
def _model(arch: str) -> Any:
    """One tiny model per architecture for the whole module (read-only in these tests)."""
    return tiny_model(arch)


def _inject_logits(model: Any, prefix: list[int], facts: list[list[int]], query: list[int]) -> torch.Tensor:
    encoder = FactEncoder(model, batch_size=2)  # batches of 2 exercise right padding
    fact_kv = encoder.encode([EncodeRequest(f) for f in facts])
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prefix]), position_ids=torch.arange(len(prefix))[None], use_cache=True)
    layers = out.cache.layers
    prefix_kv = PrefixKV(
        torch.stack([x.keys[0] for x in layers]), torch.stack([x.values[0] for x in layers]), torch.tensor(prefix)
    )
    assembled = assemble(prefix_kv, fact_kv, RopeTable.from_model(model, torch.device("cpu")))
    cache = DynamicCache(
        ddp_cache_data=[(assembled.keys[i][None], assembled.values[i][None]) for i in range(len(layers))],
        config=model.config,
    )
    n = assembled.n_tokens
    with torch.no_grad():
        logits = model(
            input_ids=torch.tensor([query]), position_ids=torch.arange(n, n + len(query))[None], cache=cache
        ).logits
    return logits[0, -1].float()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("prefix_len", [1, 8, 13, 21])
def test_injection_matches_block_diagonal_prefill(arch: str, prefix_len: int) -> None:
    model = _model(arch)
    g = torch.Generator().manual_seed(prefix_len)
    prefix = torch.randint(3, 250, (prefix_len,), generator=g).tolist()
    facts = [torch.randint(3, 250, (n,), generator=g).tolist() for n in (5, 9, 3, 7)]
    query = torch.randint(3, 250, (6,), generator=g).tolist()
    injected = _inject_logits(model, prefix, facts, query)
    reference = block_diagonal_logits(model, prefix, facts, query)
    assert (injected - reference).abs().max().item() <= 1e-4
    # The block structure matters: a plain causal prefill over the same tokens gives other logits, so the
    # comparison above is not vacuous.
    with torch.no_grad():
        full = model(input_ids=torch.tensor([prefix + [t for f in facts for t in f] + query])).logits[0, -1]
    assert (injected - full).abs().max().item() > 1e-3


@pytest.fixture(scope="module")
def smol_engine(smollm2_fp32: tuple[Any, Any]) -> TransformersEngine:
    model, tokenizer = smollm2_fp32
    return TransformersEngine(
        EngineConfig(dtype="float32", device="cpu"), "Memories:\n", model=model, tokenizer=tokenizer
    ).load()


@pytest.mark.slow
@pytest.mark.parametrize("n_facts", [1, 3, 5])
def test_smollm2_engine_injection_matches_block_diagonal(smol_engine: TransformersEngine, n_facts: int) -> None:
    texts = [
        "Maya lives in Porto.",
        "Biscuit is a three-year-old beagle.",
        "Daniel's birthday is on June 14.",
        "Raj plays chess every Friday.",
        "Clara teaches in Madrid.",
    ][:n_facts]
    fact_ids = [smol_engine.fact_token_ids(t) for t in texts]
    facts = smol_engine.encode_facts([EncodeRequest(ids) for ids in fact_ids])
    query = "Where does Maya live?"
    injected = smol_engine.first_token_logits(query, facts)
    reference = block_diagonal_logits(
        smol_engine.model, smol_engine.system_prefix_ids(), fact_ids, smol_engine.query_token_ids(query)
    )
    assert (injected - reference).abs().max().item() <= 1e-4


@pytest.mark.slow
def test_prompt_mode_equals_full_causal_prefill(smol_engine: TransformersEngine) -> None:
    texts = ["Maya lives in Porto.", "Biscuit is a beagle."]
    fact_ids = [smol_engine.fact_token_ids(t) for t in texts]
    query = "Where does Maya live?"
    logits = smol_engine.first_token_logits(query, None, fact_ids)
    ids = smol_engine.system_prefix_ids() + [t for f in fact_ids for t in f] + smol_engine.query_token_ids(query)
    with torch.no_grad():
        full = smol_engine.model(input_ids=torch.tensor([ids])).logits[0, -1].float()
    assert (logits - full).abs().max().item() <= 1e-4


@pytest.mark.slow
def test_encoding_is_batch_invariant(smol_engine: TransformersEngine) -> None:
    texts = ["Maya lives in Porto.", "Daniel's birthday is on June 14 and he likes jazz.", "Hi."]
    reqs = [EncodeRequest(smol_engine.fact_token_ids(t), smol_engine.system_prefix_ids()) for t in texts]
    batched = smol_engine.encode_facts(reqs)
    for req, fact in zip(reqs, batched, strict=True):
        alone = smol_engine.encode_facts([req])[0]
        assert fact.encoded_at == len(req.context_ids)
        assert (fact.keys - alone.keys).abs().max().item() <= 1e-4
        assert (fact.values - alone.values).abs().max().item() <= 1e-4
