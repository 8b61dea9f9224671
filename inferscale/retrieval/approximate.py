"""The approximate index for large and unscoped searches: a FAISS inverted-file index (``IndexIVFFlat``, inner
product) over the same vectors as the exact store, with the same int64 ids.

It is trained on a sample of the vectors (k-means, ``nlist`` centroids), holds every vector in the list of its
nearest centroid, and a search visits the ``nprobe`` lists nearest the query. Adds and removes are applied to it
as to the exact store; vectors added after training go to the lists of the old centroids, so the owner re-trains
it (builds a new one) once the index has grown enough (:attr:`ApproximateIndex.trained_for`).

On a machine where FAISS sees a GPU a copy may serve searches without a scope (:meth:`ApproximateIndex.use_gpu`);
FAISS GPU indexes take no id selector, so scoped searches always run on the CPU copy.
"""

from __future__ import annotations

import logging
import math
import time

import faiss
import numpy as np

from inferscale.retrieval.ids import id_selector

log = logging.getLogger(__name__)

TRAIN_POINTS_PER_LIST = 64
"""Training sample size per list (FAISS warns below 39); capped at the number of vectors."""

TRAIN_ITERATIONS = 10
"""k-means iterations when training."""

GPU_MAX_K = 2048
"""The largest ``k`` FAISS GPU indexes search for; a larger one runs on the CPU copy."""


def gpu_count() -> int:
    """How many GPUs FAISS sees (0 with ``faiss-cpu``)."""
    get_num_gpus = getattr(faiss, "get_num_gpus", None)
    return int(get_num_gpus()) if get_num_gpus is not None else 0


