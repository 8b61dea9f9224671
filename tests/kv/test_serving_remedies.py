"""Serve-time fidelity remedies: memory attention scale, temperature, recompute policies, position-aware encoding.

Each remedy is checked against a reference computed another way: a single forward pass with a block-structured
mask (tests/tiny_models.py), duplicated cache columns, or hooks on a plain forward pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from tiny_models import block_diagonal_logits
from transformers import DynamicCache

from inferscale.config import EngineConfig, KVConfig
from inferscale.engines.transformers import TransformersEngine
from inferscale.engines.transformers.remedies import recompute_slots
from inferscale.errors import ConfigError
from inferscale.kv import EncodeRequest, SegmentWorkspace
from inferscale.kv.encode import PreRopeCapture, decoder_attention_modules
from inferscale.kv.recompute import (
    FactLineLayout,
    RecomputePolicy,
    head_slots,
    structure_slots,
    tail_slots,
    top_scored_slots,
)
from inferscale.kv.serving import ServingSettings, bucket_per_fact, nearest_bucket

FACTS = ["Maya lives in Porto.", "Biscuit is a three-year-old beagle.", "Daniel's birthday is on June 14."]
QUERY = "Where does Maya live?"


# ------------------------------------------------------------------------------------------------ pure functions


@pytest.mark.parametrize(
    ("spec", "kind", "amount"),
    [
        ("none", "none", 0.0),
        ("head:4", "head", 4.0),
        ("tail:50", "tail", 50.0),
        ("structure", "structure", 0.0),
        ("selective:12.5", "selective", 12.5),
        (" selective:100 ", "selective", 100.0),
    ],
)
def test_recompute_policy_parses(spec: str, kind: str, amount: float) -> None:
    policy = RecomputePolicy.parse(spec)
    assert (policy.kind, policy.amount) == (kind, amount)
    assert RecomputePolicy.parse(str(policy)) == policy
    assert policy.keeps_block_diagonal_exactness == (kind == "none")


@pytest.mark.parametrize("spec", ["", "head", "head:0", "head:-1", "selective:0", "selective:101", "all", "tail:x"])
def test_bad_recompute_policy_is_a_config_error(spec: str) -> None:
    with pytest.raises(ConfigError, match="recompute"):
        RecomputePolicy.parse(spec)


def test_recompute_slots_of_each_policy() -> None:
    lengths = [5, 2, 4]  # facts at slots 10..14, 15..16, 17..20
    assert head_slots(lengths, 10, 3) == [10, 11, 12, 15, 16, 17, 18, 19]
    assert tail_slots(sum(lengths), 10, 3) == [18, 19, 20]
    assert tail_slots(sum(lengths), 10, 50) == list(range(10, 21))
    layouts = [FactLineLayout(1, 1), FactLineLayout(1, 1), FactLineLayout(2, 0)]
    assert structure_slots(lengths, 10, layouts) == [10, 14, 15, 16, 17, 18]
    scores = torch.tensor([0.1, 0.9, 0.0, 0.5, 0.2, 0.3, 0.8, 0.05, 0.4, 0.6, 0.7])
    assert top_scored_slots(scores, 10, 25.0) == [11, 16, 20]  # ceil(0.25 * 11) = 3 highest, ascending
    assert top_scored_slots(scores, 10, 100.0) == list(range(10, 21))


def test_position_buckets_pick_the_nearest_distance() -> None:
    assert [nearest_bucket(o, (0, 128, 256)) for o in (0, 63, 64, 65, 200, 1000)] == [0, 0, 0, 128, 256, 256]
    assert bucket_per_fact([60, 70, 200, 10], (0, 128, 256)) == [0, 0, 128, 256]  # offsets 0, 60, 130, 330
    with pytest.raises(ValueError, match="empty"):
        nearest_bucket(3, ())


def test_serving_settings_refuse_non_positive_values() -> None:
    assert ServingSettings().is_pure_injection
    assert ServingSettings(0.5).memory_logit_bias == pytest.approx(math.log(0.5))
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="attention_scale"):
            ServingSettings(attention_scale=bad)
        with pytest.raises(ValueError, match="temperature"):
            ServingSettings(temperature=bad)


def test_kv_config_validates_the_remedies() -> None:
    config = KVConfig(recompute="head:2", position_buckets=(256, 0, 128, 0))
    assert config.position_buckets == (0, 128, 256)
    assert config.serving().recompute == RecomputePolicy("head", 2.0)
    with pytest.raises(ValueError, match="recompute"):
        KVConfig(recompute="first:3")
    with pytest.raises(ValueError, match="position_buckets"):
        KVConfig(position_buckets=(-1,))
    with pytest.raises(ValueError):
        KVConfig(memory_attention_scale=0)


# ------------------------------------------------------------------------------------------------ SmolLM2, fp32


def _engine(smollm2_fp32: tuple[Any, Any], **serving: Any) -> TransformersEngine:
    model, tokenizer = smollm2_fp32
    settings = ServingSettings(
        attention_scale=serving.get("s", 1.0),
        temperature=serving.get("t", 1.0),
        recompute=RecomputePolicy.parse(serving.get("recompute", "none")),
    )
    return TransformersEngine(
        EngineConfig(dtype="float32", device="cpu"), "Memories:\n", model=model, tokenizer=tokenizer, serving=settings
    ).load()


def _cache_by_hand(
    model: Any,
    assembled: Any,
    per_layer: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] = lambda k, v: (k, v),
) -> DynamicCache:
    """A plain transformers cache holding ``per_layer(keys, values)`` of each layer of ``assembled`` (copies,
    ``[n_kv_heads, T, head_dim]`` each): the reference side of the remedy tests."""
    layers = []
    for keys, values in zip(assembled.keys, assembled.values, strict=True):
        k, v = per_layer(keys, values)
        layers.append((k.clone()[None], v.clone()[None]))
    return DynamicCache(ddp_cache_data=layers, config=model.config)


def _kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> float:
    p, q = p_logits.log_softmax(-1), q_logits.log_softmax(-1)
    return float((p.exp() * (p - q)).sum())


@pytest.mark.slow
@pytest.mark.parametrize("after_prefix", [False, True])
@pytest.mark.parametrize("recompute", ["head:10000", "tail:10000", "selective:100"])
def test_recomputing_every_token_equals_prompt_mode(
    smollm2_fp32: tuple[Any, Any], after_prefix: bool, recompute: str
) -> None:
    engine = _engine(smollm2_fp32, recompute=recompute)
    fact_ids = [engine.fact_token_ids(t) for t in FACTS]
    context = engine.system_prefix_ids() if after_prefix else []
    facts = engine.encode_facts([EncodeRequest(ids, context) for ids in fact_ids])
    kv = engine.first_token_logits(QUERY, facts)
    prompt = engine.first_token_logits(QUERY, None, fact_ids)
    assert (kv - prompt).abs().max().item() <= 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("recompute", ["head:2", "structure", "selective:20", "tail:6"])
def test_partial_recompute_moves_towards_prompt_mode(smollm2_fp32: tuple[Any, Any], recompute: str) -> None:
    plain = _engine(smollm2_fp32)
    fact_ids = [plain.fact_token_ids(t) for t in FACTS]
    facts = plain.encode_facts([EncodeRequest(ids) for ids in fact_ids])  # standalone: each grows a sink
    prompt = plain.first_token_logits(QUERY, None, fact_ids)
    injected = plain.first_token_logits(QUERY, facts)
    healed = _engine(smollm2_fp32, recompute=recompute).first_token_logits(QUERY, facts)
    assert (healed - injected).abs().max().item() > 1e-3  # it changes the cache
    assert _kl(prompt, healed) < _kl(prompt, injected)  # and moves the answer distribution toward prompt mode


@pytest.mark.slow
def test_structure_finds_the_bullet_and_the_line_break(smollm2_fp32: tuple[Any, Any]) -> None:
    engine = _engine(smollm2_fp32)
    for text in FACTS:
        ids = engine.fact_token_ids(text)
        layout = engine._layout.line_layout_of(ids)
        assert layout.opening >= 1 and layout.closing >= 1
        opening = engine.tokenizer.decode(ids[: layout.opening])
        closing = engine.tokenizer.decode(ids[len(ids) - layout.closing :])
        assert "- ".startswith(opening) and opening.strip() == "-"
        assert closing == "\n"


@pytest.mark.slow
def test_recompute_reports_its_tokens_and_keeps_the_cache_length(smollm2_fp32: tuple[Any, Any]) -> None:
    engine = _engine(smollm2_fp32, recompute="head:3")
    facts = engine.encode_facts([EncodeRequest(engine.fact_token_ids(t)) for t in FACTS])
    served = engine._kv_cache(SegmentWorkspace(engine.prefix_kv), facts, extra_capacity=4)
    assert served.cache.get_seq_length(0) == served.start == served.assembled.n_tokens
    assert served.added_tokens == 3 * len(FACTS) and served.pending_ids == []
    selective = _engine(smollm2_fp32, recompute="selective:10")
    query_ids = selective.query_token_ids(QUERY)
    served = selective._kv_cache(SegmentWorkspace(selective.prefix_kv), facts, len(query_ids), query_ids)
    assert served.cache.get_seq_length(0) == served.assembled.n_tokens
    # chosen slots + the query's probe
    assert served.added_tokens == math.ceil(0.1 * served.assembled.memory_tokens) + len(query_ids)
    tail = _engine(smollm2_fp32, recompute="tail:5")
    served = tail._kv_cache(SegmentWorkspace(tail.prefix_kv), facts, extra_capacity=4)
    # the tail is left to the query's prefill: the cache stops before it and its tokens are pending
    assert served.start == served.assembled.n_tokens - 5 == served.cache.get_seq_length(0)
    assert served.pending_ids == served.assembled.token_ids[-5:].tolist() and served.added_tokens == 5


def _count_forward_passes(model: Any) -> tuple[list[int], Any]:
    calls: list[int] = []
    handle = model.model.register_forward_pre_hook(lambda module, args, kwargs: calls.append(1), with_kwargs=True)
    return calls, handle


@pytest.mark.slow
@pytest.mark.parametrize("tail", [1, 6, 10000])
def test_tail_recompute_folded_into_the_query_prefill_equals_a_separate_recompute_pass(
    smollm2_fp32: tuple[Any, Any], tail: int
) -> None:
    """``tail:n`` (no s, no T) is prefilled with the query in one forward pass; the reference recomputes the tail
    in place first (:func:`recompute_slots`, each tail token masked to the slots before it), then prefills the
    query on that cache: the same logits, one forward pass instead of two."""
    plain = _engine(smollm2_fp32)
    facts = plain.encode_facts([EncodeRequest(plain.fact_token_ids(t)) for t in FACTS])
    query_ids = plain.query_token_ids(QUERY)
    served = plain._kv_cache(SegmentWorkspace(plain.prefix_kv), facts, extra_capacity=len(query_ids) + 16)
    n = served.assembled.n_tokens
    p = plain.prefix_kv.n_tokens
    slots = tail_slots(served.assembled.memory_tokens, p, tail)
    with torch.inference_mode():
        recompute_slots(plain.model, served.cache, served.assembled.token_ids, slots, n)
        reference = plain._forward(served.cache, query_ids, n)[0, -1].float()

    folded = _engine(smollm2_fp32, recompute=f"tail:{tail}")
    calls, handle = _count_forward_passes(folded.model)
    try:
        logits = folded.first_token_logits(QUERY, facts)
    finally:
        handle.remove()
    assert len(calls) == 1
    assert (logits - reference).abs().max().item() <= 1e-4  # fp32 rounding: masked vs causal attention kernels
    injected = plain.first_token_logits(QUERY, facts)
    assert (logits - injected).abs().max().item() > 1e-3  # the tail's recompute changed the answer's logits


@pytest.mark.slow
def test_answer_decoded_after_a_folded_tail_equals_the_separate_pass_answer(smollm2_fp32: tuple[Any, Any]) -> None:
    """``generate_kv`` under ``tail:6``: the tail and the query prefilled together, then greedy decode, gives the
    tokens a separate recompute pass followed by the query's prefill and the same greedy decode gives; the prompt
    still counts every memory token once."""
    plain = _engine(smollm2_fp32)
    facts = plain.encode_facts([EncodeRequest(plain.fact_token_ids(t)) for t in FACTS])
    query_ids = plain.query_token_ids(QUERY)
    budget = 8
    served = plain._kv_cache(SegmentWorkspace(plain.prefix_kv), facts, extra_capacity=len(query_ids) + budget + 8)
    n = served.assembled.n_tokens
    expected: list[int] = []
    with torch.inference_mode():
        recompute_slots(
            plain.model,
            served.cache,
            served.assembled.token_ids,
            tail_slots(n - plain.prefix_kv.n_tokens, plain.prefix_kv.n_tokens, 6),
            n,
        )
        token = int(plain._forward(served.cache, query_ids, n)[0, -1].argmax())
        position = n + len(query_ids)
        while token not in plain._stop_ids and len(expected) < budget:
            expected.append(token)
            token = int(plain._forward(served.cache, [token], position)[0, -1].argmax())
            position += 1

    answer = _engine(smollm2_fp32, recompute="tail:6").generate_kv(QUERY, facts, budget)
    assert len(expected) >= 2 and answer.token_ids == expected
    assert answer.prompt_tokens == n + len(query_ids) and answer.recomputed_tokens == 6
    assert answer.memory_tokens == n - plain.prefix_kv.n_tokens


@pytest.mark.slow
@pytest.mark.parametrize("scale", [0.35, 2.0])
def test_memory_attention_scale_matches_a_masked_single_pass(smollm2_fp32: tuple[Any, Any], scale: float) -> None:
    """Reference: one forward pass over prefix + facts + query with the block-diagonal mask and log s added to the
    memory columns of the query rows (tiny_models.block_diagonal_logits)."""
    engine = _engine(smollm2_fp32, s=scale)
    fact_ids = [engine.fact_token_ids(t) for t in FACTS]
    facts = engine.encode_facts([EncodeRequest(ids) for ids in fact_ids])
    scaled = engine.first_token_logits(QUERY, facts)
    reference = block_diagonal_logits(
        engine.model,
        engine.system_prefix_ids(),
        fact_ids,
        engine.query_token_ids(QUERY),
        memory_bias=math.log(scale),
    )
    assert (scaled - reference).abs().max().item() <= 1e-4
    unscaled = _engine(smollm2_fp32).first_token_logits(QUERY, facts)
    assert (scaled - unscaled).abs().max().item() > 1e-2


@pytest.mark.slow
def test_memory_attention_scale_two_equals_every_memory_column_twice(smollm2_fp32: tuple[Any, Any]) -> None:
    """s = 2 doubles the memory block's attention mass: the same as the memory K/V standing twice in the cache."""
    engine = _engine(smollm2_fp32, s=2.0)
    facts = engine.encode_facts([EncodeRequest(engine.fact_token_ids(t)) for t in FACTS])
    scaled = engine.first_token_logits(QUERY, facts)
    assembled = engine.assemble(facts)
    p, n = engine.prefix_kv.n_tokens, assembled.n_tokens
    cache = _cache_by_hand(
        engine.model,
        assembled,
        lambda k, v: (torch.cat([k[:, :n], k[:, p:n]], dim=1), torch.cat([v[:, :n], v[:, p:n]], dim=1)),
    )
    query_ids = engine.query_token_ids(QUERY)
    length = n + (n - p)
    mask = torch.zeros(len(query_ids), length + len(query_ids))
    mask[:, length:] = torch.full((len(query_ids), len(query_ids)), torch.finfo(torch.float32).min).triu(1)
    with torch.no_grad():
        out = engine.model(
            input_ids=torch.tensor([query_ids]),
            position_ids=torch.arange(n, n + len(query_ids))[None],  # the duplicates sit at their own positions
            attention_mask=mask[None, None],
            past_key_values=cache,
        )
    assert (scaled - out.logits[0, -1].float()).abs().max().item() <= 1e-4


