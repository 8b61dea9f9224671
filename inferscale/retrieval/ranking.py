"""Exact scoring and the order of search results, shared by every search path of the index.

Results are ordered by score, highest first; equal scores by ascending id. FAISS's own heaps leave the order of
equal scores to their internal layout (it changes with ``k`` and with where each vector sits in storage), so every
path re-ranks what it found with :func:`top_k`, and the exact per-scope path scores with :func:`inner_products`,
which computes each row alike wherever it sits, so equal vectors get bit-equal scores.
"""

from __future__ import annotations

from collections.abc import Callable

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


def with_ties(
    search: Callable[[int], tuple[np.ndarray, np.ndarray]], k: int, candidates: int
) -> tuple[np.ndarray, np.ndarray]:
    """What ``search(n)`` (a FAISS top-``n``: ids int64 ``[j]``, scores float32 ``[j]`` descending) returns for the
    smallest ``n > k`` that holds every id scoring as high as the ``k``-th, so that :func:`top_k` can order equal
    scores by id: FAISS keeps an arbitrary few of the ids tied at the ``k``-th score. One search of ``k + 1`` unless
    the ``k``-th score repeats past it (duplicate vectors), then ``n`` doubles until it does not (or every one of
    the ``candidates`` is returned)."""
    n = min(k + 1, candidates)
    while True:
        found, scores = search(n)
        if found.size < n or n >= candidates or scores[k - 1] > scores[n - 1]:
            return found, scores
        n = min(2 * n, candidates)


__all__ = ["as_pairs", "inner_products", "top_k", "with_ties"]
