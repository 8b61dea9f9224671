"""What each indexed vector was computed from: a label per vector id (the memory's text hash), so a caller can tell a
stale vector from a current one.

Labels are ASCII strings held as a numpy bytes array sorted by id, so checking a whole scope (tens of thousands of
ids) is a few vectorised numpy calls, not a Python loop.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from inferscale.errors import InvalidInputError

MAX_LABEL_LENGTH = 128
"""The longest label (ASCII characters): a hex digest fits."""


def check_labels(labels: Sequence[str], n: int) -> np.ndarray:
    """``labels`` as a bytes array ``[n]`` of ASCII strings of 1 to :data:`MAX_LABEL_LENGTH` characters (no NUL,
    which numpy's bytes arrays strip at the end).

    Raises:
        InvalidInputError: when there is not one label per id or a label breaks those rules.
    """
    if isinstance(labels, str) or len(labels) != n:
        raise InvalidInputError(f"pass one label per id: {n} ids, got {labels!r:.80}")
    for label in labels:
        if not isinstance(label, str) or not 0 < len(label) <= MAX_LABEL_LENGTH or not label.isascii():
            raise InvalidInputError(f"a label must be 1 to {MAX_LABEL_LENGTH} ASCII characters, got {label!r:.80}")
        if "\x00" in label:
            raise InvalidInputError(f"a label must not hold NUL characters, got {label!r:.80}")
    return label_array(labels)


def label_array(labels: Sequence[str]) -> np.ndarray:
    """``labels`` (ASCII str) as a bytes array ``[n]``; labels of one length (hex digests) are joined and viewed,
    which is several times faster than converting each.

    Raises:
        TypeError, UnicodeEncodeError: when a label is not an ASCII str.
    """
    lengths = set(map(len, labels))
    if len(lengths) == 1:
        (width,) = lengths
        return np.frombuffer("".join(labels).encode("ascii"), dtype=f"S{width}")
    return np.array(list(labels), dtype="S") if labels else np.zeros(0, dtype="S1")


def differ(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise ``a != b`` for bytes arrays ``[n]``: bool ``[n]``. Arrays of one width are compared as bytes
    ``[n, width]``, several times faster than numpy's string comparison."""
    if a.dtype.itemsize != b.dtype.itemsize or a.size == 0:
        return np.asarray(a != b, dtype=bool).reshape(-1)
    width = a.dtype.itemsize
    bytes_a = np.ascontiguousarray(a).view(np.uint8).reshape(-1, width)
    bytes_b = np.ascontiguousarray(b).view(np.uint8).reshape(-1, width)
    return np.asarray((bytes_a != bytes_b).any(axis=1))


class LabelTable:
    """The labels of some ids: int64 ids ``[m]`` ascending and bytes labels ``[m]`` aligned with them.

    Both arrays are replaced on every change, never written in place, so a reader that took them (a save) keeps a
    consistent pair. Not thread-safe: the owner serialises calls.
    """

    def __init__(self) -> None:
        self.ids = np.zeros(0, dtype=np.int64)
        self.values = np.zeros(0, dtype="S1")

    def lookup(self, id_array: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For int64 ``[n]`` ids: whether each has a label (bool ``[n]``) and the label (bytes ``[n]``, meaningless
        where it has none)."""
        if self.ids.size == 0:
            return np.zeros(id_array.size, dtype=bool), np.zeros(id_array.size, dtype="S1")
        pos = np.minimum(np.searchsorted(self.ids, id_array), self.ids.size - 1)
        return self.ids[pos] == id_array, self.values[pos]

    def replace(self, ids: np.ndarray, values: np.ndarray) -> None:
        """Hold exactly the labels ``values`` (bytes ``[n]``) of distinct ``ids`` (int64 ``[n]``)."""
        order = np.argsort(ids, kind="stable")  # near-sorted after an append: timsort runs in about linear time
        self.ids, self.values = ids[order], values[order]

    def put(self, ids: np.ndarray, values: np.ndarray) -> None:
        """Label ``ids`` (int64 ``[n]``, distinct, none labelled now) with ``values`` (bytes ``[n]``). New ids above
        every labelled one, in order (new memories), are appended without a sort."""
        if ids.size and (self.ids.size == 0 or ids[0] > self.ids[-1]) and bool(np.all(ids[1:] > ids[:-1])):
            self.ids, self.values = np.concatenate([self.ids, ids]), np.concatenate([self.values, values])
        else:
            self.replace(np.concatenate([self.ids, ids]), np.concatenate([self.values, values]))

    def drop(self, id_array: np.ndarray) -> None:
        """Forget the labels of ``id_array`` (int64 ``[n]``); ids without one are ignored (and, when none has one,
        nothing is copied: the common case of new memories)."""
        if not self.lookup(id_array)[0].any():
            return
        keep = ~np.isin(self.ids, id_array)
        self.ids, self.values = self.ids[keep], self.values[keep]

    def clear(self) -> None:
        """Forget every label."""
        self.ids, self.values = np.zeros(0, dtype=np.int64), np.zeros(0, dtype="S1")


__all__ = ["MAX_LABEL_LENGTH", "LabelTable", "check_labels", "differ", "label_array"]