@pytest.mark.slow
def test_memory_temperature_divides_the_memory_logits(smollm2_fp32: tuple[Any, Any]) -> None:
    """T = 2 equals the memory keys halved in a cache built by hand."""
    engine = _engine(smollm2_fp32, t=2.0)
    facts = engine.encode_facts([EncodeRequest(engine.fact_token_ids(t)) for t in FACTS])
    tempered = engine.first_token_logits(QUERY, facts)
    assembled = engine.assemble(facts)
    p = engine.prefix_kv.n_tokens
    cache = _cache_by_hand(engine.model, assembled, lambda k, v: (torch.cat([k[:, :p], k[:, p:] / 2.0], dim=1), v))
    query_ids = engine.query_token_ids(QUERY)
    with torch.no_grad():
        out = engine.model(
            input_ids=torch.tensor([query_ids]),
            position_ids=torch.arange(assembled.n_tokens, assembled.n_tokens + len(query_ids))[None],
            past_key_values=cache,
        )
    assert (tempered - out.logits[0, -1].float()).abs().max().item() <= 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("gap", [0, 7, 120])
def test_position_gap_encodes_the_fact_as_if_unseen_tokens_stood_before_it(
    smollm2_fp32: tuple[Any, Any], gap: int
) -> None:
    """Reference: a plain forward pass over [prefix][gap filler tokens][fact] in which the fact may not attend to
    the filler, its pre-RoPE K/V captured with hooks: it must equal the fact encoded with ``position_gap=gap``."""
    engine = _engine(smollm2_fp32)
    model = engine.model
    prefix = engine.system_prefix_ids()
    fact = engine.fact_token_ids(FACTS[1])
    encoded = engine.encode_facts([EncodeRequest(fact, prefix, position_gap=gap)])[0]
    assert encoded.encoded_at == len(prefix) + gap
    filler = [engine.tokenizer.convert_tokens_to_ids("the")] * gap
    ids = prefix + filler + fact
    n, p = len(ids), len(prefix)
    allowed = torch.ones(n, n, dtype=torch.bool).tril()
    allowed[p + gap :, p : p + gap] = False
    mask = torch.zeros(n, n).masked_fill_(~allowed, torch.finfo(torch.float32).min)
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    with (
        torch.no_grad(),
        PreRopeCapture(decoder_attention_modules(model), config.num_key_value_heads, head_dim, n) as capture,
    ):
        model.model(input_ids=torch.tensor([ids]), attention_mask=mask[None, None], position_ids=torch.arange(n)[None])
        keys, values = capture.stacked()
    assert (encoded.keys - keys[:, 0, :, p + gap :]).abs().max().item() <= 1e-4
    assert (encoded.values - values[:, 0, :, p + gap :]).abs().max().item() <= 1e-4


