"""A FAISS vector index keyed by the memories' integer ``vector_id``s, with search restricted to a scope.

Three search paths, chosen per search (:class:`~inferscale.config.SearchConfig`):

- a scope of at most ``exact_scope_max`` ids is searched exactly over its own vectors: they are looked up by id in
  the exact store (``reconstruct_batch``) and scored in one pass (:mod:`inferscale.retrieval.ranking`), so the
  cost tracks the scope (about a microsecond per memory), not the total;
- a larger scope, or a search without a scope, scans the whole exact store (FAISS ``IndexFlatIP``, restricted by an
  id selector, :func:`~inferscale.retrieval.ids.id_selector`) while the index is smaller than ``approximate_min_total``;
- from that size on it searches the approximate index (:mod:`inferscale.retrieval.approximate`), falling back to the
  scan when the visited lists hold fewer than ``k`` of the scope's vectors.

Each vector may carry a label: what it was computed from (the memories' text hash), so a caller can tell a stale
vector from a current one (:mod:`inferscale.retrieval.labels`). The exact store, its labels and the approximate
index are saved together in one file (:mod:`inferscale.retrieval.index_file`) by one atomic rename.
"""

from __future__ import annotations

import glob
import logging
import threading
from collections.abc import Sequence
from pathlib import Path

import faiss
import numpy as np

from inferscale.atomic import TEMP_SUFFIX, atomic_write, sweep_temp_files
from inferscale.config import SearchConfig
from inferscale.errors import ConfigError, InvalidInputError
from inferscale.retrieval import index_file
from inferscale.retrieval.approximate import ApproximateIndex, gpu_count
from inferscale.retrieval.ids import IdSet, check_ids, distinct_sorted, id_selector
from inferscale.retrieval.index_file import labels_path
from inferscale.retrieval.labels import MAX_LABEL_LENGTH, LabelTable, check_labels, differ, label_array
from inferscale.retrieval.ranking import as_pairs, inner_products, top_k, with_ties
from inferscale.retrieval.threads import one_thread

log = logging.getLogger(__name__)


def _deserialize(saved: index_file.SavedIndex, file: Path) -> faiss.Index:
    """The FAISS index ``saved`` holds.

    Raises:
        DamagedIndexFileError: when it cannot be read from a file this version wrote (an ``.npz``).
        ConfigError: when it cannot be read from a bare FAISS file, which may be another program's.
    """
    try:
        return faiss.deserialize_index(saved.index)
    except RuntimeError as exc:
        if saved.label_ids is not None:
            raise index_file.DamagedIndexFileError(f"cannot read the FAISS index in {file}: {exc}") from exc
        raise ConfigError(f"cannot read the FAISS index {file}: {exc}; delete it if InferScale wrote it") from exc


