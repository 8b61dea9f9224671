"""Chunked RoPE: re-rotated pre-RoPE keys equal keys computed at the target position, for every supported
architecture and rope type; unsupported layouts and rope types are refused with a clear error."""

from __future__ import annotations

import functools
import math
from typing import Any

import pytest
import torch
from tiny_models import LONGROPE_ORIGINAL_MAX, SUPPORTED_ARCHS, TINY, tiny_config, tiny_model

from inferscale.errors import UnsupportedModelError
from inferscale.kv import EncodeRequest, FactEncoder, RopeTable, apply_rope, max_static_position, rotate_half
from inferscale.kv.rope_probe import verify_rerotation

CPU = torch.device("cpu")
DEEP_LAYER_TOLERANCE = {"gemma3": 1e-4}
"""Bound on layers >= 1 after a ~1000-position move, where it differs from 5e-5 (see the first test)."""


@functools.cache
def _model(arch: str) -> Any:
    """One tiny model per architecture for the whole module (read-only in these tests)."""
    return tiny_model(arch)


def _hf_keys_at(model: torch.nn.Module, ids: list[int], start: int) -> torch.Tensor:
    """Post-RoPE keys ``[L, n_kv, T, hd]`` that transformers caches for ``ids`` placed at ``start``."""
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor([ids]), position_ids=torch.arange(start, start + len(ids))[None], use_cache=True
        )
    return torch.stack([layer.keys[0] for layer in out.cache.layers])


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(3, 250, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("arch", SUPPORTED_ARCHS)
@pytest.mark.parametrize(("a", "b"), [(0, 37), (5, 1000), (129, 3)])
def test_rerotated_keys_equal_keys_captured_at_target(arch: str, a: int, b: int) -> None:
    model = _model(arch)
    ids = _ids(11, a + b)
    if arch == "llama_longrope":  # static only below original_max_position_embeddings
        b = min(b, LONGROPE_ORIGINAL_MAX - len(ids))
    table = RopeTable.from_model(model)
    fact = FactEncoder(model).encode([EncodeRequest(ids)])[0]
    captured_at_a = _hf_keys_at(model, ids, a)
    captured_at_b = _hf_keys_at(model, ids, b)
    assert (table.rotate(fact.keys, a) - captured_at_a).abs().max().item() <= 1e-5
    moved = table.rotate(fact.keys, b)
    # Layer 0's keys are a pure function of (token, position): the rotation itself must match to 1e-5.
    assert (moved[0] - captured_at_b[0]).abs().max().item() <= 1e-5
    # Deeper layers also carry the reference's own noise: transformers computes the angles p·θ in float32, so
    # attention at far positions is rounded differently (|b - a| ~1000 gives 1.9e-5 on qwen3 and 7.9e-5 on
    # gemma3, whose scaled embeddings and sandwich norms amplify it; with float64 weights *and* float64 angles the
    # same comparison is exactly 0, so none of it is the rotation's).
    assert (moved - captured_at_b).abs().max().item() <= DEEP_LAYER_TOLERANCE.get(arch, 5e-5)
    # Two targets give two different tensors: no rotation computed for one offset is reused for another.
    assert (moved - table.rotate(fact.keys, a)).abs().max().item() > 1e-3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("arch", SUPPORTED_ARCHS)
def test_rotation_is_bit_identical_to_the_models_own_in_its_dtype(arch: str, dtype: torch.dtype) -> None:
    # Layer 0's pre-RoPE keys depend on the tokens only, so rotating them to position b must reproduce, bit for bit,
    # the keys the model caches when it prefills the same tokens at b: the rotation uses the model's rows cast to
    # the model's dtype and rounds each product and the sum in that dtype, as transformers' apply_rotary_pos_emb does.
    model = tiny_model(arch).to(dtype)
    ids = _ids(13, 7)
    b = 301 if arch != "llama_longrope" else LONGROPE_ORIGINAL_MAX - len(ids)
    table = RopeTable.from_model(model)
    fact = FactEncoder(model).encode([EncodeRequest(ids)])[0]
    assert fact.keys.dtype == dtype
    moved = table.rotate(fact.keys, b)
    target = _hf_keys_at(model, ids, b)
    assert torch.equal(moved[0], target[0])
    # In-place rotation (the assembly path rotates inside the cache buffer) gives the same bits.
    in_place = fact.keys.clone()
    table.rotate(in_place, b, out=in_place)
    assert torch.equal(in_place, moved)
    # And the float32 arithmetic of earlier versions does not: it rounds once instead of per operation.
    if dtype != torch.float32:
        cos, sin = table.slice(b, len(ids))
        if cos.dim() == 3:  # per-layer rows (gemma3): layer 0's
            cos, sin = cos[0], sin[0]
        x = fact.keys[0].float()
        half = cos.shape[-1] // 2
        rot = cos.shape[-1]
        upcast = x.clone()
        upcast[..., :rot] = x[..., :rot] * cos + torch.cat((-x[..., half:rot], x[..., :half]), -1) * sin
        assert not torch.equal(upcast.to(dtype), target[0])


def test_public_constructor_matches_from_model() -> None:
    """``RopeTable(rotary, config, device)`` (the engine's call) gives the same rows as ``from_model``."""
    for arch in ("llama", "gemma3"):
        model = _model(arch)
        plain = RopeTable(model.model.rotary_emb, model.config, CPU)
        found = RopeTable.from_model(model, CPU)
        assert plain.layer_types == found.layer_types
        for x, y in zip(plain.slice(7, 5), found.slice(7, 5), strict=True):
            assert torch.equal(x, y)


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
    ours = RopeTable(model.model.rotary_emb, model.config, CPU).rotate(fact.keys, b)
    naive = RopeTable(plain.model.rotary_emb, plain.config, CPU).rotate(fact.keys, b)
    assert (ours - target).abs().max().item() <= 1e-5
    assert (naive - target).abs().max().item() > 1e-2


def test_yarn_attention_factor_is_applied_once_as_transformers_does() -> None:
    """yarn scales cos and sin by its attention factor (default 0.1·ln(factor) + 1); the cached key carries it once."""
    model = _model("llama_yarn")
    factor = model.config.rope_parameters["factor"]
    expected = 0.1 * math.log(factor) + 1.0
    assert model.model.rotary_emb.attention_scaling == pytest.approx(expected)
    table = RopeTable.from_model(model)
    cos, sin = table.slice(0, 300)
    assert torch.allclose(cos**2 + sin**2, torch.full_like(cos, expected**2), atol=1e-5)
    ids = _ids(9, 1)
    fact = FactEncoder(model).encode([EncodeRequest(ids)])[0]
    target = _hf_keys_at(model, ids, 200)
    assert (table.rotate(fact.keys, 200)[0] - target[0]).abs().max().item() <= 1e-5
    # Leaving the factor out (or applying it twice) is measurably wrong.
    unscaled = apply_rope(fact.keys[0], *(t / expected for t in table.slice(200, len(ids))))
    twice = apply_rope(fact.keys[0], *(t * expected for t in table.slice(200, len(ids))))
    assert (unscaled - target[0]).abs().max().item() > 1e-2
    assert (twice - target[0]).abs().max().item() > 1e-2


def test_longrope_is_static_below_its_original_context_and_refused_past_it() -> None:
    model = tiny_model("llama_longrope")
    table = RopeTable.from_model(model)
    assert table.max_positions == LONGROPE_ORIGINAL_MAX == max_static_position(model.config)
    ids = _ids(6, 2)
    fact = FactEncoder(model).encode([EncodeRequest(ids)])[0]
    last_static = LONGROPE_ORIGINAL_MAX - len(ids)
    target = _hf_keys_at(model, ids, last_static)
    assert (table.rotate(fact.keys, last_static)[0] - target[0]).abs().max().item() <= 1e-5
    # longrope's attention factor (sqrt(1 + ln 8 / ln 256)) is in the rows.
    cos, sin = table.slice(0, 4)
    assert (cos**2 + sin**2).sqrt().mean().item() == pytest.approx(math.sqrt(1 + math.log(8) / math.log(256)))
    with pytest.raises(UnsupportedModelError, match="original_max_position_embeddings=256"):
        table.rotate(fact.keys, last_static + 1)
    # Why: once a sequence passes the bound transformers switches every position to the long factors, so the
    # same token at the same position gets another key depending on the sequence length.
    longer = _hf_keys_at(model, [*ids, 3], last_static)[:, :, : len(ids)]
    assert (longer[0] - target[0]).abs().max().item() > 1e-2


def test_partial_rotary_passes_the_tail_channels_through() -> None:
    for arch in ("stablelm", "phi"):
        model = _model(arch)
        table = RopeTable.from_model(model)
        head_dim = model.config.hidden_size // model.config.num_attention_heads
        assert table.rotary_dim == head_dim // 2 == 8
        ids = _ids(7, 3)
        fact = FactEncoder(model).encode([EncodeRequest(ids)])[0]
        target = _hf_keys_at(model, ids, 300)
        moved = table.rotate(fact.keys, 300)
        assert torch.equal(moved[..., 8:], fact.keys[..., 8:])
        assert (moved[0] - target[0]).abs().max().item() <= 1e-5


def test_gemma3_uses_each_layer_types_own_table() -> None:
    model = _model("gemma3")
    table = RopeTable.from_model(model)
    assert table.layer_types == ("sliding_attention", "full_attention", "sliding_attention")
    cos, sin = table.slice(50, 4)
    assert cos.shape == sin.shape == (3, 4, 16)
    assert torch.equal(cos[0], cos[2])
    assert (cos[0] - cos[1]).abs().max().item() > 1e-2  # base 10k vs base 1M with linear factor 8
    ids = _ids(8, 4)
    fact = FactEncoder(model).encode([EncodeRequest(ids)])[0]
    target = _hf_keys_at(model, ids, 500)
    ours = table.rotate(fact.keys, 500)
    assert (ours[0] - target[0]).abs().max().item() <= 1e-5
    assert (ours - target).abs().max().item() <= 5e-5
    # One shared table (the sliding layers') would rotate the global layer wrongly.
    rows_cos, rows_sin = table.slice(500, len(ids))
    one_table = apply_rope(fact.keys, rows_cos[0], rows_sin[0])
    assert (one_table[1] - target[1]).abs().max().item() > 1e-2
    with pytest.raises(ValueError, match="layer"):
        table.rotate(fact.keys[:2], 500)


@pytest.mark.parametrize("arch", ["gemma3", "stablelm", "qwen3"])
def test_capture_when_fact_length_equals_kv_heads(arch: str) -> None:
    """[B, T, n_kv, hd] and [B, n_kv, T, hd] key-norm outputs look alike when T == n_kv: the encoder pads."""
    model = _model(arch)
    ids = _ids(model.config.num_key_value_heads, 5)
    fact = FactEncoder(model).encode([EncodeRequest(ids)])[0]
    target = _hf_keys_at(model, ids, 40)
    assert fact.keys.shape[2] == len(ids)
    assert (RopeTable.from_model(model).rotate(fact.keys, 40) - target).abs().max().item() <= 1e-5


def test_dynamic_ntk_is_refused() -> None:
    model = tiny_model("llama", rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})
    with pytest.raises(UnsupportedModelError, match="dynamic"):
        RopeTable(model.model.rotary_emb, model.config, CPU)