@pytest.mark.slow
def test_scale_applies_to_every_decoded_token(smollm2_fp32: tuple[Any, Any]) -> None:
    """Greedy answers under s equal a manual loop that rebuilds the masked single pass for each new token."""
    engine = _engine(smollm2_fp32, s=0.35)
    fact_ids = [engine.fact_token_ids(t) for t in FACTS]
    facts = engine.encode_facts([EncodeRequest(ids) for ids in fact_ids])
    generation = engine.generate_kv(QUERY, facts, max_new_tokens=6)
    assert len(generation.token_ids) >= 2  # decoded tokens exist to check
    query = engine.query_token_ids(QUERY)
    expected: list[int] = []
    for _ in range(len(generation.token_ids)):
        logits = block_diagonal_logits(
            engine.model, engine.system_prefix_ids(), fact_ids, query + expected, memory_bias=math.log(0.35)
        )
        expected.append(int(logits.argmax()))
    assert generation.token_ids == expected


@pytest.mark.slow
def test_query_attention_probe_matches_eager_attention_weights(smollm2_fp32: tuple[Any, Any]) -> None:
    """The probe's scores equal the eager kernel's attention weights on the memory columns, summed over layers,
    heads and query tokens (output_attentions of a plain forward pass over the same injected cache)."""
    from inferscale.engines.hf.attention import QueryAttentionProbe, routed_through_sdpa_gqa

    engine = _engine(smollm2_fp32)
    model = engine.model
    facts = engine.encode_facts([EncodeRequest(engine.fact_token_ids(t)) for t in FACTS])
    assembled = engine.assemble(facts)
    p, n = engine.prefix_kv.n_tokens, assembled.n_tokens
    query_ids = engine.query_token_ids(QUERY)
    positions = torch.arange(n, n + len(query_ids))[None]

    with torch.no_grad(), QueryAttentionProbe(p, n) as probe, routed_through_sdpa_gqa(model):
        model(
            input_ids=torch.tensor([query_ids]),
            position_ids=positions,
            past_key_values=_cache_by_hand(model, assembled),
        )
    assert model.config._attn_implementation == "eager"  # restored
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor([query_ids]),
            position_ids=positions,
            past_key_values=_cache_by_hand(model, assembled),
            output_attentions=True,
        )
    reference = sum(a[0, :, :, p:n].sum(dim=(0, 1)) for a in out.attentions)
    # Each score sums 30 layers x 9 heads x ~20 query rows of fp32 weights (up to ~600): compare relatively.
    torch.testing.assert_close(probe.scores(), reference.float(), rtol=1e-6, atol=1e-5)
    with pytest.raises(RuntimeError, match="no attention was recorded"), QueryAttentionProbe(p, n) as empty:
        empty.scores()


@pytest.mark.slow
def test_remedies_are_refused_on_sliding_window_models(smollm2_fp32: tuple[Any, Any]) -> None:
    from inferscale.errors import UnsupportedModelError

    engine = _engine(smollm2_fp32, s=0.5)
    facts = engine.encode_facts([EncodeRequest(engine.fact_token_ids(t)) for t in FACTS])
    engine.model.config.sliding_window = 4096
    try:
        with pytest.raises(UnsupportedModelError, match="sliding-window"):
            engine.first_token_logits(QUERY, facts)
        pure = engine.first_token_logits(QUERY, facts, serving=ServingSettings())  # pure injection still serves
        assert pure.shape == (engine.model.config.vocab_size,)
    finally:
        engine.model.config.sliding_window = None
