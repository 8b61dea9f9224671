"""A FAISS vector index keyed by the memories' integer ``vector_id``s, with search restricted to a scope."""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

import faiss
import numpy as np

from inferscale.errors import ConfigError, InvalidInputError


def _check_ids(ids: object, name: str = "ids") -> np.ndarray:
    """``ids`` as a contiguous int64 array ``[n]``."""
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


class VectorIndex:
    """Exact inner-product search over ``dim``-sized vectors with int64 ids (FAISS ``IndexIDMap2(IndexFlatIP)``).

    Vectors are expected to be L2-normalised, so the inner-product score is the cosine similarity in [-1, 1].
    Mutations and searches are serialised by a lock; the object may be shared by threads.

    The index lives on the CPU. FAISS GPU indexes cannot run a search restricted by an ``IDSelector`` (which is
    how every search is limited to a tenant's scope), and an exact flat search over even a million
    384-dimensional vectors takes milliseconds on a CPU, so a GPU (``faiss.get_num_gpus() > 0``) is only
    reported by :attr:`gpu_available`, not used.

    Args:
        dim: vector size (e.g. 384 for all-MiniLM-L6-v2).
        path: the file :meth:`save` writes; ``None`` for an in-memory index (then ``save`` needs a path).

    Raises:
        InvalidInputError: when ``dim`` is not a positive int.
    """

    def __init__(self, dim: int, path: Path | str | None = None) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int | np.integer) or dim < 1:
            raise InvalidInputError(f"dim must be a positive int, got {dim!r}")
        self._dim = int(dim)
        self._path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        self._index: faiss.IndexIDMap2 = faiss.IndexIDMap2(faiss.IndexFlatIP(self._dim))

    @classmethod
    def open(cls, path: Path | str, dim: int) -> VectorIndex:
        """The index saved at ``path``, or an empty one (bound to ``path``) when the file does not exist.

        Raises:
            InvalidInputError: when the saved index has another dimension than ``dim``.
            ConfigError: when the file is not a readable FAISS ``IndexIDMap2`` (delete it and rebuild the index
                from the database with :meth:`add`).
        """
        index = cls(dim, path)
        file = Path(path)
        if not file.exists():
            return index
        try:
            loaded = faiss.read_index(str(file))
        except RuntimeError as exc:
            raise ConfigError(f"cannot read the FAISS index {file}: {exc}; delete it and rebuild") from exc
        if not isinstance(loaded, faiss.IndexIDMap2):
            raise ConfigError(f"{file} holds a {type(loaded).__name__}, not an IndexIDMap2; delete it and rebuild")
        if loaded.d != index._dim:
            raise InvalidInputError(
                f"the index at {file} has dim {loaded.d} but dim {index._dim} was asked for; was it built by "
                "another embedder? Delete it and rebuild"
            )
        index._index = loaded
        return index

    # ---- properties --------------------------------------------------------------------------------------

    @property
    def dim(self) -> int:
        """The vector size."""
        return self._dim

    @property
    def path(self) -> Path | None:
        """The file :meth:`save` writes by default."""
        return self._path

    @staticmethod
    def gpu_available() -> bool:
        """Whether FAISS sees a GPU (always ``False`` with ``faiss-cpu``). The index itself stays on the CPU."""
        get_num_gpus = getattr(faiss, "get_num_gpus", None)
        return bool(get_num_gpus is not None and get_num_gpus() > 0)

    def __len__(self) -> int:
        return int(self._index.ntotal)

    def __repr__(self) -> str:
        return f"VectorIndex(dim={self._dim}, n={len(self)}, path={self._path!r})"

    def ids(self) -> np.ndarray:
        """The stored ids: int64 ``[len(self)]``, in storage order (a replaced id moves to the end; a copy)."""
        with self._lock:
            return faiss.vector_to_array(self._index.id_map).astype(np.int64, copy=True)

    # ---- mutations ---------------------------------------------------------------------------------------

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Add ``vectors`` under ``ids``; an id already in the index has its vector replaced.

        Args:
            ids: int64 ``[n]``, distinct, non-negative (the memories' ``vector_id``).
            vectors: float32 ``[n, dim]``, finite, L2-normalised (other float dtypes are converted).

        Raises:
            InvalidInputError: on a shape, dtype or dimension mismatch, repeated ids or non-finite values.
                Nothing is added then.
        """
        id_array = _check_ids(ids)
        matrix = np.asarray(vectors)
        if matrix.ndim != 2 or matrix.shape[1] != self._dim:
            raise InvalidInputError(f"vectors must be [n, {self._dim}], got shape {matrix.shape}")
        if matrix.shape[0] != id_array.shape[0]:
            raise InvalidInputError(f"{id_array.shape[0]} ids for {matrix.shape[0]} vectors; pass one id per row")
        if not np.issubdtype(matrix.dtype, np.floating):
            raise InvalidInputError(f"vectors must be floating point (float32), got dtype {matrix.dtype}")
        if not np.isfinite(matrix).all():
            raise InvalidInputError("vectors hold NaN or infinity")
        if np.unique(id_array).shape[0] != id_array.shape[0]:
            raise InvalidInputError("ids repeat within one add; each id names one vector")
        if id_array.size == 0:
            return
        matrix = np.ascontiguousarray(matrix, dtype=np.float32)
        with self._lock:
            self._index.remove_ids(faiss.IDSelectorBatch(id_array))
            self._index.add_with_ids(matrix, id_array)

    def remove(self, ids: np.ndarray) -> int:
        """Remove the vectors of ``ids`` (int64 ``[n]``); ids not in the index are ignored.

        Returns:
            How many vectors were removed.

        Raises:
            InvalidInputError: when ``ids`` is not a 1-D array of non-negative integers.
        """
        id_array = _check_ids(ids)
        if id_array.size == 0:
            return 0
        with self._lock:
            return int(self._index.remove_ids(faiss.IDSelectorBatch(id_array)))

    def reset(self) -> None:
        """Remove every vector."""
        with self._lock:
            self._index.reset()

    # ---- search ------------------------------------------------------------------------------------------

    def search(self, query: np.ndarray, k: int, allowed_ids: np.ndarray | None = None) -> list[tuple[int, float]]:
        """The ``k`` nearest ids to ``query`` by inner product, best first.

        Args:
            query: float32 ``[dim]`` (or ``[1, dim]``), L2-normalised.
            k: how many results at most (>= 1).
            allowed_ids: when given, int64 ``[m]``: only these ids can be returned. The restriction runs inside
                FAISS (``SearchParameters(sel=IDSelectorBatch)``), so the top-k is taken within the allowed set;
                an empty set returns ``[]``.

        Returns:
            ``[(id, score), ...]`` with at most ``min(k, candidates)`` pairs, scores descending (cosine).

        Raises:
            InvalidInputError: on a shape or dimension mismatch, a non-finite query or a bad ``k``.
        """
        vector = np.asarray(query)
        if vector.ndim == 2 and vector.shape[0] == 1:
            vector = vector[0]
        if vector.ndim != 1 or vector.shape[0] != self._dim:
            raise InvalidInputError(f"query must be [{self._dim}], got shape {np.asarray(query).shape}")
        if not np.issubdtype(vector.dtype, np.floating):
            raise InvalidInputError(f"query must be floating point (float32), got dtype {vector.dtype}")
        if not np.isfinite(vector).all():
            raise InvalidInputError("query holds NaN or infinity")
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
            raise InvalidInputError(f"k must be a positive int, got {k!r}")
        allowed = _check_ids(allowed_ids, "allowed_ids") if allowed_ids is not None else None
        if allowed is not None and allowed.size == 0:
            return []
        q = np.ascontiguousarray(vector, dtype=np.float32).reshape(1, self._dim)
        with self._lock:
            total = int(self._index.ntotal)
            if total == 0:
                return []
            n = min(int(k), total if allowed is None else min(total, int(allowed.size)))
            if allowed is None:
                scores, found = self._index.search(q, n)
            else:
                selector = faiss.IDSelectorBatch(allowed)  # kept alive by this frame during the search
                params = faiss.SearchParameters()
                params.sel = selector
                scores, found = self._index.search(q, n, params=params)
        return [(int(i), float(s)) for i, s in zip(found[0], scores[0], strict=True) if i >= 0]

    # ---- persistence -------------------------------------------------------------------------------------

    def save(self, path: Path | str | None = None) -> Path:
        """Write the index atomically: to a temporary file in the same folder, fsynced, then ``os.replace``.

        Args:
            path: where to write; defaults to the path the index was created or opened with.

        Returns:
            The file written.

        Raises:
            InvalidInputError: when neither ``path`` nor the index's own path is set.
        """
        target = Path(path) if path is not None else self._path
        if target is None:
            raise InvalidInputError("this index has no path; pass save(path) or create it with a path")
        target.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            data = faiss.serialize_index(self._index)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data.tobytes())
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp_name, target)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
        return target
