"""FAISS's OpenMP threads around one-query searches.

A search of one query has nothing to split among threads, yet FAISS still opens an OpenMP parallel region for it
(and ``reconstruct_batch`` does for more than 1000 ids). In a process that also loaded torch, whose OpenMP runtime
keeps its own threads, entering that region cost about 12 ms on a 2-core machine against 0.1 ms on one thread
(``benchmarks/scale.py``), more than the search itself. Searches therefore run FAISS on one thread; building
and training (many vectors at once) keep every thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import faiss


@contextmanager
def one_thread() -> Iterator[None]:
    """FAISS's OpenMP regions started by this thread run on one thread while inside; the thread's setting is
    restored after (OpenMP keeps it per thread, so other threads are not affected)."""
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


__all__ = ["one_thread"]
