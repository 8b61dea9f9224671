"""The grouped-query SDPA attention equals eager attention (fp32), with and without a cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inferscale.engines.hf.attention import SDPA_GQA, resolve_attention


def test_resolve_attention_names() -> None:
    assert resolve_attention("sdpa_gqa") == SDPA_GQA
    assert resolve_attention("eager") == "eager"


@pytest.mark.slow
def test_sdpa_gqa_matches_eager_on_smollm2(smollm2_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32, attn_implementation="eager")
    gqa = AutoModelForCausalLM.from_pretrained(
        smollm2_path, dtype=torch.float32, attn_implementation=resolve_attention("sdpa_gqa")
    )
    assert gqa.config.num_attention_heads != gqa.config.num_key_value_heads  # the grouped path is exercised
    ids = torch.randint(10, 40000, (1, 40), generator=torch.Generator().manual_seed(0))
    query = torch.randint(10, 40000, (1, 6), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(40, 46)[None]
    with torch.no_grad():
        a, b = eager(input_ids=ids, use_cache=True), gqa(input_ids=ids, use_cache=True)
        assert (a.logits - b.logits).abs().max().item() <= 3e-4
        # A prefill on top of a cache carries an attention mask: the case transformers' sdpa repeats K/V for.
        a2 = eager(input_ids=query, position_ids=positions, cache=a.cache).logits
        b2 = gqa(input_ids=query, position_ids=positions, cache=b.cache).logits
    assert (a2 - b2).abs().max().item() <= 3e-4
