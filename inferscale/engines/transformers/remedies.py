"""The request-time fidelity remedies of the transformers engine (:mod:`inferscale.kv.serving`).

- :class:`MemoryBias` and :func:`bias_mask`: the memory attention scale s, as log s added to the memory columns'
  attention logits of the query and every decoded token (APE's scaling factor);
- :func:`recompute_slots`: recompute chosen memory tokens in place, each attending to every slot before it
  (CacheBlend-style selective recompute, or the structural and head/tail policies of
  :mod:`inferscale.kv.recompute`);
- :func:`check_remedies`: refuse them on models whose attention they would change in another way.

The temperature T needs no code here: the memory keys are divided by T in the cache
(:meth:`~inferscale.engines.transformers.cache.PreallocatedCache.divide_keys`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from inferscale.engines.transformers.cache import PreallocatedCache
from inferscale.errors import UnsupportedModelError
from inferscale.kv.encode import sliding_window
from inferscale.kv.serving import ServingSettings


@dataclass(frozen=True, slots=True)
class MemoryBias:
    """The memory attention scale of one request: ``logit_bias`` = log s added to the attention logits of the
    query and every decoded token on the memory slots ``[start, end)`` (APE's scaling factor)."""

    start: int
    end: int
    logit_bias: float


def bias_mask(
    cache_length: int, n_new: int, bias: MemoryBias | None, dtype: torch.dtype, device: torch.device
) -> torch.Tensor | None:
    """``[1, 1, n_new, cache_length + n_new]`` float mask adding ``bias.logit_bias`` (log s) to the memory
    columns ``[bias.start, bias.end)`` and masking future columns among the new tokens; ``None`` without a
    bias (the model then builds its own causal mask)."""
    if bias is None:
        return None
    mask = torch.zeros((n_new, cache_length + n_new), dtype=dtype, device=device)
    mask[:, bias.start : bias.end] = bias.logit_bias
    if n_new > 1:
        future = torch.ones((n_new, n_new), dtype=torch.bool, device=device).triu(1)
        mask[:, cache_length:].masked_fill_(future, torch.finfo(dtype).min)
    return mask[None, None]


def check_remedies(config: Any, settings: ServingSettings) -> None:
    """Refuse request-time remedies on models whose attention a full 4-D mask would change (sliding windows)
    or whose logits are soft-capped (the probe and the bias assume plain softmax attention).

    Raises:
        UnsupportedModelError: naming the model feature and the setting.
    """
    if settings.is_pure_injection:
        return
    sliding = sliding_window(config) is not None
    capped = getattr(config, "attn_logit_softcapping", None) is not None
    if sliding or capped:
        feature = "sliding-window attention" if sliding else "attention logit soft-capping"
        raise UnsupportedModelError(
            f"{settings.label()} needs plain full attention, but this model uses {feature}; serve it with "
            "kv.memory_attention_scale=1, kv.memory_temperature=1 and kv.recompute='none'"
        )


def recompute_slots(
    model: Any, cache: PreallocatedCache, token_ids: torch.Tensor, slots: Sequence[int], length: int
) -> None:
    """Recompute the memory tokens at ``slots`` (ascending) in place, in one forward pass.

    Each recomputed token attends, at its true position, to every slot before it: the injected K/V of the slots
    not recomputed and the fresh K/V of the recomputed ones (and itself). Its new K/V then replace the injected
    ones (:meth:`PreallocatedCache.move_tail`). With every memory slot chosen this is exactly a full prefill of
    the memory segment (prompt mode). Cost: ``len(slots)`` prefill tokens attending up to ``P + S`` keys.

    Args:
        token_ids: ``[P + S]`` int64: the tokens the cache's slots stand for.
        slots: cache positions to recompute, each in ``[P, P + S)``.
        length: P + S, the filled slots.
    """
    device = next(model.parameters()).device
    pos = torch.tensor(list(slots), dtype=torch.long, device=device)
    cols = torch.arange(length, device=device)
    stale = torch.zeros(length, dtype=torch.bool, device=device)
    stale[pos] = True  # slots whose fresh K/V are in the recomputed block
    allowed_cache = (cols[None, :] < pos[:, None]) & ~stale[None, :]  # [q, length]
    allowed_fresh = pos[None, :] <= pos[:, None]  # [q, q]
    allowed = torch.cat([allowed_cache, allowed_fresh], dim=1)
    dtype = next(model.parameters()).dtype
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    model.model(
        input_ids=token_ids[pos.cpu()][None].to(device),
        position_ids=pos[None],
        attention_mask=mask[None, None],
        cache=cache,
        use_cache=True,
    )
    cache.move_tail(length, pos)
