"""How injected memory is served: the training-free fidelity remedies applied at request time.

Pure injection reproduces a block-diagonal prefill exactly (paper, Theorem 3), which differs from pasting the facts
as text: each fact grew its own attention sink and never attended to the facts before it. These settings move the
served cache back towards the pasted one (measured by ``inferscale eval fidelity``; see docs/architecture.md):

- ``attention_scale`` s: the memory block's share of attention is scaled by s for the query and every decoded
  token, by adding ``log s`` to the memory columns' attention logits (APE, Yang et al. 2025, §3.3: the scaling
  factor that counters the inflated mass of parallel-encoded blocks);
- ``temperature`` T: the memory columns' logits are divided by T (APE's attention temperature), realised by
  scaling the injected keys by ``1/T``;
- ``recompute``: which memory tokens are prefilled again with attention to everything before them
  (:mod:`inferscale.kv.recompute`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from inferscale.kv.recompute import RecomputePolicy


@dataclass(frozen=True, slots=True)
class ServingSettings:
    """Request-time treatment of the injected memory segment.

    Attributes:
        attention_scale: s > 0; 1 leaves attention unchanged.
        temperature: T > 0; 1 leaves the memory logits unchanged.
        recompute: the selective-recompute policy.

    Raises:
        ValueError: for s or T not > 0.
    """

    attention_scale: float = 1.0
    temperature: float = 1.0
    recompute: RecomputePolicy = field(default_factory=RecomputePolicy)

    def __post_init__(self) -> None:
        if not self.attention_scale > 0 or not math.isfinite(self.attention_scale):
            raise ValueError(f"attention_scale must be a finite number > 0, got {self.attention_scale}")
        if not self.temperature > 0 or not math.isfinite(self.temperature):
            raise ValueError(f"temperature must be a finite number > 0, got {self.temperature}")

    @property
    def memory_logit_bias(self) -> float:
        """``log s``: added to every memory column's attention logit of the query and decoded tokens."""
        return math.log(self.attention_scale)

    @property
    def is_pure_injection(self) -> bool:
        """Whether these settings serve exactly the block-diagonal prefill (no scale, temperature or recompute)."""
        return self.attention_scale == 1.0 and self.temperature == 1.0 and self.recompute.kind == "none"

    def label(self) -> str:
        """A short name for tables, e.g. ``"s=0.35 T=1 recompute=structure"``."""
        return f"s={self.attention_scale:g} T={self.temperature:g} recompute={self.recompute}"


def nearest_bucket(offset: int, buckets: Sequence[int]) -> int:
    """The encoding distance (position-aware encoding) for a fact served ``offset`` tokens after the system
    prefix: the bucket closest to ``offset``, the smaller one on a tie.

    Raises:
        ValueError: when ``buckets`` is empty.
    """
    if not buckets:
        raise ValueError("position buckets must not be empty")
    return min(buckets, key=lambda b: (abs(b - offset), b))


def bucket_per_fact(fact_lengths: Sequence[int], buckets: Sequence[int]) -> list[int]:
    """:func:`nearest_bucket` of each fact laid contiguously after the prefix (offsets are running sums of the
    lengths, in tokens)."""
    out = []
    offset = 0
    for n in fact_lengths:
        out.append(nearest_bucket(offset, buckets))
        offset += n
    return out


def gap_for_bucket(bucket: int, context_tokens: int) -> int:
    """The :attr:`~inferscale.kv.encode.EncodeRequest.position_gap` that puts a fact ``bucket`` tokens after the
    system prefix when ``context_tokens`` tokens (its context turns) already stand between them; 0 when the
    context alone is longer."""
    return max(0, bucket - context_tokens)
