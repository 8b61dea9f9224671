"""Chunked RoPE: re-rotated pre-RoPE keys equal keys computed at the target position."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_model

from inferscale.errors import UnsupportedModelError
from inferscale.kv import EncodeRequest, FactEncoder, RopeTable, apply_rope, rotate_half


def _hf_keys_at(model: torch.nn.Module, ids: list[int], start: int) -> torch.Tensor:
    """Post-RoPE keys ``[L, n_kv, T, hd]`` that transformers caches for ``ids`` placed at ``start``."""
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor([ids]), position_ids=torch.arange(start, start + len(ids))[None], use_cache=True
        )
    return torch.stack([layer.keys[0] for layer in out.cache.layers])


@pytest.mark.parametrize("arch", ["llama", "llama31", "mistral", "qwen2", "qwen3"])
@pytest.mark.parametrize(("a", "b"), [(0, 37), (5, 1000), (129, 3)])
def test_rerotated_keys_equal_keys_captured_at_target(arch: str, a: int, b: int) -> None:
    model = tiny_model(arch)
    ids = torch.randint(3, 250, (11,), generator=torch.Generator().manual_seed(a + b)).tolist()
    table = RopeTable(model.model.rotary_emb, model.config, torch.device("cpu"))
    fact = FactEncoder(model).encode([EncodeRequest(ids)])[0]
    captured_at_a = _hf_keys_at(model, ids, a)
    captured_at_b = _hf_keys_at(model, ids, b)
    assert (table.rotate(fact.keys, a) - captured_at_a).abs().max().item() <= 1e-5
    moved = table.rotate(fact.keys, b)
    # Layer 0's keys are a pure function of (token, position): the rotation itself must match to 1e-5.
    assert (moved[0] - captured_at_b[0]).abs().max().item() <= 1e-5
    # Deeper layers also carry the float32 rounding of attention computed at far positions (|b - a| up to
    # ~1000 gives ~1.6e-5 on qwen3), which is the reference's own noise, not the rotation's.
    assert (moved - captured_at_b).abs().max().item() <= 5e-5
    # Two targets give two different tensors: no rotation computed for one offset is reused for another.
    assert (moved - table.rotate(fact.keys, a)).abs().max().item() > 1e-3


def test_llama3_scaling_differs_from_plain_rope_and_ours_matches() -> None:
    scaled = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    model = tiny_model("llama", rope_parameters=scaled, max_position_embeddings=131072, head_dim=64)
    plain = tiny_model(
        "llama",
        max_position_embeddings=131072,
        head_dim=64,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
    )
    ids = list(range(10, 19))
    b = 9000
    fact = FactEncoder(model).encode([EncodeRequest(ids)])[0]
    target = _hf_keys_at(model, ids, b)
    ours = RopeTable(model.model.rotary_emb, model.config, torch.device("cpu")).rotate(fact.keys, b)
    naive = RopeTable(plain.model.rotary_emb, plain.config, torch.device("cpu")).rotate(fact.keys, b)
    assert (ours - target).abs().max().item() <= 1e-5
    assert (naive - target).abs().max().item() > 1e-2


def test_dynamic_ntk_is_refused() -> None:
    model = tiny_model("llama", rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})
    with pytest.raises(UnsupportedModelError, match="dynamic"):
        RopeTable(model.model.rotary_emb, model.config, torch.device("cpu"))


def test_partial_rotary_leaves_pass_through_channels() -> None:
    k = torch.randn(2, 5, 8)
    cos, sin = torch.rand(5, 4), torch.rand(5, 4)
    out = apply_rope(k, cos, sin)
    assert torch.equal(out[..., 4:], k[..., 4:])
    expected = k[..., :4] * cos + rotate_half(k[..., :4]) * sin
    assert torch.allclose(out[..., :4], expected, atol=0, rtol=0)


def test_rotate_half_layout() -> None:
    assert rotate_half(torch.tensor([1.0, 2.0, 3.0, 4.0])).tolist() == [-3.0, -4.0, 1.0, 2.0]