class VectorIndex:
    """Inner-product search over ``dim``-sized vectors with int64 ids, exact within small scopes.

    Vectors are expected to be L2-normalised, so the inner-product score is the cosine similarity in [-1, 1].
    Results are ordered by score, highest first, and equal scores by ascending id. Mutations and searches are
    serialised by a lock; the object may be shared by threads.

    The exact store is a FAISS ``IndexIDMap2(IndexFlatIP)`` on the CPU. The approximate index (an ``IndexIVFFlat``,
    built once the index reaches ``search.approximate_min_total`` vectors and a search needs it) holds a second copy
    of the vectors; with ``search.gpu`` and a GPU that FAISS sees (``inferscale-memory[gpu]``: the ``faiss-gpu-cu12``
    wheel), it is copied to the GPU (``faiss.index_cpu_to_gpu``) for searches without a scope. FAISS GPU indexes
    take no ``IDSelector``, so scoped searches run on the CPU: the exact per-scope path, or the CPU copy of the
    approximate index for large scopes.

    Args:
        dim: vector size (e.g. 384 for all-MiniLM-L6-v2).
        path: the file :meth:`save` writes; ``None`` for an in-memory index (then ``save`` needs a path).
        search: which search path serves which scope size; ``None`` for :class:`~inferscale.config.SearchConfig`'s
            defaults.
        embedder: the identity of the embedder whose vectors it holds
            (:func:`~inferscale.retrieval.embedder.embedder_identity`), saved with it; ``None``: not recorded.

    Raises:
        InvalidInputError: when ``dim`` is not a positive int.
    """

    def __init__(
        self,
        dim: int,
        path: Path | str | None = None,
        search: SearchConfig | None = None,
        embedder: str | None = None,
    ) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int | np.integer) or dim < 1:
            raise InvalidInputError(f"dim must be a positive int, got {dim!r}")
        if embedder is not None and (not isinstance(embedder, str) or not embedder):
            raise InvalidInputError(f"embedder must be a non-empty str or None, got {embedder!r}")
        self._dim = int(dim)
        self._embedder = embedder
        self._path = Path(path) if path is not None else None
        self._search = search if search is not None else SearchConfig()
        self._lock = threading.Lock()
        self._index: faiss.IndexIDMap2 = faiss.IndexIDMap2(faiss.IndexFlatIP(self._dim))
        self._ids = IdSet()  # the ids of self._index, sorted: membership without a Python loop
        self._labels = LabelTable()
        self._ann: ApproximateIndex | None = None
        self._ann_builds = 0

    @classmethod
    def open(
        cls, path: Path | str, dim: int, search: SearchConfig | None = None, embedder: str | None = None
    ) -> VectorIndex:
        """The index saved at ``path``, or an empty one (bound to ``path``) when the file does not exist.

        Its :attr:`embedder` is the identity saved with it (``None`` for a file saved without one, or by an earlier
        version): whether those vectors are the caller's embedder's is the caller's to check (the client compares a
        sample with fresh embeddings, :meth:`inferscale.derived.DerivedStores.settle_embedder`). A file of another
        dimension that records another identity than ``embedder`` (the caller's), or none when ``embedder`` is
        given, holds another model's vectors: it is not loaded, a warning is logged, and an empty index bound to
        ``path`` is returned (its next save replaces the file).

        The labels saved with it are loaded; a file of the earliest versions has them beside it, used when they
        belong to these index bytes (otherwise every vector is unlabelled). An approximate index saved with it is
        loaded when it holds as many vectors as the exact store and has the number of lists ``search.ivf_nlist`` gives
        (:func:`~inferscale.retrieval.approximate.list_count`); otherwise it is built again when needed.

        Raises:
            InvalidInputError: when the saved index has another dimension than ``dim`` and records ``embedder`` as
                its identity (both ``None`` included).
            ConfigError: when the file is not a readable FAISS ``IndexIDMap2(IndexFlat)`` and may be another
                program's, such as Mem0's faiss store (it is left alone). A file InferScale wrote that cannot be read
                (an ``.npz`` cut short or changed in place) or an empty one is not an error: it is renamed to
                ``<name>.damaged-<UTC time>`` (:func:`~inferscale.retrieval.index_file.set_aside`), a warning is
                logged, and an empty index is returned, which the client rebuilds from the database.
        """
        index = cls(dim, path, search, embedder)
        file = Path(path)
        try:
            read = file.stat()
        except FileNotFoundError:
            return index
        try:
            saved = index_file.read(file)
            loaded = _deserialize(saved, file)
        except index_file.DamagedIndexFileError as damaged:
            aside = index_file.set_aside(file, read)
            where = f"set aside as {aside}" if aside is not None else "not set aside (replaced meanwhile, or see above)"
            log.warning("%s; it was %s, and the index starts empty, to be rebuilt from the database", damaged, where)
            return index
        index._embedder = saved.embedder
        if not isinstance(loaded, faiss.IndexIDMap2) or not isinstance(
            faiss.downcast_index(loaded.index), faiss.IndexFlat
        ):
            raise ConfigError(  # Mem0's faiss store keeps a bare IndexFlatL2: never advise deleting a user's data
                f"{file} holds a {type(loaded).__name__}, not InferScale's IndexIDMap2 over an IndexFlat: a Mem0 faiss "
                "store's index, say. Keep it and give InferScale another index_path (another faiss path in a Mem0 "
                "config); `inferscale import-mem0` moves a Mem0 store's memories over. Delete it only if InferScale "
                "wrote it (the index is rebuilt from the database)"
            )
        if loaded.d != index._dim and saved.embedder != embedder:
            log.warning(
                "the index %s holds %d-d vectors of the embedder %r, not %d-d ones of %r: they are not loaded, and "
                "the index starts empty (to be embedded again)",
                file,
                loaded.d,
                saved.embedder,
                index._dim,
                embedder,
            )
            return cls(dim, path, search, embedder)
        if loaded.d != index._dim:
            raise InvalidInputError(
                f"the index at {file} has dim {loaded.d} but dim {index._dim} was asked for; was it built by "
                "another embedder? Delete it and rebuild"
            )
        index._index = loaded
        index._ids = IdSet(index.ids())
        if saved.label_ids is None or saved.label_values is None:  # the earliest versions: the labels beside it
            label_ids, label_values = index_file.read_side_labels(labels_path(file), index_file.digest(saved.index))
        else:
            label_ids, label_values = saved.label_ids, saved.label_values
        keep = index._ids.contains(label_ids)
        index._labels.replace(label_ids[keep], label_values[keep])
        if saved.ann is not None:
            index._ann = ApproximateIndex.from_bytes(
                saved.ann, saved.ann_trained_for, index._dim, len(index._ids), index._search.ivf_nlist
            )
        return index

    # ---- properties --------------------------------------------------------------------------------------

    @property
    def dim(self) -> int:
        """The vector size."""
        return self._dim

    @property
    def embedder(self) -> str | None:
        """The identity of the embedder whose vectors it holds, saved with it (``None``: not recorded)."""
        return self._embedder

    def set_embedder(self, embedder: str) -> None:
        """Record that the vectors are ``embedder``'s (an identity, saved with the index from the next save on).

        Raises:
            InvalidInputError: when ``embedder`` is not a non-empty str.
        """
        if not isinstance(embedder, str) or not embedder:
            raise InvalidInputError(f"embedder must be a non-empty str, got {embedder!r}")
        with self._lock:
            self._embedder = embedder

    @property
    def path(self) -> Path | None:
        """The file :meth:`save` writes by default."""
        return self._path

    @property
    def search_config(self) -> SearchConfig:
        """Which search path serves which scope size."""
        return self._search

    @property
    def approximate_lists(self) -> int:
        """The approximate index's number of lists; 0 while it is not built."""
        with self._lock:
            return self._ann.nlist if self._ann is not None else 0

    @property
    def approximate_builds(self) -> int:
        """How many times this object has built (or re-trained) the approximate index: by a search that needed it
        or by :meth:`build_approximate`. One loaded by :meth:`open` is not counted. An owner that saves the index
        compares it before and after a search to tell that the file no longer holds what is in memory."""
        with self._lock:
            return self._ann_builds

    @property
    def approximate_on_gpu(self) -> bool:
        """Whether a GPU copy of the approximate index is held."""
        with self._lock:
            return self._ann is not None and self._ann.on_gpu

    @staticmethod
    def gpu_available() -> bool:
        """Whether FAISS sees a GPU (always ``False`` with ``faiss-cpu``); the approximate index uses it then, unless
        ``search.gpu`` is off."""
        return gpu_count() > 0

    def __len__(self) -> int:
        return int(self._index.ntotal)

    def __repr__(self) -> str:
        return f"VectorIndex(dim={self._dim}, n={len(self)}, path={self._path!r})"

    def ids(self) -> np.ndarray:
        """The stored ids: int64 ``[len(self)]``, in storage order (a replaced id moves to the end; a copy)."""
        with self._lock:
            return faiss.vector_to_array(self._index.id_map).astype(np.int64, copy=True)

    def labels(self, ids: np.ndarray) -> list[str | None]:
        """The label of each of ``ids`` (int64 ``[n]``): what its vector was computed from, or ``None`` for an id
        without a label or not in the index.

        Raises:
            InvalidInputError: when ``ids`` is not a 1-D array of non-negative integers.
        """
        id_array = check_ids(ids)
        with self._lock:
            found, values = self._labels.lookup(id_array)
        return [v.decode("ascii") if f else None for f, v in zip(found.tolist(), values.tolist(), strict=True)]

    def stale_ids(self, ids: np.ndarray, labels: Sequence[str]) -> np.ndarray:
        """Which of ``ids`` do not hold a vector labelled as given: absent, unlabelled or labelled otherwise.

        Args:
            ids: int64 ``[n]``.
            labels: ``n`` labels, the one each id should carry (e.g. its memory's current text hash).

        Returns:
            int64 ``[m]``, the ids that differ, in the order given.

        Raises:
            InvalidInputError: when ``ids`` is not a 1-D array of non-negative integers or ``labels`` does not
                hold one str per id.
        """
        id_array = check_ids(ids)
        if isinstance(labels, str) or len(labels) != id_array.size:
            raise InvalidInputError(f"pass one label per id: {id_array.size} ids, {len(labels)} labels")
        try:
            wanted = label_array(labels)
        except (TypeError, UnicodeEncodeError) as exc:
            raise InvalidInputError(f"labels must be ASCII str: {exc}") from exc
        with self._lock:
            found, values = self._labels.lookup(id_array)
        return id_array[~found | differ(values, wanted)]

    def vectors(self, ids: np.ndarray) -> np.ndarray:
        """The stored vectors of ``ids``: float32 ``[n, dim]``.

        Raises:
            InvalidInputError: when ``ids`` is not a 1-D array of non-negative integers or an id is not in the
                index.
        """
        id_array = check_ids(ids)
        with self._lock:
            missing = id_array[~self._ids.contains(id_array)]
            if missing.size:
                raise InvalidInputError(f"ids not in the index: {missing[:10].tolist()}")
            if id_array.size == 0:
                return np.zeros((0, self._dim), dtype=np.float32)
            with one_thread():
                return np.asarray(self._index.reconstruct_batch(id_array), dtype=np.float32)

    # ---- mutations ---------------------------------------------------------------------------------------

    def add(self, ids: np.ndarray, vectors: np.ndarray, labels: Sequence[str] | None = None) -> None:
        """Add ``vectors`` under ``ids``; an id already in the index has its vector (and label) replaced.

        Args:
            ids: int64 ``[n]``, distinct, non-negative (the memories' ``vector_id``).
            vectors: float32 ``[n, dim]``, finite, L2-normalised (other float dtypes are converted).
            labels: ``n`` labels (ASCII, 1 to :data:`MAX_LABEL_LENGTH` characters): what each vector was computed
                from, e.g. the memory's text hash; ``None`` leaves the vectors unlabelled.

        Raises:
            InvalidInputError: on a shape, dtype or dimension mismatch, repeated ids, non-finite values or bad
                labels. Nothing is added then.
        """
        id_array = check_ids(ids)
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
        checked = check_labels(labels, id_array.size) if labels is not None else None
        if id_array.size == 0:
            return
        matrix = np.ascontiguousarray(matrix, dtype=np.float32)
        with self._lock:
            held = self._ids.contains(id_array)
            if held.any():  # a replacement: FAISS's removal rewrites the whole store, so only when needed
                self._remove_held(id_array[held])
            self._index.add_with_ids(matrix, id_array)
            self._ids.add(id_array)
            if self._ann is not None:
                self._ann.add(id_array, matrix)
            self._labels.drop(id_array)
            if checked is not None:
                self._labels.put(id_array, checked)

    def remove(self, ids: np.ndarray) -> int:
        """Remove the vectors of ``ids`` (int64 ``[n]``); ids not in the index are ignored.

        Returns:
            How many vectors were removed.

        Raises:
            InvalidInputError: when ``ids`` is not a 1-D array of non-negative integers.
        """
        id_array = check_ids(ids)
        if id_array.size == 0:
            return 0
        with self._lock:
            self._labels.drop(id_array)
            held = np.unique(id_array[self._ids.contains(id_array)])
            return self._remove_held(held) if held.size else 0

    def _remove_held(self, held: np.ndarray) -> int:
        """Remove ``held`` (int64 ``[n]``, distinct, all in the index) from the stores; their labels stay. Call
        with the lock held."""
        removed = int(self._index.remove_ids(faiss.IDSelectorBatch(held)))
        self._ids.remove(held)
        if self._ann is not None:
            self._ann.remove(held)
        return removed

    def reset(self) -> None:
        """Remove every vector (and the approximate index)."""
        with self._lock:
            self._index.reset()
            self._ids.clear()
            self._labels.clear()
            self._ann = None

    def build_approximate(self) -> None:
        """Build (or re-train) the approximate index over every stored vector now, whatever the index's size;
        searches otherwise build it when they first need it. Does nothing on an empty index."""
        with self._lock:
            if len(self._ids):
                self._ann = self._build_approximate()

    def _build_approximate(self) -> ApproximateIndex:
        """A new approximate index over the exact store's vectors (read in place). Call with the lock held."""
        n = int(self._index.ntotal)
        flat = faiss.downcast_index(self._index.index)
        if not isinstance(flat, faiss.IndexFlat):
            raise AssertionError(f"the exact store wraps a {type(flat).__name__}, not an IndexFlat")
        vectors = faiss.rev_swig_ptr(flat.get_xb(), n * self._dim).reshape(n, self._dim)
        ids = faiss.vector_to_array(self._index.id_map).astype(np.int64, copy=False)
        built = ApproximateIndex.build(ids, vectors, self._search.ivf_nlist)
        self._ann_builds += 1
        return built

    # ---- search ------------------------------------------------------------------------------------------

    def search(self, query: np.ndarray, k: int, allowed_ids: np.ndarray | None = None) -> list[tuple[int, float]]:
        """The ``k`` nearest ids to ``query`` by inner product, best first (equal scores by ascending id).

        A scope of at most ``search.exact_scope_max`` ids present in the index is searched exactly over its own
        vectors; see the module doc for the larger ones, which may build the approximate index first.

        Args:
            query: float32 ``[dim]`` (or ``[1, dim]``), L2-normalised.
            k: how many results at most (>= 1).
            allowed_ids: when given, int64 ``[m]``: only these ids can be returned (ids not in the index are
                ignored). The restriction runs inside the search, so the top-k is taken within the allowed set;
                an empty set returns ``[]``.

        Returns:
            ``[(id, score), ...]`` with at most ``min(k, candidates)`` pairs, scores descending (cosine).

        Raises:
            InvalidInputError: on a shape or dimension mismatch, a non-finite query or a bad ``k``.
        """
        q = self._check_query(query)
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
            raise InvalidInputError(f"k must be a positive int, got {k!r}")
        k = int(k)
        allowed = check_ids(allowed_ids, "allowed_ids") if allowed_ids is not None else None
        if allowed is not None and allowed.size == 0:
            return []
        with self._lock:
            total = len(self._ids)
            if total == 0:
                return []
            if allowed is not None:
                allowed = distinct_sorted(allowed)
                allowed = allowed[self._ids.contains(allowed)]
                if allowed.size == 0:
                    return []
                if allowed.size <= self._search.exact_scope_max:
                    with one_thread():
                        vectors = np.asarray(self._index.reconstruct_batch(allowed))
                    return as_pairs(*top_k(allowed, inner_products(vectors, q[0]), k))
            ann = self._approximate(total)  # built here first when needed: on every thread
            found, scores = self._search_large(q, k, allowed, total, ann)
        return as_pairs(*top_k(found, scores, k))

    def _search_large(
        self, q: np.ndarray, k: int, allowed: np.ndarray | None, total: int, ann: ApproximateIndex | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The top-``k`` candidates (ids int64 ``[j]``, scores float32 ``[j]``) of a search without a scope or in one
        larger than ``search.exact_scope_max`` (``allowed``, int64 ``[m]``, ids in the index): from ``ann`` when
        given and it finds enough, else from the exact scan. Call with the lock held."""
        candidates = total if allowed is None else int(allowed.size)
        on_gpu = ann is not None and allowed is None and self._search.gpu and ann.use_gpu()
        with one_thread():
            if ann is not None:
                nprobe = self._search.ivf_nprobe
                found, scores = with_ties(lambda n: ann.search(q, n, nprobe, allowed, gpu=on_gpu), k, candidates)
                if found.size >= min(k, candidates):  # else the visited lists held too few of the scope: scan
                    return found, scores
            return with_ties(lambda n: self._scan(q, n, allowed), k, candidates)

    def _check_query(self, query: np.ndarray) -> np.ndarray:
        """``query`` as float32 ``[1, dim]``.

        Raises:
            InvalidInputError: on a shape or dimension mismatch, a non-float dtype or a non-finite value.
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
        return np.ascontiguousarray(vector, dtype=np.float32).reshape(1, self._dim)

    def _approximate(self, total: int) -> ApproximateIndex | None:
        """The approximate index when ``total`` vectors call for it, built or re-trained first when it is missing
        or the index has grown ``search.rebuild_growth`` times since it was trained; ``None`` below
        ``search.approximate_min_total``. Call with the lock held."""
        threshold = self._search.approximate_min_total
        if threshold is None or total < threshold:
            return None
        if self._ann is None or total >= self._search.rebuild_growth * self._ann.trained_for:
            self._ann = self._build_approximate()
        return self._ann

    def _scan(self, q: np.ndarray, n: int, allowed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """The exact top-``n`` of the whole store (FAISS ``IndexFlatIP``), among ``allowed`` (int64 ``[m]``) when
        given: int64 ``[j]`` ids and float32 ``[j]`` scores. Call with the lock held."""
        if allowed is None:
            scores, found = self._index.search(q, n)
        else:
            selector = id_selector(allowed)  # kept alive by this frame during the search
            params = faiss.SearchParameters()
            params.sel = selector
            scores, found = self._index.search(q, n, params=params)
        keep = found[0] >= 0
        return found[0][keep].astype(np.int64), scores[0][keep]

    # ---- persistence -------------------------------------------------------------------------------------

    @staticmethod
    def sweep_temp_files(path: Path | str) -> int:
        """Remove the temporary files that saves of the index at ``path`` (index or labels) left when their process
        died before the rename; those of live processes are kept (:func:`inferscale.atomic.sweep_temp_files`).
        Returns how many were removed."""
        file = Path(path)
        return sweep_temp_files(file.parent, f".{glob.escape(file.name)}*{TEMP_SUFFIX}")

    def save(self, path: Path | str | None = None) -> Path:
        """Write the index, its labels and the approximate index (when built) atomically, in one file (a temporary
        file in the same folder, fsynced, then ``os.replace``); a labels file an earlier version left beside it is
        removed.

        Args:
            path: where to write; defaults to the path the index was created or opened with.

        Returns:
            The index file written.

        Raises:
            InvalidInputError: when neither ``path`` nor the index's own path is set.
        """
        target = Path(path) if path is not None else self._path
        if target is None:
            raise InvalidInputError("this index has no path; pass save(path) or create it with a path")
        target.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            saved = index_file.SavedIndex(
                faiss.serialize_index(self._index),
                self._labels.ids,  # replaced, never changed in place
                self._labels.values,
                self._ann.to_bytes() if self._ann is not None else None,
                self._ann.trained_for if self._ann is not None else 0,
                self._embedder,
            )
        atomic_write(target, index_file.encode(saved))
        labels_path(target).unlink(missing_ok=True)  # an earlier version's labels: now in the file itself
        return target


__all__ = ["MAX_LABEL_LENGTH", "VectorIndex", "labels_path"]
