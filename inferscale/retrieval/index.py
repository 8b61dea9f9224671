"""A FAISS vector index keyed by the memories' integer ``vector_id``s, with search restricted to a scope.

Each vector may carry a label: what it was computed from (the memories' text hash), so a caller can tell a stale
vector from a current one. The index and its labels are saved together in one file (an uncompressed ``.npz``:
the serialised FAISS index, the labelled ids and their labels) by one atomic rename, so saves of two processes
that interleave leave one save's index with that save's labels, never a mismatch.

Files of earlier versions (the bare FAISS index, its labels beside it in ``<index>.labels.npz`` bound to the
index bytes by a digest) are still read; the next save replaces them.
"""

from __future__ import annotations

import glob
import hashlib
import io
import logging
import threading
from collections.abc import Sequence
from pathlib import Path

import faiss
import numpy as np

from inferscale.atomic import TEMP_SUFFIX, atomic_write, sweep_temp_files
from inferscale.errors import ConfigError, InvalidInputError

log = logging.getLogger(__name__)

MAX_LABEL_LENGTH = 128
"""The longest label (ASCII characters): a hex digest fits."""


def labels_path(path: Path) -> Path:
    """The labels file saved beside the index file ``path`` (``<name>.labels.npz``)."""
    return path.with_name(f"{path.name}.labels.npz")


def _digest(data: bytes | np.ndarray) -> str:
    """32 hex characters naming the serialised index bytes ``data`` (blake2b)."""
    buffer = data if isinstance(data, bytes) else np.ascontiguousarray(data).data
    return hashlib.blake2b(buffer, digest_size=16).hexdigest()


def _check_labels(labels: Sequence[str], n: int) -> np.ndarray:
    """``labels`` as a bytes array ``[n]`` of ASCII strings of 1 to :data:`MAX_LABEL_LENGTH` characters (no NUL,
    which numpy's bytes arrays strip at the end)."""
    if isinstance(labels, str) or len(labels) != n:
        raise InvalidInputError(f"pass one label per id: {n} ids, got {labels!r:.80}")
    for label in labels:
        if not isinstance(label, str) or not 0 < len(label) <= MAX_LABEL_LENGTH or not label.isascii():
            raise InvalidInputError(f"a label must be 1 to {MAX_LABEL_LENGTH} ASCII characters, got {label!r:.80}")
        if "\x00" in label:
            raise InvalidInputError(f"a label must not hold NUL characters, got {label!r:.80}")
    return _label_array(labels)


def _label_array(labels: Sequence[str]) -> np.ndarray:
    """``labels`` (ASCII str) as a bytes array ``[n]``; labels of one length (hex digests) are joined and viewed,
    which is several times faster than converting each."""
    lengths = set(map(len, labels))
    if len(lengths) == 1:
        (width,) = lengths
        return np.frombuffer("".join(labels).encode("ascii"), dtype=f"S{width}")
    return np.array(list(labels), dtype="S") if labels else np.zeros(0, dtype="S1")


