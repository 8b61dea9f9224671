"""Which injected memory tokens are prefilled again at serve time (selective recompute).

Injected fact K/V never saw the facts laid before them (paper, Theorem 3: injection equals a block-diagonal
prefill). Recomputing a few chosen memory tokens, each attending to everything laid out before it, lets those
tokens carry the cross-fact context again; with every token chosen it is exactly prompt injection. The policies:

- ``none``: pure injection (the block-diagonal guarantee holds exactly);
- ``head:m``: each fact's first ``m`` tokens, where a standalone fact grows its own attention sink;
- ``tail:n``: the memory segment's last ``n`` tokens, right before the query (the one span a prefix-claiming KV
  connector such as vLLM's can leave to the engine);
- ``structure``: each fact line's layout tokens, the bullet that opens it and the newline that closes it, found in
  that line's own tokens (:class:`FactLineLayout`), independent of what the fact says;
- ``selective:r``: the ``r`` percent of memory tokens the query attends to most (CacheBlend-style selection, with
  the query's attention as the score, Yao et al. 2024, §4.2), found by one probe prefill of the query.

Slots are absolute cache positions (the system prefix holds slots ``0 .. P-1``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from inferscale.errors import ConfigError

RecomputeKind = Literal["none", "head", "tail", "structure", "selective"]

_SPEC = re.compile(r"^(none|structure|(head|tail):(\d+)|selective:(\d+(?:\.\d+)?))$")


@dataclass(frozen=True, slots=True)
class RecomputePolicy:
    """A parsed ``kv.recompute`` setting.

    Attributes:
        kind: ``"none"``, ``"head"``, ``"tail"``, ``"structure"`` or ``"selective"``.
        amount: ``m`` tokens per fact for ``head``; ``n`` tokens for ``tail``; ``r`` percent of the memory tokens
            for ``selective`` (0 < r <= 100); 0 otherwise.
    """

    kind: RecomputeKind = "none"
    amount: float = 0.0

    @classmethod
    def parse(cls, spec: str) -> RecomputePolicy:
        """``"none"``, ``"head:m"``, ``"tail:n"``, ``"structure"`` or ``"selective:r"`` → a policy.

        Raises:
            ConfigError: for any other text, ``m`` or ``n`` < 1, or ``r`` outside (0, 100].
        """
        match = _SPEC.match(spec.strip())
        if match is None:
            raise ConfigError(
                f"kv.recompute {spec!r} is not one of 'none', 'head:M' (tokens per fact), 'tail:N' (last memory "
                "tokens), 'structure' or 'selective:R' (percent of memory tokens)"
            )
        if match.group(2) is not None:
            kind: RecomputeKind = "head" if match.group(2) == "head" else "tail"
            m = int(match.group(3))
            if m < 1:
                letter = "m" if kind == "head" else "n"
                raise ConfigError(f"kv.recompute '{kind}:{m}' needs {letter} >= 1; use 'none' for pure injection")
            return cls(kind, float(m))
        if match.group(4) is not None:
            r = float(match.group(4))
            if not 0 < r <= 100:
                raise ConfigError(f"kv.recompute 'selective:{r:g}' needs 0 < r <= 100 (percent)")
            return cls("selective", r)
        return cls("none") if match.group(1) == "none" else cls("structure")

    def __str__(self) -> str:
        if self.kind in ("head", "tail"):
            return f"{self.kind}:{int(self.amount)}"
        if self.kind == "selective":
            return f"selective:{self.amount:g}"
        return self.kind

    @property
    def keeps_block_diagonal_exactness(self) -> bool:
        """Whether serving stays exactly the block-diagonal prefill of Theorem 3 (only ``none`` does)."""
        return self.kind == "none"


@dataclass(frozen=True, slots=True)
class FactLineLayout:
    """How many tokens of a rendered fact line are layout rather than fact text.

    Attributes:
        opening: tokens at the start of every line that belong to the bullet (``"- "``).
        closing: tokens at the end of every line that belong to the line break (``"\\n"``).
    """

    opening: int
    closing: int


def head_slots(fact_lengths: Sequence[int], start: int, m: int) -> list[int]:
    """Slots of each fact's first ``m`` tokens (``head:m``); facts laid contiguously from slot ``start``."""
    slots: list[int] = []
    for n in fact_lengths:
        slots += range(start, start + min(m, n))
        start += n
    return slots


def tail_slots(memory_tokens: int, start: int, n: int) -> list[int]:
    """Slots of the memory segment's last ``n`` tokens (``tail:n``); the segment is ``[start, start + S)``."""
    return list(range(start + max(0, memory_tokens - n), start + memory_tokens))


def structure_slots(fact_lengths: Sequence[int], start: int, layouts: Sequence[FactLineLayout]) -> list[int]:
    """Slots of each fact line's opening and closing layout tokens (``structure``), ascending; ``layouts`` has one
    entry per fact."""
    slots: list[int] = []
    for n, layout in zip(fact_lengths, layouts, strict=True):
        opening = min(layout.opening, n)
        closing = min(layout.closing, n - opening)
        slots += range(start, start + opening)
        slots += range(start + n - closing, start + n)
        start += n
    return slots


def top_scored_slots(scores: torch.Tensor, start: int, percent: float) -> list[int]:
    """The ``ceil(percent / 100 · S)`` memory slots with the highest score (``selective:r``), ascending.

    Args:
        scores: ``[S]`` float, one score per memory token (e.g. the query's attention mass on it).
        start: slot of the first memory token.
        percent: r, in (0, 100].
    """
    n = min(int(scores.numel()), math.ceil(percent / 100.0 * scores.numel()))
    if n == 0:
        return []
    top = torch.topk(scores.float(), n).indices
    return sorted(int(i) + start for i in top)


def planned_slots(
    policy: RecomputePolicy, fact_lengths: Sequence[int], start: int, layouts: Sequence[FactLineLayout] = ()
) -> list[int] | None:
    """The slots a policy recomputes for facts laid contiguously from slot ``start``, ascending; ``None`` for
    ``selective:r`` over a non-empty segment, whose slots depend on the query (:func:`top_scored_slots` after a
    probe). ``layouts`` (one per fact) are needed by ``structure`` only."""
    if policy.kind == "head":
        return head_slots(fact_lengths, start, int(policy.amount))
    if policy.kind == "tail":
        return tail_slots(sum(fact_lengths), start, int(policy.amount))
    if policy.kind == "structure":
        return structure_slots(fact_lengths, start, layouts)
    if policy.kind == "selective" and sum(fact_lengths) > 0:
        return None
    return []
