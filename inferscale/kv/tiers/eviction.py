"""Eviction policy, apart from storage: which keys leave a tier that holds more bytes than its budget."""

from __future__ import annotations

from collections import OrderedDict

from inferscale.errors import InvalidInputError
from inferscale.kv.tiers.base import KVKey


class LRUPolicy:
    """Least-recently-used bookkeeping under a byte budget. Not thread-safe: the owning tier holds the lock.

    The policy tracks sizes only; it never touches tensors. :meth:`admit` returns the keys the tier must drop.

    Args:
        budget_bytes: capacity (bytes, >= 0). 0 admits nothing.

    Raises:
        InvalidInputError: when ``budget_bytes`` is negative or not an int.
    """

    def __init__(self, budget_bytes: int) -> None:
        if not isinstance(budget_bytes, int) or isinstance(budget_bytes, bool) or budget_bytes < 0:
            raise InvalidInputError(f"budget_bytes must be an int >= 0, got {budget_bytes!r}")
        self._budget = budget_bytes
        self._sizes: OrderedDict[KVKey, int] = OrderedDict()
        self._total = 0

    @property
    def budget_bytes(self) -> int:
        """The capacity (bytes)."""
        return self._budget

    @property
    def nbytes(self) -> int:
        """Bytes of the keys currently admitted (bytes)."""
        return self._total

    def __contains__(self, key: object) -> bool:
        return key in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    def admit(self, key: KVKey, nbytes: int) -> list[KVKey]:
        """Record ``key`` (``nbytes`` bytes) as most recently used; returns the keys to evict, oldest first.

        When ``nbytes`` alone exceeds the budget, ``key`` itself is the only victim and nothing else is evicted.
        A key already present is re-sized, not counted twice.
        """
        self.remove(key)
        if nbytes > self._budget:
            return [key]
        self._sizes[key] = nbytes
        self._total += nbytes
        victims: list[KVKey] = []
        while self._total > self._budget:
            victim, size = self._sizes.popitem(last=False)
            self._total -= size
            victims.append(victim)
        return victims

    def touch(self, key: KVKey) -> None:
        """Mark ``key`` most recently used (no-op when absent)."""
        if key in self._sizes:
            self._sizes.move_to_end(key)

    def remove(self, key: KVKey) -> None:
        """Forget ``key`` (no-op when absent)."""
        size = self._sizes.pop(key, None)
        if size is not None:
            self._total -= size

    def clear(self) -> None:
        """Forget every key."""
        self._sizes.clear()
        self._total = 0
