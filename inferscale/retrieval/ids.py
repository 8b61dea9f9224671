"""Vector ids: checking what callers pass, the set of ids an index holds (sorted for vectorised membership), and
the FAISS selector that restricts a search to a scope."""

from __future__ import annotations

import faiss
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


BITMAP_BITS_PER_ID = 64
"""A scope whose largest id is below this many times its size is selected by a bitmap (at most 8 bytes per id of
the scope, built with numpy in about a millisecond per 100k ids) rather than by FAISS's hash set
(``IDSelectorBatch``: ~30 ms to build for 100k ids here)."""


def distinct_sorted(ids: np.ndarray) -> np.ndarray:
    """``ids`` (int64 ``[n]``) sorted without repeats; returned as they are when they already are (ids read from SQL
    by primary key), which costs one comparison pass instead of a sort."""
    if ids.size < 2 or bool(np.all(ids[1:] > ids[:-1])):
        return ids
    return np.unique(ids)


def id_selector(ids: np.ndarray) -> faiss.IDSelector:
    """A FAISS selector that lets exactly ``ids`` (int64 ``[m]``, non-negative, sorted, distinct, ``m >= 1``) through:
    an ``IDSelectorBitmap`` when the ids are dense enough (:data:`BITMAP_BITS_PER_ID`), else an ``IDSelectorBatch``.
    The bitmap is referenced by the selector object, so it lives as long as the selector does."""
    top = int(ids[-1]) + 1
    if top > BITMAP_BITS_PER_ID * ids.size:
        return faiss.IDSelectorBatch(ids)
    mask = np.zeros(top, dtype=bool)
    mask[ids] = True
    bitmap = np.packbits(mask, bitorder="little")  # FAISS reads bit (id & 7) of byte (id >> 3)
    selector = faiss.IDSelectorBitmap(bitmap.size, faiss.swig_ptr(bitmap))  # its size in bytes, not bits
    selector.referenced_bitmap = bitmap  # type: ignore[attr-defined]  # the C++ object only points at it
    return selector


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


__all__ = ["BITMAP_BITS_PER_ID", "IdSet", "check_ids", "distinct_sorted", "id_selector"]
