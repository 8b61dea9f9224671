"""The shared body of the in-memory tiers (host, device): a dict of entries plus an :class:`LRUPolicy`.

Subclasses only say where tensors live (:meth:`MemoryTier._place`); storage and eviction are the same.
"""

from __future__ import annotations

import threading

from inferscale.kv.fact import FactKV
from inferscale.kv.tiers.base import Evicted, KVKey
from inferscale.kv.tiers.eviction import LRUPolicy


class MemoryTier:
    """Entries held as tensors in memory under a byte budget, least recently used evicted first.

    Entries are returned as stored (no copy): callers must not modify them in place.

    Args:
        name: tier name for statistics.
        budget_bytes: capacity (bytes, >= 0), counted over K and V (:attr:`FactKV.nbytes`).

    Raises:
        InvalidInputError: when ``budget_bytes`` is negative.
    """

    def __init__(self, name: str, budget_bytes: int) -> None:
        self.name = name
        self._policy = LRUPolicy(budget_bytes)
        self._entries: dict[KVKey, FactKV] = {}
        self._lock = threading.Lock()

    def _place(self, fact: FactKV) -> FactKV:
        """``fact`` moved to where this tier keeps tensors (a copy unless it is already there)."""
        raise NotImplementedError

    @property
    def budget_bytes(self) -> int:
        """The capacity (bytes)."""
        return self._policy.budget_bytes

    @property
    def nbytes(self) -> int:
        """K/V bytes held (bytes)."""
        with self._lock:
            return self._policy.nbytes

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def get(self, key: KVKey) -> FactKV | None:
        """The entry for ``key``, marked most recently used; ``None`` when absent."""
        with self._lock:
            fact = self._entries.get(key)
            if fact is not None:
                self._policy.touch(key)
            return fact

    def contains(self, key: KVKey) -> bool:
        """Whether the tier holds ``key`` (its recency is left as it is)."""
        with self._lock:
            return key in self._entries

    def put(self, key: KVKey, fact: FactKV) -> Evicted:
        """Store a copy of ``fact`` placed in this tier; returns the evicted entries (possibly ``fact`` itself,
        unplaced, when it is larger than the whole budget)."""
        if fact.nbytes > self.budget_bytes:
            with self._lock:
                self._drop(key)
            return [(key, fact)]
        placed = self._place(fact)
        with self._lock:
            victims = self._policy.admit(key, placed.nbytes)
            self._entries[key] = placed
            return [(victim, self._entries.pop(victim)) for victim in victims]

    def pop(self, key: KVKey) -> FactKV | None:
        """Remove and return the entry for ``key`` (``None`` when absent)."""
        with self._lock:
            return self._drop(key)

    def _drop(self, key: KVKey) -> FactKV | None:
        self._policy.remove(key)
        return self._entries.pop(key, None)

    def delete_memory(self, memory_id: str) -> int:
        """Remove every entry of ``memory_id``; returns how many were removed."""
        with self._lock:
            doomed = [key for key in self._entries if key.memory_id == memory_id]
            for key in doomed:
                self._drop(key)
            return len(doomed)

    def clear(self) -> None:
        """Remove every entry."""
        with self._lock:
            self._entries.clear()
            self._policy.clear()

    def keys(self) -> list[KVKey]:
        """Keys held (a snapshot, least recently used first is not guaranteed)."""
        with self._lock:
            return list(self._entries)
