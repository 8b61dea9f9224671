"""Disk tier: one safetensors file per entry, written atomically, which survives restarts.

Layout: ``<root>/<memory_id>/<key digest>.safetensors``. Each file's metadata records the full key
(:mod:`inferscale.kv.tiers.serialization`); a file found under a key but recorded for another fingerprint, text
hash or encoding is refused with :class:`KVFingerprintMismatchError`, never returned.

Writes are atomic (:func:`inferscale.atomic.atomic_write`): a temporary file in the entry's folder that names its
writer, then a rename; :meth:`DiskTier.sweep_temp_files` removes those of writers that died before the rename.

The folder holds its own random id in ``<root>/store-id`` (:meth:`DiskTier.store_id`), made by its first write. Two
folders at the same path on two hosts sharing one database hold different ids, so a ``kv_entries`` row can say which
of them holds its file (:func:`inferscale.reconcile.filed_here`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

from safetensors import SafetensorError, safe_open
from safetensors.torch import save

from inferscale.atomic import TEMP_MAX_AGE_S, TEMP_SUFFIX, atomic_write, create_once, sweep_temp_files
from inferscale.errors import InvalidInputError
from inferscale.kv.fact import FactKV
from inferscale.kv.tiers.base import Evicted, KVKey, check_memory_id, is_memory_id
from inferscale.kv.tiers.serialization import (
    KVChecksumError,
    KVFormatError,
    check_header,
    check_key,
    fact_from_payload,
    fact_to_payload,
    key_from_metadata,
)

SUFFIX = ".safetensors"

STORE_ID_FILE = "store-id"
"""The file under a K/V folder's root that holds the folder's id (:meth:`DiskTier.store_id`)."""

_STORE_ID = re.compile(r"[0-9a-f]{32}")

log = logging.getLogger(__name__)


class DiskTier:
    """Safetensors files under ``root``; unbounded (nothing is evicted), thread- and process-safe for writes.

    Writes go to a uniquely named temporary file in the entry's folder, are flushed (and fsync'ed when
    ``fsync``), then renamed over the final name, so a reader sees either the old file, the new one or none,
    never a partial file. The constructor does no I/O; folders are created on first write.

    Args:
        root: the folder of this tier. Only files this tier wrote are ever removed from it.
        fsync: fsync each file before renaming it (durable across power loss; a few ms per write).
    """

    name = "disk"

    def __init__(self, root: Path, fsync: bool = True) -> None:
        self._root = Path(os.path.abspath(root))  # entries name their file to other processes: keep it absolute
        self._fsync = fsync
        self._store_id: str | None = None

    @property
    def root(self) -> Path:
        """The folder of this tier."""
        return self._root

    def store_id(self) -> str:
        """This folder's id: 32 hex characters, random, made (and the folder with it) on the first call for the
        folder by any process, and read from its file on every call: a file removed by hand while this process ran
        is written again with the id it has used, and one another process made again meanwhile is taken (with a
        warning), so the rows written next name the id the folder has. A ``kv_entries`` row records the id of the
        folder
        its writer put the file in, so a client can tell a row of its own folder, whose file is gone, from a row of
        another host's folder at the same path, whose file it cannot see.

        Raises:
            KVFormatError: when ``<root>/store-id`` holds anything but an id.
            OSError: when the folder or the file cannot be written.
        """
        try:
            found = self._parse_store_id((self._root / STORE_ID_FILE).read_bytes())
        except FileNotFoundError:  # new, or removed by hand: made again, with the id this process has used
            self._root.mkdir(parents=True, exist_ok=True)
            wanted = self._store_id or uuid.uuid4().hex
            found = self._parse_store_id(create_once(self._root / STORE_ID_FILE, wanted.encode(), fsync=self._fsync))
        if self._store_id is not None and found != self._store_id:
            log.warning(
                "the K/V folder %s now has the id %s, not %s: it was made again by another process; rows written "
                "from now on record the new id",
                self._root,
                found,
                self._store_id,
            )
        self._store_id = found
        return found

    def existing_store_id(self) -> str | None:
        """This folder's id as its file holds it now (:meth:`store_id`), or ``None`` when there is none (no process
        made one yet, or it was removed); it makes none.

        Raises:
            KVFormatError: when ``<root>/store-id`` holds anything but an id.
            OSError: when the file exists but cannot be read.
        """
        try:
            data = (self._root / STORE_ID_FILE).read_bytes()
        except FileNotFoundError:
            return None
        return self._parse_store_id(data)

    def _parse_store_id(self, data: bytes) -> str:
        text = data.decode("ascii", errors="replace").strip()
        if _STORE_ID.fullmatch(text) is None:
            raise KVFormatError(
                f"{self._root / STORE_ID_FILE} should hold this K/V folder's id (32 hex characters) and holds "
                f"{text[:40]!r}; restore it, or remove it if no other host shares this folder's database"
            )
        return text

    @staticmethod
    def file_name(key: KVKey) -> str:
        """The name of the file ``key`` is stored in, inside its memory's folder."""
        return f"{key.digest()}{SUFFIX}"

    def path(self, key: KVKey) -> Path:
        """The file ``key`` is stored in (whether or not it exists)."""
        return self._root / key.memory_id / self.file_name(key)

    def get(self, key: KVKey) -> FactKV | None:
        """The entry for ``key`` with CPU tensors and :attr:`FactKV.source` set to its file, or ``None`` when there is
        no file.

        Raises:
            KVFingerprintMismatchError: when the file records another key (e.g. a file copied from another
                model's store); its tensors are not loaded.
            KVFormatError: when the file is not in this version's layout (an unknown storage format or scale layout
                included), or holds another storage format than ``key`` records.

        A damaged file is removed with a warning and is a miss: its memory is encoded again and stored anew. It is
        damaged when it is not a readable safetensors file (cut short by a full disk or a copy, overwritten), or when
        its header or its tensors do not match the checksums written with them (changed in place: a failing disk,
        a tool that rewrote them; :func:`~inferscale.kv.tiers.serialization.check_header`,
        :func:`~inferscale.kv.tiers.serialization.check_checksum`), checked before the key it records.
        """
        path = self.path(key)
        try:
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                metadata = handle.metadata() or {}
                check_header(metadata, str(path))
                check_key(metadata, key, str(path))
                tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
        except FileNotFoundError:
            return None
        except SafetensorError as exc:
            return self._drop_damaged(path, f"it is unreadable ({exc})")
        except KVChecksumError:
            return self._drop_damaged(path, "its header does not match the checksum written with it")
        try:
            fact = fact_from_payload(tensors, metadata, str(path))
        except KVChecksumError:
            return self._drop_damaged(path, "its tensors do not match the checksum written with them")
        if fact.storage_tag != key.storage_tag:
            raise KVFormatError(
                f"{path} holds K/V stored as {fact.storage_tag!r} under a key for {key.storage_tag!r}; refusing to "
                "read one format as another"
            )
        return fact.with_source(str(path))

    @staticmethod
    def _drop_damaged(path: Path, why: str) -> None:
        """Remove the damaged file ``path`` (a miss: its memory is encoded again), with a warning saying ``why``."""
        log.warning("the K/V file %s is damaged: %s; it is removed and its memory encoded again", path, why)
        path.unlink(missing_ok=True)

    def contains(self, key: KVKey) -> bool:
        """Whether ``key``'s file exists (not opened: its metadata is checked by :meth:`get`)."""
        return self.path(key).is_file()

    def put(self, key: KVKey, fact: FactKV) -> Evicted:
        """Write ``fact`` to :meth:`path` atomically (replacing any file there); evicts nothing.

        Raises:
            OSError: when the folder or file cannot be written (nothing partial is left under the final name).
        """
        tensors, metadata = fact_to_payload(key, fact)
        data = save(tensors, metadata)
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data, fsync=self._fsync)
        return []

    def pop(self, key: KVKey) -> FactKV | None:
        """Load and delete the entry for ``key`` (``None`` when absent). Raises as :meth:`get`."""
        fact = self.get(key)
        if fact is not None:
            self.path(key).unlink(missing_ok=True)
        return fact

    def delete_memory(self, memory_id: str) -> int:
        """Remove the folder of ``memory_id``; returns how many entry files it held.

        Raises:
            InvalidInputError: when ``memory_id`` is not a plain id (see :func:`check_memory_id`).
            OSError: when a file cannot be removed (the memory's K/V would otherwise outlive it silently).
        """
        folder = self._root / check_memory_id(memory_id)
        if not folder.is_dir():
            return 0
        count = sum(1 for _ in folder.glob(f"*{SUFFIX}"))
        if sys.version_info >= (3, 12):  # what another store on the folder removes meanwhile is already gone
            shutil.rmtree(folder, onexc=_unless_gone)
        else:
            shutil.rmtree(folder, onerror=lambda function, path, info: _unless_gone(function, path, info[1]))
        return count

    def prune(self, memory_id: str, keep: Callable[[KVKey], bool], *, dry_run: bool = False) -> int:
        """Remove the files of ``memory_id`` whose recorded key ``keep`` refuses (reads each file's header only);
        returns how many were removed (``dry_run``: how many would be, nothing removed). A file whose
        header cannot be read is kept: it may belong to a newer version, and it is never injected (:meth:`get`
        refuses it).

        Raises:
            InvalidInputError: when ``memory_id`` is not a plain id (see :func:`check_memory_id`).
        """
        folder = self._root / check_memory_id(memory_id)
        removed = 0
        for path in sorted(folder.glob(f"*{SUFFIX}")) if folder.is_dir() else []:
            try:
                with safe_open(str(path), framework="pt", device="cpu") as handle:
                    key = key_from_metadata(handle.metadata() or {}, str(path))
            except (OSError, KVFormatError, SafetensorError):  # removed meanwhile, or not ours to judge
                continue
            if not keep(key):
                if not dry_run:
                    path.unlink(missing_ok=True)
                removed += 1
        return removed

    def clear(self) -> None:
        """Remove every entry file (and temporary file) this tier wrote, and folders left empty; other files
        under ``root`` are kept."""
        if not self._root.is_dir():
            return
        for folder in self._root.iterdir():
            if not folder.is_dir():
                continue
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile by another store on the same folder
                for file in folder.iterdir():
                    if file.suffix in (SUFFIX, TEMP_SUFFIX):
                        file.unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # not empty: it holds files this tier did not write
                folder.rmdir()

    # ---- reconciliation -----------------------------------------------------------------------------------
    def entry_files(self) -> dict[str, list[Path]]:
        """The entry files, by the memory id their folder is named after (folders with another name and other
        files are left out): a snapshot of the folder, reading no file."""
        found: dict[str, list[Path]] = {}
        if not self._root.is_dir():
            return found
        with os.scandir(self._root) as folders:
            for folder in folders:
                if not folder.is_dir(follow_symlinks=False) or not is_memory_id(folder.name):
                    continue
                try:
                    with os.scandir(folder.path) as files:
                        names = sorted(f.name for f in files if f.name.endswith(SUFFIX) and not f.name.startswith("."))
                except FileNotFoundError:  # removed meanwhile
                    continue
                found[folder.name] = [self._root / folder.name / name for name in names]
        return found

    def sweep_temp_files(self, max_age_s: float = TEMP_MAX_AGE_S) -> int:
        """Remove the temporary files of writers that died before renaming them (see
        :func:`inferscale.atomic.sweep_temp_files`: those of live writers are kept); returns how many."""
        entries = sweep_temp_files(self._root, f"*/.*{TEMP_SUFFIX}", max_age_s)
        return entries + sweep_temp_files(self._root, f".{STORE_ID_FILE}.*{TEMP_SUFFIX}", max_age_s)

    def remove_file(self, path: Path) -> bool:
        """Remove one entry file of this tier (e.g. one no SQL row accounts for); returns whether it was there.

        Raises:
            InvalidInputError: when ``path`` is not an entry file's path inside this tier's folder.
        """
        path = Path(os.path.abspath(path))
        if path.parent.parent != self._root or not path.name.endswith(SUFFIX):
            raise InvalidInputError(f"{path} is not an entry file of the K/V folder {self._root}")
        check_memory_id(path.parent.name)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        return True  # the folder stays: a writer may be about to write into it

    def keys(self) -> list[KVKey]:
        """The keys recorded in every entry file (reads each file's header only).

        Raises:
            KVFormatError: when an entry file is not in this version's layout.
        """
        found = []
        for path in self._files():
            try:
                with safe_open(str(path), framework="pt", device="cpu") as handle:
                    found.append(key_from_metadata(handle.metadata() or {}, str(path)))
            except FileNotFoundError:  # removed meanwhile by another store on the same folder
                continue
        return found

    @property
    def nbytes(self) -> int:
        """Size of the entry files on disk (bytes; headers and token ids included). Files another store on the
        same folder removes during the count are left out."""
        total = 0
        for path in self._files():
            with contextlib.suppress(FileNotFoundError):
                total += path.stat().st_size
        return total

    def _files(self) -> list[Path]:
        """The entry files, sorted (:meth:`entry_files`: folders removed while they are listed are left out)."""
        return sorted(path for paths in self.entry_files().values() for path in paths)


def _unless_gone(function: object, path: str, error: BaseException) -> None:
    """``shutil.rmtree``'s error handler: a file or folder already gone is skipped; any other error is raised."""
    if not isinstance(error, FileNotFoundError):
        raise error