def _differ(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise ``a != b`` for bytes arrays ``[n]``: bool ``[n]``. Arrays of one width are compared as bytes
    ``[n, width]``, several times faster than numpy's string comparison."""
    if a.dtype.itemsize != b.dtype.itemsize or a.size == 0:
        return np.asarray(a != b, dtype=bool).reshape(-1)
    width = a.dtype.itemsize
    bytes_a = np.ascontiguousarray(a).view(np.uint8).reshape(-1, width)
    bytes_b = np.ascontiguousarray(b).view(np.uint8).reshape(-1, width)
    return np.asarray((bytes_a != bytes_b).any(axis=1))


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
        # The labelled ids, ascending, and their labels aligned with them (bytes): compared with numpy, not in a
        # Python loop, since every search checks its whole scope (tens of thousands of ids).
        self._label_ids = np.zeros(0, dtype=np.int64)
        self._label_values = np.zeros(0, dtype="S1")

    @classmethod
    def open(cls, path: Path | str, dim: int) -> VectorIndex:
        """The index saved at ``path``, or an empty one (bound to ``path``) when the file does not exist.

        The labels saved with it are loaded when their file belongs to these index bytes; otherwise (no labels
        file, or one from another save) every vector is unlabelled.

        Raises:
            InvalidInputError: when the saved index has another dimension than ``dim``.
            ConfigError: when the file is not a readable FAISS ``IndexIDMap2`` (delete it and rebuild the index
                from the database with :meth:`add`).
        """
        index = cls(dim, path)
        file = Path(path)
        if not file.exists():
            return index
        data = np.fromfile(file, dtype=np.uint8)
        saved_labels: tuple[np.ndarray, np.ndarray] | None = None
        if data[: len(_NPZ_MAGIC)].tobytes() == _NPZ_MAGIC:
            data, saved_labels = _read_bundle(file)
        try:
            loaded = faiss.deserialize_index(data)
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
        if saved_labels is None:  # a file of an earlier version: the labels beside it
            saved_labels = _load_labels(labels_path(file), _digest(data), index.ids())
        label_ids, label_values = saved_labels
        keep = np.isin(label_ids, index.ids())
        index._set_labels(label_ids[keep], label_values[keep])
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

    def labels(self, ids: np.ndarray) -> list[str | None]:
        """The label of each of ``ids`` (int64 ``[n]``): what its vector was computed from, or ``None`` for an id
        without a label or not in the index.

        Raises:
            InvalidInputError: when ``ids`` is not a 1-D array of non-negative integers.
        """
        id_array = _check_ids(ids)
        with self._lock:
            found, values = self._lookup(id_array)
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
        id_array = _check_ids(ids)
        if isinstance(labels, str) or len(labels) != id_array.size:
            raise InvalidInputError(f"pass one label per id: {id_array.size} ids, {len(labels)} labels")
        try:
            wanted = _label_array(labels)
        except (TypeError, UnicodeEncodeError) as exc:
            raise InvalidInputError(f"labels must be ASCII str: {exc}") from exc
        with self._lock:
            found, values = self._lookup(id_array)
        return id_array[~found | _differ(values, wanted)]

    def _lookup(self, id_array: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For int64 ``[n]`` ids: whether each has a label (bool ``[n]``) and the label (bytes ``[n]``, meaningless
        where it has none). Call with the lock held."""
        if self._label_ids.size == 0:
            return np.zeros(id_array.size, dtype=bool), np.zeros(id_array.size, dtype="S1")
        pos = np.minimum(np.searchsorted(self._label_ids, id_array), self._label_ids.size - 1)
        return self._label_ids[pos] == id_array, self._label_values[pos]

    def _set_labels(self, ids: np.ndarray, values: np.ndarray) -> None:
        """Hold the labels ``values`` (bytes ``[n]``) of distinct ``ids`` (int64 ``[n]``), sorted by id."""
        order = np.argsort(ids, kind="stable")  # near-sorted after an append: timsort runs in about linear time
        self._label_ids, self._label_values = ids[order], values[order]

    def _drop_labels(self, id_array: np.ndarray) -> None:
        """Forget the labels of ``id_array`` (int64 ``[n]``). Call with the lock held."""
        keep = ~np.isin(self._label_ids, id_array)
        self._label_ids, self._label_values = self._label_ids[keep], self._label_values[keep]

    def vectors(self, ids: np.ndarray) -> np.ndarray:
        """The stored vectors of ``ids``: float32 ``[n, dim]``.

        Raises:
            InvalidInputError: when ``ids`` is not a 1-D array of non-negative integers or an id is not in the
                index.
        """
        id_array = _check_ids(ids)
        with self._lock:
            missing = np.setdiff1d(id_array, faiss.vector_to_array(self._index.id_map))
            if missing.size:
                raise InvalidInputError(f"ids not in the index: {missing[:10].tolist()}")
            if id_array.size == 0:
                return np.zeros((0, self._dim), dtype=np.float32)
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
        checked = _check_labels(labels, id_array.size) if labels is not None else None
        if id_array.size == 0:
            return
        matrix = np.ascontiguousarray(matrix, dtype=np.float32)
        with self._lock:
            self._index.remove_ids(faiss.IDSelectorBatch(id_array))
            self._index.add_with_ids(matrix, id_array)
            self._drop_labels(id_array)
            if checked is not None:
                self._set_labels(
                    np.concatenate([self._label_ids, id_array]), np.concatenate([self._label_values, checked])
                )

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
            self._drop_labels(id_array)
            return int(self._index.remove_ids(faiss.IDSelectorBatch(id_array)))

    def reset(self) -> None:
        """Remove every vector."""
        with self._lock:
            self._index.reset()
            self._drop_labels(self._label_ids)

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

    @staticmethod
    def sweep_temp_files(path: Path | str) -> int:
        """Remove the temporary files that saves of the index at ``path`` (index or labels) left when their process
        died before the rename; those of live processes are kept (:func:`inferscale.atomic.sweep_temp_files`).
        Returns how many were removed."""
        file = Path(path)
        return sweep_temp_files(file.parent, f".{glob.escape(file.name)}*{TEMP_SUFFIX}")

    def save(self, path: Path | str | None = None) -> Path:
        """Write the index and its labels atomically, in one file (a temporary file in the same folder, fsynced,
        then ``os.replace``); a labels file an earlier version left beside it is removed.

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
            data = faiss.serialize_index(self._index)
            label_ids, label_values = self._label_ids, self._label_values  # replaced, never changed in place
        buffer = io.BytesIO()
        np.savez(buffer, index=data, ids=label_ids, labels=label_values)
        atomic_write(target, buffer.getbuffer())
        labels_path(target).unlink(missing_ok=True)  # an earlier version's labels: now in the file itself
        return target


_NPZ_MAGIC = b"PK\x03\x04"
"""How an index file of this version starts (a zip archive: ``.npz``); one of an earlier version is bare FAISS."""


def _read_bundle(file: Path) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """The FAISS index bytes (uint8 ``[n]``) and labels (int64 ids ``[m]``, bytes ``[m]``) saved in ``file``.

    Raises:
        ConfigError: when the file is not an index file this version writes (delete it: it is rebuilt).
    """
    try:
        with np.load(file, allow_pickle=False) as saved:
            data = np.asarray(saved["index"], dtype=np.uint8).reshape(-1)
            label_ids = np.asarray(saved["ids"], dtype=np.int64).reshape(-1)
            values = np.asarray(saved["labels"])
        if values.dtype.kind != "S" or values.shape != label_ids.shape:
            raise ValueError(f"labels of dtype {values.dtype} and shape {values.shape} for {label_ids.size} ids")
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"cannot read the index file {file}: {exc}; delete it and rebuild") from exc
    return data, (label_ids, values)


def _load_labels(file: Path, index_digest: str, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The labelled ids (int64 ``[m]``) and their labels (bytes ``[m]``) an earlier version saved in ``file`` beside
    the index, when it belongs to the index bytes of digest ``index_digest``, else none (logged). Labels of ids not
    in ``ids`` are dropped."""
    none = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype="S1"))
    if not file.exists():
        return none
    try:
        with np.load(file, allow_pickle=False) as saved:
            digest = str(saved["index"])
            label_ids = np.asarray(saved["ids"], dtype=np.int64).reshape(-1)
            values = np.asarray(saved["labels"])
        if values.dtype.kind != "S" or values.shape != label_ids.shape:
            raise ValueError(f"labels of dtype {values.dtype} and shape {values.shape} for {label_ids.size} ids")
    except (OSError, ValueError, KeyError) as exc:
        log.warning("ignoring the unreadable index labels %s (%s); every vector counts as unlabelled", file, exc)
        return none
    if digest != index_digest:
        log.info("the index labels %s belong to another save of the index; every vector counts as unlabelled", file)
        return none
    keep = np.isin(label_ids, ids)
    return label_ids[keep], values[keep]