def auto_nlist(n: int) -> int:
    """The number of lists for ``n`` vectors: the power of two nearest ``sqrt(n)``, at least 1 and at most ``n //
    TRAIN_POINTS_PER_LIST`` (so every list has training points)."""
    nearest = 2 ** round(math.log2(max(1.0, math.sqrt(n))))
    return max(1, min(nearest, n // TRAIN_POINTS_PER_LIST))


def list_count(n: int, nlist: int | None) -> int:
    """The number of lists an index built over ``n`` vectors gets: ``nlist`` (``search.ivf_nlist``), or
    :func:`auto_nlist` when it is ``None``; capped at ``n``."""
    return min(nlist if nlist is not None else auto_nlist(n), n)


class ApproximateIndex:
    """An ``IndexIVFFlat`` (inner product) with the exact store's ids, and an optional GPU copy.

    Not thread-safe: the owner (:class:`~inferscale.retrieval.VectorIndex`) serialises calls.

    Args:
        ivf: a trained ``IndexIVFFlat`` with inner-product metric holding the vectors under their ids.
        trained_for: how many vectors the index held when it was trained (the owner re-trains past a multiple).
    """

    def __init__(self, ivf: faiss.IndexIVFFlat, trained_for: int) -> None:
        self._ivf = ivf
        self.trained_for = int(trained_for)
        self._gpu: faiss.Index | None = None
        self._gpu_resources: faiss.StandardGpuResources | None = None

    @classmethod
    def build(cls, ids: np.ndarray, vectors: np.ndarray, nlist: int | None = None, seed: int = 0) -> ApproximateIndex:
        """Train on a sample of ``vectors`` and add them all.

        Args:
            ids: int64 ``[n]``, distinct, ``n >= 1``.
            vectors: float32 ``[n, dim]``, L2-normalised, C-contiguous (a view of the exact store is fine: it is
                only read).
            nlist: the number of lists; ``None`` for :func:`auto_nlist`. Capped at ``n``.
            seed: seeds the training sample and k-means, so a rebuild of the same vectors gives the same index.
        """
        n, dim = vectors.shape
        lists = list_count(n, nlist)
        started = time.perf_counter()
        ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, lists, faiss.METRIC_INNER_PRODUCT)
        ivf.cp.niter = TRAIN_ITERATIONS
        ivf.cp.seed = seed
        ivf.cp.max_points_per_centroid = TRAIN_POINTS_PER_LIST
        sample = np.random.default_rng(seed).choice(n, size=min(n, lists * TRAIN_POINTS_PER_LIST), replace=False)
        ivf.train(vectors[np.sort(sample)])
        ivf.add_with_ids(vectors, ids)
        log.info("built the approximate index: %d vectors, %d lists, %.1f s", n, lists, time.perf_counter() - started)
        return cls(ivf, n)

    @classmethod
    def from_bytes(
        cls, data: np.ndarray, trained_for: int, dim: int, n: int, nlist: int | None
    ) -> ApproximateIndex | None:
        """The index serialised in ``data`` (uint8 ``[b]``), trained on ``trained_for`` vectors, or ``None`` (the
        owner builds a new one when it needs it) when it is not an inner-product ``IndexIVFFlat`` of ``dim`` holding
        ``n`` vectors, or when it has another number of lists than a build with ``nlist`` (``search.ivf_nlist``)
        would give it (:func:`list_count` of ``trained_for``): the setting changed since it was saved (logged at
        info level)."""
        try:
            loaded = faiss.deserialize_index(data)
        except RuntimeError as exc:
            log.warning("ignoring an unreadable approximate index (%s); it is rebuilt when needed", exc)
            return None
        if (
            not isinstance(loaded, faiss.IndexIVFFlat)
            or loaded.metric_type != faiss.METRIC_INNER_PRODUCT
            or loaded.d != dim
            or loaded.ntotal != n
        ):
            log.warning("ignoring an approximate index that does not match the vectors; it is rebuilt when needed")
            return None
        wanted = list_count(trained_for, nlist)
        if loaded.nlist != wanted:
            log.info(
                "the saved approximate index has %d lists where search.ivf_nlist=%s gives %d for its %d vectors: it "
                "is rebuilt when needed",
                loaded.nlist,
                nlist,
                wanted,
                trained_for,
            )
            return None
        return cls(loaded, trained_for)

    def to_bytes(self) -> np.ndarray:
        """The CPU index serialised: uint8 ``[b]``."""
        return faiss.serialize_index(self._ivf)

    @property
    def nlist(self) -> int:
        """The number of lists."""
        return int(self._ivf.nlist)

    @property
    def on_gpu(self) -> bool:
        """Whether a GPU copy is held (it serves searches without a scope)."""
        return self._gpu is not None

    def __len__(self) -> int:
        return int(self._ivf.ntotal)

    # ---- mutations ------------------------------------------------------------------------------------------

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Add ``vectors`` (float32 ``[n, dim]``) under ``ids`` (int64 ``[n]``, none held now), to the GPU copy too."""
        self._ivf.add_with_ids(vectors, ids)
        if self._gpu is not None:
            self._gpu.add_with_ids(vectors, ids)

    def remove(self, ids: np.ndarray) -> None:
        """Remove ``ids`` (int64 ``[n]``). FAISS GPU indexes cannot remove, so the GPU copy is dropped; the next
        search without a scope copies the index again (:meth:`use_gpu`)."""
        self._ivf.remove_ids(faiss.IDSelectorBatch(ids))
        self._gpu = None

    # ---- search ---------------------------------------------------------------------------------------------

    def use_gpu(self) -> bool:
        """Copy the index to GPU 0 unless a copy is held; ``False`` when FAISS sees no GPU."""
        if self._gpu is None and gpu_count() > 0:
            if self._gpu_resources is None:
                self._gpu_resources = faiss.StandardGpuResources()
            self._gpu = faiss.index_cpu_to_gpu(self._gpu_resources, 0, self._ivf)
        return self._gpu is not None

    def search(
        self, query: np.ndarray, k: int, nprobe: int, allowed: np.ndarray | None = None, gpu: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """The (approximately) ``k`` best ids by inner product with ``query``, among ``allowed`` when given.

        Args:
            query: float32 ``[1, dim]``.
            k: how many results at most (>= 1).
            nprobe: how many lists to visit.
            allowed: int64 ``[m]``, sorted and distinct, the only ids that may be returned (a selector inside the
                CPU search, :func:`~inferscale.retrieval.ids.id_selector`); ``None`` for any.
            gpu: search the GPU copy when one is held, there is no ``allowed`` and ``k`` is at most
                :data:`GPU_MAX_K`.

        Returns:
            ``(ids, scores)``: int64 ``[j]`` and float32 ``[j]``, ``j <= k`` (fewer when the visited lists hold
            fewer matching vectors), in FAISS's order.
        """
        params = faiss.SearchParametersIVF()
        params.nprobe = min(nprobe, self.nlist)
        target: faiss.Index = self._ivf
        selector = None
        if allowed is not None:
            selector = id_selector(allowed)  # kept alive by this frame during the search
            params.sel = selector
        elif gpu and self._gpu is not None and k <= GPU_MAX_K:
            target = self._gpu
        scores, found = target.search(query, k, params=params)
        keep = found[0] >= 0
        return found[0][keep].astype(np.int64), scores[0][keep]


__all__ = [
    "GPU_MAX_K",
    "TRAIN_ITERATIONS",
    "TRAIN_POINTS_PER_LIST",
    "ApproximateIndex",
    "auto_nlist",
    "gpu_count",
    "list_count",
]
