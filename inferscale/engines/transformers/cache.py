"""A transformers KV cache over preallocated buffers, written in place.

``DynamicCache`` concatenates on every update, so a cache built from injected tensors is copied once when built,
once by the prefill and once per decoded token. :class:`PreallocatedCache` instead wraps buffers that already hold
``[system prefix][memory segment]`` and have room for the query and the answer: the prefill and each decode step
write their new K/V into the next free slots, and attention reads a view of the filled part.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer


class PreallocatedLayer(DynamicLayer):
    """One layer's K/V in buffers ``[1, n_kv_heads, capacity, head_dim]`` of which the first ``length`` are filled.

    When an update would pass ``capacity`` the buffers are regrown (doubled), so a long generation never fails;
    that costs one copy.
    """

    def __init__(self, key_buffer: torch.Tensor, value_buffer: torch.Tensor, length: int) -> None:
        super().__init__()
        if key_buffer.shape != value_buffer.shape or key_buffer.dim() != 4 or key_buffer.shape[0] != 1:
            raise ValueError(f"buffers must be [1, heads, capacity, head_dim], got {tuple(key_buffer.shape)}")
        if not 0 <= length <= key_buffer.shape[2]:
            raise ValueError(f"length {length} is outside the buffer capacity {key_buffer.shape[2]}")
        self._key_buffer = key_buffer
        self._value_buffer = value_buffer
        self._length = length
        self.dtype, self.device = key_buffer.dtype, key_buffer.device
        self.is_initialized = True
        self._expose()

    def _expose(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Point ``keys``/``values`` at the filled part of the buffers; returns those views."""
        keys = self._key_buffer[:, :, : self._length]
        values = self._value_buffer[:, :, : self._length]
        self.keys, self.values = keys, values
        return keys, values

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to do: the buffers exist from construction."""

    def _grow(self, needed: int) -> None:
        capacity = max(needed, 2 * self._key_buffer.shape[2])
        for name in ("_key_buffer", "_value_buffer"):
            old = getattr(self, name)
            new = old.new_empty((*old.shape[:2], capacity, old.shape[3]))
            new[:, :, : self._length] = old[:, :, : self._length]
            setattr(self, name, new)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``[1, heads, q, head_dim]`` new K/V after the filled part; return views of everything filled."""
        end = self._length + key_states.shape[-2]
        if end > self._key_buffer.shape[2]:
            self._grow(end)
        self._key_buffer[:, :, self._length : end] = key_states
        self._value_buffer[:, :, self._length : end] = value_states
        self._length = end
        return self._expose()

    def get_seq_length(self) -> int:
        """Tokens filled (tokens)."""
        return self._length

    def crop(self, max_length: int) -> None:
        """Forget every entry after the first ``max_length`` (tokens); a negative value drops that many from the
        end, as transformers' caches do. The buffers are kept.

        Raises:
            ValueError: when a negative ``max_length`` would drop more entries than are filled.
        """
        if max_length < 0:
            if -max_length > self._length:
                raise ValueError(f"cannot drop {-max_length} entries from a layer holding {self._length}")
            max_length = self._length + max_length
        self._length = min(self._length, max_length)
        self._expose()

    def move_tail(self, base: int, slots: torch.Tensor) -> None:
        """Move the entries written after ``base`` into ``slots`` (``[n]`` int64, each < ``base``), then truncate
        the filled part back to ``base``. Used to replace injected K/V with recomputed ones."""
        n = self._length - base
        if n != slots.numel():
            raise ValueError(f"{n} entries after slot {base}, but {slots.numel()} destination slots")
        self._key_buffer[:, :, slots] = self._key_buffer[:, :, base : self._length]
        self._value_buffer[:, :, slots] = self._value_buffer[:, :, base : self._length]
        self._length = base
        self._expose()

    def divide_keys(self, start: int, end: int, divisor: float) -> None:
        """Divide the keys of the filled slots ``[start, end)`` by ``divisor`` in place."""
        if not 0 <= start <= end <= self._length:
            raise ValueError(f"slots [{start}, {end}) are outside the {self._length} filled ones")
        self._key_buffer[:, :, start:end].div_(divisor)


class PreallocatedCache(Cache):
    """A :class:`transformers.Cache` over per-layer preallocated buffers.

    Args:
        keys, values: ``[n_layers, n_kv_heads, capacity, head_dim]``; the first ``length`` slots of each layer
            hold post-RoPE keys and values already (the system prefix and the injected memory segment).
        length: filled slots (tokens).
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        self._preallocated = [PreallocatedLayer(keys[i][None], values[i][None], length) for i in range(keys.shape[0])]
        super().__init__(layers=[layer for layer in self._preallocated])  # the same objects, typed as Cache's list

    def crop(self, max_length: int) -> None:
        """:meth:`PreallocatedLayer.crop` on every layer."""
        for layer in self._preallocated:
            layer.crop(max_length)

    def move_tail(self, base: int, slots: torch.Tensor) -> None:
        """:meth:`PreallocatedLayer.move_tail` on every layer."""
        for layer in self._preallocated:
            layer.move_tail(base, slots)

    def divide_keys(self, start: int, end: int, divisor: float) -> None:
        """Divide the keys of slots ``[start, end)`` by ``divisor`` in place, in every layer (the memory
        temperature T)."""
        for layer in self._preallocated:
            layer.divide_keys(start, end, divisor)
