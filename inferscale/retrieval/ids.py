"""Vector ids: checking what callers pass, and the set of ids an index holds, sorted for vectorised membership."""

from __future__ import annotations

import numpy as np

from inferscale.errors import InvalidInputError


def check_ids(ids: object, name: str = "ids") -> np.ndarray:
    """``ids`` as a contiguous int64 array ``[n]``.

    Raises:
        InvalidInputError: when ``ids`` is not 1-D, holds non-integers (bools included), a negative value (FAISS
            uses -1 for "no result") or a value above the int64 range.
    """
    array = np.asarray(ids)
    if array.ndim != 1:
        raise InvalidInputError(f"{name} must be 1-D [n], got shape {array.shape}")
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)
    if not np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_:
        raise InvalidInputError(f"{name} must hold integers (int64 vector ids), got dtype {array.dtype}")
    if np.issubdtype(array.dtype, np.unsignedinteger) and int(array.max()) > np.iinfo(np.int64).max:
        raise InvalidInputError(f"{name} holds a value above the int64 range")
    if int(array.min()) < 0:
        raise InvalidInputError(f"{name} must be non-negative (FAISS uses -1 for 'no result'), got {array.min()}")
    return np.ascontiguousarray(array, dtype=np.int64)


class IdSet:
    """A set of int64 ids kept as one sorted array, so membership of ``n`` ids is one ``searchsorted``
    (``O(n log N)``); adding or removing ids moves the array once (``O(N)`` bytes copied, no sort).

    The array is replaced on every change, never written in place. Not thread-safe: the owner serialises calls.

    Args:
        ids: the initial ids, int64 ``[N]``, distinct, in any order.
    """

    def __init__(self, ids: np.ndarray | None = None) -> None:
        self._sorted = np.sort(ids) if ids is not None else np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return int(self._sorted.size)

    @property
    def array(self) -> np.ndarray:
        """The ids, int64 ``[N]`` ascending (do not modify)."""
        return self._sorted

    def contains(self, ids: np.ndarray) -> np.ndarray:
        """Whether each of ``ids`` (int64 ``[n]``) is in the set: bool ``[n]``."""
        if self._sorted.size == 0:
            return np.zeros(ids.size, dtype=bool)
        pos = np.minimum(np.searchsorted(self._sorted, ids), self._sorted.size - 1)
        return np.asarray(self._sorted[pos] == ids)

    def add(self, ids: np.ndarray) -> None:
        """Add ``ids`` (int64 ``[n]``, distinct, none in the set yet)."""
        if ids.size:
            new = np.sort(ids)
            self._sorted = np.insert(self._sorted, np.searchsorted(self._sorted, new), new)

    def remove(self, ids: np.ndarray) -> None:
        """Remove ``ids`` (int64 ``[n]``); ids not in the set are ignored."""
        held = ids[self.contains(ids)]
        if held.size:
            self._sorted = np.delete(self._sorted, np.searchsorted(self._sorted, np.unique(held)))

    def clear(self) -> None:
        """Remove every id."""
        self._sorted = np.zeros(0, dtype=np.int64)


__all__ = ["IdSet", "check_ids"]
