"""The index file: the exact store, its labels and the approximate index in one uncompressed ``.npz``, written by
one atomic rename (:meth:`inferscale.retrieval.VectorIndex.save`), so saves of two processes that interleave leave
one save's index with that save's labels, never a mismatch.

Entries: ``index`` (the serialised FAISS ``IndexIDMap2``, uint8), ``ids`` and ``labels`` (the labelled ids and their
labels), and, when the approximate index is built, ``ann`` (the serialised ``IndexIVFFlat``) with ``ann_trained_for``
(how many vectors it was trained on), and ``embedder``, the identity of the embedder whose vectors it holds
(:func:`~inferscale.retrieval.embedder.embedder_identity`; absent when the index was saved without one, or by an
earlier version). Files without ``ann`` (no approximate index yet, or an earlier version) are
read; files of the earliest versions (the bare FAISS index, its labels beside it in ``<index>.labels.npz`` bound to
the index bytes by a digest) are read too.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import zipfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from inferscale.errors import ConfigError

log = logging.getLogger(__name__)

NPZ_MAGIC = b"PK\x03\x04"
"""How an index file of this version starts (a zip archive: ``.npz``); one of the earliest versions is bare FAISS."""


class DamagedIndexFileError(ConfigError):
    """An index file this version wrote (an ``.npz``), or an empty one, that cannot be read: cut short by a full
    disk or an interrupted copy, or changed in place. What it held is derived from the database, so the caller sets
    it aside (:func:`set_aside`) and rebuilds the index rather than refuse to serve."""


@dataclass(frozen=True, slots=True)
class SavedIndex:
    """What an index file holds.

    Attributes:
        index: the serialised exact store, uint8 ``[b]``.
        label_ids: the labelled ids, int64 ``[m]`` (``None``: a bare FAISS file, whose labels lie beside it).
        label_values: their labels, bytes ``[m]`` (``None`` with ``label_ids``).
        ann: the serialised approximate index, uint8 ``[c]``, or ``None``.
        ann_trained_for: how many vectors the approximate index was trained on (0 without one).
        embedder: the identity of the embedder whose vectors it holds (``None``: not recorded).
    """

    index: np.ndarray
    label_ids: np.ndarray | None = None
    label_values: np.ndarray | None = None
    ann: np.ndarray | None = None
    ann_trained_for: int = 0
    embedder: str | None = None


def labels_path(path: Path) -> Path:
    """The labels file the earliest versions saved beside the index file ``path`` (``<name>.labels.npz``)."""
    return path.with_name(f"{path.name}.labels.npz")


def digest(data: bytes | np.ndarray) -> str:
    """32 hex characters naming the serialised index bytes ``data`` (blake2b)."""
    buffer = data if isinstance(data, bytes) else np.ascontiguousarray(data).data
    return hashlib.blake2b(buffer, digest_size=16).hexdigest()


def encode(saved: SavedIndex) -> memoryview:
    """``saved`` as the bytes of an index file (``.npz``)."""
    buffer = io.BytesIO()
    arrays: dict[str, np.ndarray] = {"index": saved.index}
    if saved.label_ids is not None and saved.label_values is not None:
        arrays.update(ids=saved.label_ids, labels=saved.label_values)
    if saved.ann is not None:
        arrays.update(ann=saved.ann, ann_trained_for=np.array(saved.ann_trained_for, dtype=np.int64))
    if saved.embedder is not None:
        arrays.update(embedder=np.array(saved.embedder, dtype=np.str_))
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getbuffer()


def read(file: Path) -> SavedIndex:
    """What ``file`` holds (labels are ``None`` for a bare FAISS file of the earliest versions).

    Raises:
        DamagedIndexFileError: when the file is empty, holds only zero bytes (what a power loss leaves of a file
            whose blocks were never written), is cut short within :data:`NPZ_MAGIC`, or is an ``.npz`` that cannot
            be read.
    """
    data = np.fromfile(file, dtype=np.uint8)
    if data.size == 0:
        raise DamagedIndexFileError(f"the index file {file} is empty")
    if not data.any():
        raise DamagedIndexFileError(f"the index file {file} holds only zero bytes")
    if data.size < len(NPZ_MAGIC) and NPZ_MAGIC.startswith(data.tobytes()):
        raise DamagedIndexFileError(f"the index file {file} is cut short ({data.size} bytes)")
    if data[: len(NPZ_MAGIC)].tobytes() != NPZ_MAGIC:
        return SavedIndex(data)
    try:
        with np.load(file, allow_pickle=False) as saved:
            index = np.asarray(saved["index"], dtype=np.uint8).reshape(-1)
            label_ids = np.asarray(saved["ids"], dtype=np.int64).reshape(-1)
            values = np.asarray(saved["labels"])
            ann = np.asarray(saved["ann"], dtype=np.uint8).reshape(-1) if "ann" in saved.files else None
            trained_for = int(saved["ann_trained_for"]) if ann is not None else 0
            embedder = str(saved["embedder"]) if "embedder" in saved.files else None
        if values.dtype.kind != "S" or values.shape != label_ids.shape:
            raise ValueError(f"labels of dtype {values.dtype} and shape {values.shape} for {label_ids.size} ids")
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:  # np.load of a cut .npz: BadZipFile
        raise DamagedIndexFileError(f"cannot read the index file {file}: {exc}") from exc
    return SavedIndex(index, label_ids, values, ann, trained_for, embedder)


def set_aside(file: Path, read: os.stat_result) -> Path | None:
    """Rename the damaged index file ``file`` to ``<name>.damaged-<UTC time>`` beside it, keeping its bytes, when it
    is still the file that was read (``read``: its ``stat`` then). Another process that found it damaged too may have
    set it aside and saved a rebuilt index in its place meanwhile: that one is left where it is.

    Returns:
        Where the file now lies, or ``None`` when it was left: replaced or removed meanwhile, or not renamed (a
        read-only folder, say: logged; the index is rebuilt all the same and its next save fails as it would).
    """
    try:
        now = file.stat()
    except FileNotFoundError:
        return None
    if (now.st_ino, now.st_size, now.st_mtime_ns) != (read.st_ino, read.st_size, read.st_mtime_ns):
        return None
    aside = file.with_name(f"{file.name}.damaged-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S.%fZ')}")
    try:
        file.rename(aside)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("the damaged index file %s could not be set aside (%s); it stays where it is", file, exc)
        return None
    return aside


def read_side_labels(file: Path, index_digest: str) -> tuple[np.ndarray, np.ndarray]:
    """The labelled ids (int64 ``[m]``) and their labels (bytes ``[m]``) an earlier version saved in ``file`` beside
    the index, when it belongs to the index bytes of digest ``index_digest``, else none (logged)."""
    none = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype="S1"))
    if not file.exists():
        return none
    try:
        with np.load(file, allow_pickle=False) as saved:
            found_digest = str(saved["index"])
            label_ids = np.asarray(saved["ids"], dtype=np.int64).reshape(-1)
            values = np.asarray(saved["labels"])
        if values.dtype.kind != "S" or values.shape != label_ids.shape:
            raise ValueError(f"labels of dtype {values.dtype} and shape {values.shape} for {label_ids.size} ids")
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:  # np.load of a cut .npz: BadZipFile
        log.warning("ignoring the unreadable index labels %s (%s); every vector counts as unlabelled", file, exc)
        return none
    if found_digest != index_digest:
        log.info("the index labels %s belong to another save of the index; every vector counts as unlabelled", file)
        return none
    return label_ids, values


__all__ = [
    "NPZ_MAGIC",
    "DamagedIndexFileError",
    "SavedIndex",
    "digest",
    "encode",
    "labels_path",
    "read",
    "read_side_labels",
    "set_aside",
]
