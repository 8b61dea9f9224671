"""Exact scoring and the order of search results, shared by every search path of the index.

Results are ordered by score, highest first; equal scores by ascending id. FAISS's own heaps leave the order of
equal scores to their internal layout (it changes with ``k`` and with where each vector sits in storage), so every
path re-ranks what it found with :func:`top_k`, and the exact per-scope path scores with :func:`inner_products`,
which computes each row alike wherever it sits, so equal vectors get bit-equal scores.
"""

from __future__ import annotations

import numpy as np


def inner_products(vectors: np.ndarray, query: np.ndarray) -> np.ndarray:
    """The inner product of each row of ``vectors`` (float32 ``[m, dim]``) with ``query`` (float32 ``[dim]``):
    float32 ``[m]``.

    Computed by ``numpy.einsum`` (no BLAS), which sums every row in the same order, so the score of a row does not
    depend on its position or on ``m`` (a BLAS matrix-vector product may block rows differently).
    """
    return np.einsum("ij,j->i", vectors, query)


def top_k(ids: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best of ``ids`` (int64 ``[m]``, distinct) by ``scores`` (float32 ``[m]``): scores descending,
    equal scores by ascending id.

    Returns:
        ``(ids, scores)``: int64 ``[min(k, m)]`` and float32 ``[min(k, m)]``.
    """
    m = int(ids.size)
    if k < m:
        kth = np.partition(scores, m - k)[m - k]  # the k-th highest score: every id scoring at least it is a candidate
        keep = scores >= kth
        ids, scores = ids[keep], scores[keep]
    order = np.lexsort((ids, -scores))[:k]
    return ids[order], scores[order]


def as_pairs(ids: np.ndarray, scores: np.ndarray) -> list[tuple[int, float]]:
    """``[(id, score), ...]`` as Python ints and floats, from int64 ``[n]`` and float32 ``[n]``."""
    return [(int(i), float(s)) for i, s in zip(ids.tolist(), scores.tolist(), strict=True)]


__all__ = ["as_pairs", "inner_products", "top_k"]
