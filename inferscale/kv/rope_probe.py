"""The self-probe: one forward pass that checks a :class:`~inferscale.kv.rope.RopeTable` against the model's own
attention code, end to end (captured pre-RoPE keys, rotated by the table, must equal the keys the model caches).

It refuses what the table alone cannot see: attention code that pairs channels differently from its table (GLM
interleaves a rotate-half-looking table), norms or transforms that are not hooked, and key/value mismatches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from inferscale.errors import UnsupportedModelError

if TYPE_CHECKING:
    from inferscale.kv.rope import RopeTable


def _probe_tolerance(dtype: torch.dtype) -> float:
    """Relative tolerance of the rotation check: a few rounding steps of ``dtype``, and at least 1e-5."""
    return max(1e-5, 8 * torch.finfo(dtype).eps)


def verify_rerotation(model: nn.Module, table: RopeTable, n_tokens: int = 8, start: int = 97) -> float:
    """Check end to end that captured pre-RoPE keys, rotated by ``table``, equal the keys the model caches.

    One forward pass over ``n_tokens`` fixed tokens at positions ``start ..`` (nonzero, so that every rotation
    angle matters; lowered to fit a ``longrope`` bound) with :class:`~inferscale.kv.encode.PreRopeCapture` hooks
    and ``use_cache=True``. For every layer, ``table.rotate(captured_keys, start)`` must equal the cached keys, and
    the captured values the cached values, to a few rounding steps of the model dtype relative to the largest
    cached key (1e-5 in float32, 0.0625 in bfloat16). A wrong layout gives an O(1) relative error. This refuses
    what the table alone cannot see: attention code that pairs channels differently from its table (GLM
    interleaves a rotate-half-looking table), norms or transforms we do not hook, and key/value mismatches.

    Args:
        model: a transformers causal LM with ``model.model.layers[i].self_attn.{k_proj, v_proj}``.
        table: the model's :class:`RopeTable`.
        n_tokens: probe length (tokens); must differ from the number of KV heads.
        start: first probe position.

    Returns:
        The largest relative error seen (float).

    Raises:
        UnsupportedModelError: when a layer's keys or values do not match (or the model's structure is refused by
            :func:`~inferscale.kv.encode.decoder_attention_modules`).
    """
    from inferscale.kv.encode import PreRopeCapture, decoder_attention_modules, kv_head_shape, model_config

    attn = decoder_attention_modules(model)
    backbone = getattr(model, "model", model)
    config = model_config(model)
    n_kv, head_dim = kv_head_shape(config)
    if n_tokens == n_kv:
        n_tokens += 1
    if table.max_positions is not None:
        start = max(1, min(start, table.max_positions - n_tokens))
    parameter = next(model.parameters())
    ids = (torch.arange(n_tokens) * 7919 + 11) % int(config.vocab_size)
    positions = torch.arange(start, start + n_tokens)
    with torch.no_grad(), PreRopeCapture(attn, n_kv, head_dim, n_tokens) as capture:
        out = backbone(
            input_ids=ids[None].to(parameter.device),
            attention_mask=torch.ones(1, n_tokens, dtype=torch.long, device=parameter.device),
            position_ids=positions[None].to(parameter.device),
            use_cache=True,
        )
        keys, values = capture.stacked()
    cache = getattr(out, "cache", None)
    if cache is None:
        cache = out.past_key_values
    rotated = table.rotate(keys[:, 0].to(table.device), start)
    tolerance = _probe_tolerance(parameter.dtype)
    worst = 0.0
    for layer, cached in enumerate(cache.layers):
        cached_k, cached_v = cached.keys[0].float(), cached.values[0].float()
        kept = cached_k.shape[-2]  # sliding-window layers may keep fewer than n_tokens
        scale_k = max(cached_k.abs().max().item(), 1e-6)
        scale_v = max(cached_v.abs().max().item(), 1e-6)
        err_k = (rotated[layer, :, n_tokens - kept :].float().to(cached_k.device) - cached_k).abs().max().item()
        err_v = (values[layer, 0, :, n_tokens - kept :].float() - cached_v).abs().max().item()
        rel_k, rel_v = err_k / scale_k, err_v / scale_v
        worst = max(worst, rel_k, rel_v)
        if rel_k > tolerance or rel_v > tolerance:
            raise UnsupportedModelError(
                f"{type(model).__name__} layer {layer}: captured pre-RoPE keys rotated by chunked RoPE differ from "
                f"the model's cached keys (relative error {rel_k:.3g}, values {rel_v:.3g}, tolerance {tolerance:.3g}). "
                "Its attention does not apply rotate-half RoPE to k_proj/k_norm outputs (e.g. interleaved GPT-J "
                "style pairs, as in GLM or Cohere), so injected keys would be silently wrong"
            )
    return worst