def test_dynamic_ntk_on_one_layer_type_is_refused() -> None:
    rope = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1000000.0},
    }
    with pytest.raises(UnsupportedModelError, match=r"dynamic.*full_attention"):
        max_static_position(tiny_config("gemma3", rope_parameters=rope))


def test_interleaved_rotary_table_is_refused() -> None:
    """Cohere's rotary module interleaves its cos/sin rows (GPT-J layout): refused by the table itself."""
    model = tiny_model("cohere")
    with pytest.raises(UnsupportedModelError, match="interleaved"):
        RopeTable(model.model.rotary_emb, model.config, CPU)


def test_interleaved_attention_code_is_refused_by_the_end_to_end_check() -> None:
    """GLM's table looks rotate-half but its attention pairs channels (2i, 2i+1): only the probe can see it."""
    model = tiny_model("glm")
    table = RopeTable(model.model.rotary_emb, model.config, CPU)  # the table alone cannot tell
    with pytest.raises(UnsupportedModelError, match="interleaved"):
        verify_rerotation(model, table)
    with pytest.raises(UnsupportedModelError, match="interleaved"):
        RopeTable.from_model(model)


def test_fused_qkv_is_refused() -> None:
    model = tiny_model("phi3")
    with pytest.raises(UnsupportedModelError, match="fused"):
        FactEncoder(model)
    with pytest.raises(UnsupportedModelError, match="fused"):
        RopeTable.from_model(model)


