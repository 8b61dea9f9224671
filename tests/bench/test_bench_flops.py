"""Prefill FLOP coefficients (inferscale.bench.flops) against hand counts from the configs."""

from __future__ import annotations

from typing import Any

import pytest
from tiny_models import tiny_model

from inferscale.bench.flops import PrefillCost, prefill_cost


@pytest.mark.slow
def test_smollm2_coefficients_match_its_config(smollm2_fp32: tuple[Any, Any]) -> None:
    model, _ = smollm2_fp32
    c = model.config
    assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (576, 1536, 30)
    assert (c.num_attention_heads, c.num_key_value_heads, c.vocab_size) == (9, 3, 49152)
    per_layer = 576 * 576 * 2 + 576 * 192 * 2 + 3 * 576 * 1536  # q, o; k, v (3 KV heads x 64); gate, up, down
    cost = prefill_cost(model)
    assert cost == PrefillCost(
        linear_per_token=2.0 * 30 * per_layer, attention_per_key=4.0 * 30 * 9 * 64, lm_head=2.0 * 576 * 49152
    )
    assert cost.linear_per_token == 212_336_640 and cost.attention_per_key == 69_120


def test_qwen3_counts_its_own_head_dim() -> None:
    model = tiny_model("qwen3")  # head_dim 16, independent of hidden_size / heads
    c = model.config
    cost = prefill_cost(model)
    assert cost.attention_per_key == 4.0 * c.num_hidden_layers * c.num_attention_heads * 16
    q_o = 2 * c.hidden_size * c.num_attention_heads * 16
    k_v = 2 * c.hidden_size * c.num_key_value_heads * 16
    mlp = 3 * c.hidden_size * c.intermediate_size
    assert cost.linear_per_token == 2.0 * c.num_hidden_layers * (q_o + k_v + mlp)


def test_flops_count_every_attended_key() -> None:
    cost = PrefillCost(linear_per_token=100.0, attention_per_key=1.0, lm_head=7.0)
    # 2 query tokens after 3 cached ones attend to 3 + 1 and 3 + 2 keys.
    assert cost.flops(2, 3) == 2 * 100.0 + 9 * 1.0 + 7.0
    assert cost.flops(0, 10) == 0.0  # no query, no prefill
    with pytest.raises(ValueError):
        cost.flops(-1, 0)
