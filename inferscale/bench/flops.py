"""Prefill FLOPs of a decoder-only transformer: how much of a query's prefill grows with the memory behind it.

With KV injection the model prefills only the Q query tokens, but each of them attends to the P + S cached
tokens (system prefix and memory segment) before it. Per query token:

- the linear layers (q/k/v/o projections and the MLP of every layer) cost ``2 · N_linear`` FLOPs, where
  ``N_linear`` counts the weights of every ``nn.Linear`` inside the decoder layers (embeddings and the LM head
  excluded);
- attention costs ``4 · L · H · d`` FLOPs per key it attends to (QKᵀ and PV, ``2·d`` each, for each of the H
  query heads of each of the L layers; grouped K/V heads do not reduce it);
- the LM head projects only the last position (``2 · hidden · vocab``, once per prefill).

The ratio of these FLOPs at two memory sizes is how much the query's prefill time grows between them on a device
where it is compute-bound and attention runs at the matmuls' efficiency (retrieval and K/V assembly, which also
grow with k, come on top). Mixture-of-experts layers are counted with every expert, and sliding windows are
ignored: the coefficients are meant for dense full-attention decoders. A small model makes it
large: SmolLM2-135M's attention costs 69 kFLOP per query token per key against 212 MFLOP of linear layers, so
1,300 memory tokens add ~43 % to every query token's prefill; Llama-3.1-8B's add ~5 %.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

__all__ = ["PrefillCost", "prefill_cost"]


@dataclass(frozen=True)
class PrefillCost:
    """FLOP coefficients of one model's prefill.

    Attributes:
        linear_per_token: FLOPs of the decoder layers' linear layers per token (``2 · N_linear``).
        attention_per_key: FLOPs per (query token, attended key) pair over all layers (``4 · L · H · d``).
        lm_head: FLOPs of projecting one position onto the vocabulary (``2 · hidden · vocab``).
    """

    linear_per_token: float
    attention_per_key: float
    lm_head: float

    def flops(self, query_tokens: int, cached_tokens: int) -> float:
        """FLOPs of prefilling ``query_tokens`` after ``cached_tokens`` cached ones (token i of the query attends
        to the cache and to query tokens 0..i), with the LM head on the last position only."""
        if query_tokens < 0 or cached_tokens < 0:
            raise ValueError("token counts must be >= 0")
        if query_tokens == 0:
            return 0.0  # nothing to prefill
        keys = query_tokens * cached_tokens + query_tokens * (query_tokens + 1) // 2
        return query_tokens * self.linear_per_token + keys * self.attention_per_key + self.lm_head


def prefill_cost(model: nn.Module) -> PrefillCost:
    """The :class:`PrefillCost` of a transformers causal LM (``model.model.layers``, ``model.config``).

    Raises:
        ValueError: when the model has no ``model.layers`` or its config lacks the attention sizes.
    """
    backbone: Any = getattr(model, "model", model)
    layers = getattr(backbone, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no model.layers")
    config: Any = model.config
    n_heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // n_heads)
    linear = sum(m.weight.numel() for layer in layers for m in layer.modules() if isinstance(m, nn.Linear))
    return PrefillCost(
        linear_per_token=2.0 * linear,
        attention_per_key=4.0 * len(layers) * n_heads * head_dim,
        lm_head=2.0 * int(config.hidden_size) * int(config.vocab_size),
    )