def test_partial_rotary_leaves_pass_through_channels() -> None:
    k = torch.randn(2, 5, 8)
    cos, sin = torch.rand(5, 4), torch.rand(5, 4)
    out = apply_rope(k, cos, sin)
    assert torch.equal(out[..., 4:], k[..., 4:])
    expected = k[..., :4] * cos + rotate_half(k[..., :4]) * sin
    assert torch.allclose(out[..., :4], expected, atol=0, rtol=0)


def test_rotate_half_layout() -> None:
    assert rotate_half(torch.tensor([1.0, 2.0, 3.0, 4.0])).tolist() == [-3.0, -4.0, 1.0, 2.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_olmo2_keys_are_rotated_in_float32_as_the_model_does_bit_for_bit(dtype: torch.dtype) -> None:
    """OLMo 2's rotary module returns float32 rows for a bfloat16 model, so its attention rotates each key in float32
    and casts it back. Rotated in bfloat16, as Llama's keys are, the re-rotated keys were 6.1e-3 (relative) from the
    model's own: inside verify_rerotation's bfloat16 tolerance, so only an exact check sees it."""
    import transformers

    torch.manual_seed(0)
    config = transformers.Olmo2Config(**{**TINY, "eos_token_id": None, "pad_token_id": None})
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval().to(dtype)
    assert verify_rerotation(model, RopeTable.from_model(model)) == 0.0
    llama = tiny_model("llama").to(dtype)  # rows in the key's dtype: rotated in it
    assert verify_rerotation(llama, RopeTable.from_model(llama)) == 0.0
