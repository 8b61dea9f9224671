"""SDPA attention that keeps grouped-query K/V grouped when a mask is present.

transformers' ``sdpa`` attention repeats each K/V head ``n_heads / n_kv_heads`` times whenever an attention mask is
passed (every prefill on top of a cache has one), copying the whole cache per layer per forward. With injected
memory the cache is long and the query short, so that copy and the wider matmuls are most of the query's prefill
on a CPU. ``torch.nn.functional.scaled_dot_product_attention(..., enable_gqa=True)`` (torch >= 2.5) reads the
grouped heads directly and gives the same result.

Registered with transformers under :data:`SDPA_GQA` (with the same mask builder as ``sdpa``), so a model loaded
with ``attn_implementation=SDPA_GQA`` uses it; anything this function does not cover falls back to ``sdpa``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

SDPA_GQA = "inferscale_sdpa_gqa"


class QueryAttentionProbe:
    """Records, during one forward pass, the attention mass the new tokens put on a span of cache slots.

    Used as a context manager around a probe prefill of the query: every layer running :func:`sdpa_gqa_attention`
    adds ``softmax(q·kᵀ·scale + mask)`` summed over heads and query tokens, on columns ``[start, end)``, to
    :meth:`scores`. Selective recompute (``selective:r``) ranks memory tokens by it.

    Args:
        start, end: the cache slots to score (the memory segment ``[P, P + S)``).
    """

    def __init__(self, start: int, end: int) -> None:
        self._start, self._end = start, end
        self._scores: torch.Tensor | None = None
        self._token: Any = None

    def __enter__(self) -> QueryAttentionProbe:
        self._token = _ACTIVE_PROBE.set(self)
        return self

    def __exit__(self, *_exc: object) -> None:
        _ACTIVE_PROBE.reset(self._token)

    def record(self, query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, scaling: float | None) -> None:
        """Add one layer's attention on the span. query ``[1, n_heads, q, hd]``, key ``[1, n_kv_heads, kv, hd]``."""
        groups = query.shape[1] // key.shape[1]
        keys = key.repeat_interleave(groups, dim=1) if groups > 1 else key
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        logits = torch.matmul(query.float(), keys.float().transpose(-1, -2)) * scale
        if mask is not None:
            mask = mask[:, :, :, : key.shape[-2]]
            logits = logits.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else logits + mask.float()
        else:
            q, kv = logits.shape[-2], logits.shape[-1]
            future = torch.ones((q, kv), dtype=torch.bool, device=logits.device).triu(kv - q + 1)
            logits = logits.masked_fill(future, float("-inf"))
        mass = logits.softmax(dim=-1)[..., self._start : self._end].sum(dim=(0, 1, 2))
        self._scores = mass if self._scores is None else self._scores + mass

    def scores(self) -> torch.Tensor:
        """``[end - start]`` float32 on the CPU: the recorded mass per slot.

        Raises:
            RuntimeError: when no layer recorded anything (the model did not run :func:`sdpa_gqa_attention`).
        """
        if self._scores is None:
            raise RuntimeError("no attention was recorded: run the probe under routed_through_sdpa_gqa(model)")
        return self._scores.cpu()


@contextmanager
def routed_through_sdpa_gqa(model: nn.Module) -> Iterator[None]:
    """Run ``model``'s attention through :func:`sdpa_gqa_attention` inside the block, whatever kernel it was
    loaded with (so a :class:`QueryAttentionProbe` sees every layer), and restore the kernel after, also on an
    exception. The switch is on the model's config, which its layers share: blocks on one model are serialised by
    a process-wide lock, but a forward pass of the same model on another thread without this block would see the
    switched kernel (the engines serialise their requests, so they never do that)."""
    config: Any = model.config  # a transformers PretrainedConfig (nn.Module.__getattr__ types it as a submodule)
    with _SWITCH_LOCK:
        saved = config._attn_implementation
        config._attn_implementation = register_sdpa_gqa()
        try:
            yield
        finally:
            config._attn_implementation = saved


_SWITCH_LOCK = threading.RLock()


_ACTIVE_PROBE: ContextVar[QueryAttentionProbe | None] = ContextVar("inferscale_attention_probe", default=None)


def sdpa_gqa_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention for one layer.

    Args:
        query: ``[B, n_heads, q, head_dim]``; key, value: ``[B, n_kv_heads, kv, head_dim]``.
        attention_mask: ``[B, 1, q, >= kv]`` (bool: True attends; or float, added) or ``None``.

    Returns:
        ``([B, q, n_heads, head_dim], None)``, as transformers' attention functions return.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    probe = _ACTIVE_PROBE.get()
    if probe is not None:
        probe.record(query, key, attention_mask, scaling)
    groups = getattr(module, "num_key_value_groups", 1)
    unsupported = kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None
    if groups == 1 or unsupported or kwargs.get("output_attentions", False):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs)
    if attention_mask is not None and attention_mask.dim() == 4:
        attention_mask = attention_mask[:, :, :, : key.shape[-2]]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout if module.training else 0.0,
        scale=scaling,
        is_causal=bool(query.shape[2] > 1 and attention_mask is None and causal),
        enable_gqa=True,
    )
    return out.transpose(1, 2).contiguous(), None


def register_sdpa_gqa() -> str:
    """Register :func:`sdpa_gqa_attention` with transformers (idempotent); returns its name, :data:`SDPA_GQA`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(SDPA_GQA, sdpa_gqa_attention)
    AttentionMaskInterface.register(SDPA_GQA, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    return SDPA_GQA


def resolve_attention(name: str) -> str:
    """The transformers ``attn_implementation`` for a config value: ``"sdpa_gqa"`` registers and names
    :func:`sdpa_gqa_attention`; ``"sdpa"``/``"eager"`` pass through."""
    return register_sdpa_gqa() if name == "sdpa_gqa" else name
