"""Composition: k facts laid out as one contiguous memory segment after the system prefix, keys rotated in place.

Prompt layout (both chat modes use exactly these token ids)::

    [system prefix: P tokens][fact 1][fact 2]...[fact k][query: Q tokens]
     positions 0..P-1         P ..  P+S-1 (S = memory tokens)   P+S ..

In KV mode the prefix K/V come from a normal causal prefill (computed once and reused), the facts' K/V come from
the store and are rotated to positions ``P + offset_i`` (chunked RoPE), and only the query is prefilled. By the
paper's Theorem 3 this equals one prefill in which each fact attends only to what it saw when it was encoded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from inferscale.kv.fact import FactKV
from inferscale.kv.rope import RopeTable


@dataclass(frozen=True, slots=True)
class PrefixKV:
    """Post-RoPE K/V of the system prefix, from a causal prefill at positions ``0 .. P-1``.

    Attributes:
        keys, values: ``[n_layers, n_kv_heads, P, head_dim]``.
        token_ids: ``[P]`` int64 on the CPU.
    """

    keys: torch.Tensor
    values: torch.Tensor
    token_ids: torch.Tensor

    @property
    def n_tokens(self) -> int:
        """P, the prefix length (tokens)."""
        return int(self.keys.shape[2])


@dataclass(frozen=True, slots=True)
class AssembledKV:
    """The KV cache content for ``[prefix][memory segment]``, ready to be written into an engine's cache.

    Attributes:
        keys, values: ``[n_layers, n_kv_heads, P + S, head_dim]``, keys post-RoPE (views of the buffers).
        token_ids: ``[P + S]`` int64 on the CPU: the tokens those entries stand for.
        memory_tokens: S, the memory segment's length (tokens).
        key_buffer, value_buffer: ``[n_layers, n_kv_heads, P + S + extra_capacity, head_dim]``: the storage,
            with free slots after the filled part.
    """

    keys: torch.Tensor
    values: torch.Tensor
    token_ids: torch.Tensor
    memory_tokens: int
    key_buffer: torch.Tensor
    value_buffer: torch.Tensor

    @property
    def n_tokens(self) -> int:
        """P + S: the position the query starts at (tokens)."""
        return int(self.keys.shape[2])


def assemble(prefix: PrefixKV, facts: Sequence[FactKV], table: RopeTable, extra_capacity: int = 0) -> AssembledKV:
    """Gather, rotate and write k facts after the prefix in one pass over preallocated buffers.

    The buffers are allocated once, with ``extra_capacity`` free slots after the memory segment for the query and
    the answer (see :class:`inferscale.engines.transformers.cache.PreallocatedCache`). Values are concatenated
    straight into their slots; keys are concatenated into theirs and rotated there, in place, to positions
    ``P .. P+S-1``: one batched rotation of all facts and heads per layer (one layer at a time keeps the
    temporaries cache-resident). There is no Python loop over facts, inside or outside the loop over layers.

    Args:
        prefix: the system prefix's K/V (post-RoPE).
        facts: the k facts, in layout order, pre-RoPE; same layers/heads/head_dim as ``prefix``, and its dtype and
            device unless they are 8-bit (:attr:`FactKV.scales`): those are moved to the prefix's device as codes
            and scales and dequantised there, to its dtype.
        table: cos/sin rows of the model (:class:`RopeTable`).
        extra_capacity: free slots to reserve after ``P + S`` (tokens).

    Returns:
        :class:`AssembledKV` of ``P + S`` tokens; ``keys``/``values`` are views into the larger buffers, which
        :attr:`AssembledKV.key_buffer` / :attr:`AssembledKV.value_buffer` expose.

    Raises:
        ValueError: when a fact's shape, dtype or device does not match the prefix.
    """
    needed = prefix.n_tokens + sum(f.n_tokens for f in facts) + extra_capacity
    return SegmentWorkspace(prefix, capacity=needed).assemble(facts, table, extra_capacity)


def _served(prefix: PrefixKV, facts: Sequence[FactKV]) -> list[FactKV]:
    """The facts as the cache holds them: 8-bit ones moved to the prefix's device as codes and scales (about half
    the bytes of bfloat16 K/V) and dequantised there to its dtype; the others as they are."""
    return [f if f.scales is None else f.to(prefix.keys.device, prefix.keys.dtype) for f in facts]


def _check_facts(prefix: PrefixKV, facts: Sequence[FactKV]) -> None:
    n_layers, n_heads, _, head_dim = prefix.keys.shape
    for i, fact in enumerate(facts):
        if fact.keys.shape[:2] != (n_layers, n_heads) or fact.keys.shape[3] != head_dim:
            raise ValueError(
                f"fact {i} has K/V shape {tuple(fact.keys.shape)}, expected [{n_layers}, {n_heads}, T, {head_dim}]"
            )
        if fact.keys.dtype != prefix.keys.dtype or fact.keys.device != prefix.keys.device:
            raise ValueError(
                f"fact {i} is {fact.keys.dtype} on {fact.keys.device}; the cache is "
                f"{prefix.keys.dtype} on {prefix.keys.device}"
            )


def _write_segment(
    key_buffer: torch.Tensor, value_buffer: torch.Tensor, prefix: PrefixKV, facts: Sequence[FactKV], table: RopeTable
) -> AssembledKV:
    """Write the facts after the prefix already in the buffers: values concatenated into their slots, keys
    concatenated into theirs and rotated there in place, all facts at once per layer (no temporary copy of the
    segment, no loop over facts)."""
    p = prefix.n_tokens
    s = sum(f.n_tokens for f in facts)
    if facts:
        torch.cat([f.values for f in facts], dim=2, out=value_buffer[:, :, p : p + s])
        keys = key_buffer[:, :, p : p + s]
        torch.cat([f.keys for f in facts], dim=2, out=keys)
        table.rotate(keys, start=p, out=keys)
    token_ids = torch.cat([prefix.token_ids, *[f.token_ids for f in facts]])
    return AssembledKV(
        keys=key_buffer[:, :, : p + s],
        values=value_buffer[:, :, : p + s],
        token_ids=token_ids,
        memory_tokens=s,
        key_buffer=key_buffer,
        value_buffer=value_buffer,
    )


class SegmentWorkspace:
    """Per-layer K/V buffers reused across requests; the system prefix is written into them once.

    Allocating fresh multi-MB buffers per request costs page faults and a prefix copy every time; a workspace
    keeps one pair of ``[n_layers, n_kv_heads, capacity, head_dim]`` buffers whose first P slots hold the prefix
    for good, and each request writes only its memory segment (and then its query and answer) after it.
    The buffers grow (doubling, prefix copied once more) when a request needs more room.

    Not thread-safe: one request at a time (the engines serialise requests), and an :class:`AssembledKV` it
    returns is valid only until the next :meth:`assemble`.

    Args:
        prefix: the system prefix's K/V.
        capacity: initial slots per layer (tokens).
    """

    def __init__(self, prefix: PrefixKV, capacity: int = 2048) -> None:
        self._prefix = prefix
        self._key_buffer = torch.empty(0)
        self._value_buffer = torch.empty(0)
        self._allocate(max(capacity, prefix.n_tokens))

    @property
    def capacity(self) -> int:
        """Slots per layer (tokens)."""
        return int(self._key_buffer.shape[2])

    def _allocate(self, capacity: int) -> None:
        n_layers, n_heads, p, head_dim = self._prefix.keys.shape
        shape = (n_layers, n_heads, capacity, head_dim)
        self._key_buffer = torch.empty(shape, dtype=self._prefix.keys.dtype, device=self._prefix.keys.device)
        self._value_buffer = torch.empty_like(self._key_buffer)
        self._key_buffer[:, :, :p] = self._prefix.keys
        self._value_buffer[:, :, :p] = self._prefix.values

    def assemble(self, facts: Sequence[FactKV], table: RopeTable, extra_capacity: int = 0) -> AssembledKV:
        """Like :func:`assemble`, into the workspace's buffers (see the class notes on validity).

        Raises:
            ValueError: when a fact's shape, dtype or device does not match the prefix.
        """
        facts = _served(self._prefix, facts)
        _check_facts(self._prefix, facts)
        needed = self._prefix.n_tokens + sum(f.n_tokens for f in facts) + extra_capacity
        if needed > self.capacity:
            self._allocate(max(needed, 2 * self.capacity))
        return _write_segment(self._key_buffer, self._value_buffer, self._prefix, facts, table)
