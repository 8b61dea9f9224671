"""Reconciliation of the derived stores with SQL: what to repair, and the report of what was repaired.

SQL is the source of truth; the FAISS index, the K/V files and their ``kv_entries`` rows are derived from it and
written after it (docs/architecture.md, "Write ordering"). A crash, or another process's writes, can leave them
behind SQL in a few known ways, each of which is repaired here and counted in a :class:`ReconcileReport`:

- the index lacks a memory's vector, holds one embedded from an older text, or holds one of a deleted memory;
- a deleted memory's K/V folder is still on disk;
- a K/V file no valid row accounts for (the memory's text changed, or the row was never committed), a row whose
  text is not the memory's any more, or a row whose file is gone;
- a temporary file (K/V or index) of a writer that died before renaming it.

:func:`plan_kv` decides the K/V repairs from snapshots taken in a safe order (the disk listing, then the rows, then
the memories; see its docstring); :func:`reconcile_steps` takes the snapshots, applies the plan and repairs the
index (run by :meth:`inferscale.derived.DerivedStores.reconcile_steps`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from inferscale.errors import InvalidInputError
from inferscale.kv.tiers import DiskTier
from inferscale.kv.tiers.base import KVKey
from inferscale.retrieval import VectorIndex
from inferscale.steps import RecordsByVectorId, Steps, Versions
from inferscale.storage import KVEntryRecord, MemoryRecord, MemoryStore
from inferscale.storage.records import MemoryVersions

if TYPE_CHECKING:
    from inferscale.derived import DerivedStores
    from inferscale.storage.async_store import AsyncMemoryStore

log = logging.getLogger(__name__)

EMBEDDER_PROBE_SIZE = 16
"""Memories embedded again to check an index that records another embedder's identity, or none
(:meth:`inferscale.derived.DerivedStores.settle_embedder`)."""

KV_ROW_GRACE_S = 60.0
"""A ``kv_entries`` row without its file is deleted only once it is older than this (seconds): its writer commits
the row, then renames the file into place, and another process may reconcile in between."""


def settled(row: KVEntryRecord, now: datetime) -> bool:
    """Whether ``row`` is older than :data:`KV_ROW_GRACE_S` at ``now`` (tz-aware UTC), so a missing file means its
    writer died rather than that it is still writing."""
    return (now - row.created_at).total_seconds() > KV_ROW_GRACE_S


@dataclass(frozen=True, slots=True)
class ReconcileReport:
    """What one reconciliation repaired (counts).

    Attributes:
        vectors_added: memories that had no vector in the index, embedded.
        vectors_refreshed: vectors embedded from another text than the memory's (or of unknown origin), embedded
            again.
        vectors_removed: vectors of memories no longer stored, removed.
        kv_memories_removed: K/V folders of memories this database deleted, removed.
        kv_files_removed: K/V files of stored memories that no current entry row accounts for, removed.
        kv_rows_removed: entry rows whose file is gone (older than :data:`KV_ROW_GRACE_S`) or whose text is not
            the memory's any more, deleted.
        temp_files_removed: temporary files (K/V, index) of writers that died before renaming them, removed.
        kv_folders_kept: K/V folders of memory ids this database never stored (another database sharing the K/V
            folder), left alone.
        kv_rows_kept: current entry rows whose file another K/V folder holds and this client cannot see (another
            host's, sharing the database; :func:`filed_here`), left alone.
    """

    vectors_added: int = 0
    vectors_refreshed: int = 0
    vectors_removed: int = 0
    kv_memories_removed: int = 0
    kv_files_removed: int = 0
    kv_rows_removed: int = 0
    temp_files_removed: int = 0
    kv_folders_kept: int = 0
    kv_rows_kept: int = 0

    @property
    def repairs(self) -> int:
        """Everything repaired, summed (the folders and rows left alone are not repairs)."""
        return sum(self.as_dict().values()) - self.kv_folders_kept - self.kv_rows_kept

    def as_dict(self) -> dict[str, int]:
        """The counts by name."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class KVPlan:
    """The K/V repairs :func:`plan_kv` decided.

    Attributes:
        stale_rows: rows whose memory is gone or holds another text now (their files are in ``stray_files``
            when on disk).
        current_rows: rows of the memories' current texts; each must have its file (checked when applying, as
            the file may be written after the listing).
        stray_files: entry files of stored memories that no current row accounts for.
        gone_folders: memory ids with a K/V folder that the memories' snapshot does not hold: removed when the
            database confirms that it deleted them.
    """

    stale_rows: list[KVEntryRecord] = field(default_factory=list)
    current_rows: list[KVEntryRecord] = field(default_factory=list)
    stray_files: list[Path] = field(default_factory=list)
    gone_folders: list[str] = field(default_factory=list)


def entry_key(row: KVEntryRecord) -> KVKey | None:
    """The K/V key of ``row``, or ``None`` when the row's fields make no key."""
    try:
        return KVKey(row.memory_id, row.text_hash, row.fingerprint, row.encoding_key)
    except InvalidInputError:
        return None


def entry_file_name(row: KVEntryRecord) -> str | None:
    """The file name the disk tier stores ``row``'s entry under, or ``None`` when the row's fields make no key."""
    key = entry_key(row)
    return DiskTier.file_name(key) if key is not None else None


def has_file(disk: DiskTier, row: KVEntryRecord) -> bool:
    """Whether the entry of ``row`` is in ``disk``'s folder (for a row whose fields make no key, where the row says).

    A copy of the file elsewhere does not count: the rows of a data folder copied or moved still name the original's
    files by absolute path, and a row of this folder whose file is gone here is gone, whatever another copy holds. A
    row another folder wrote is not judged here at all (:func:`filed_here`)."""
    key = entry_key(row)
    if key is not None:
        return disk.path(key).exists()
    return os.path.isabs(row.location) and os.path.exists(row.location)


def filed_here(disk: DiskTier, row: KVEntryRecord, folder_id: str | None) -> bool:
    """Whether ``row``'s file belongs in ``disk``'s folder, so that this client can tell that it is gone: the row
    records this folder's id, ``folder_id`` (:meth:`~inferscale.kv.tiers.DiskTier.existing_store_id`, read once by
    the caller for all its rows); for a row that records none (written
    before folders had ids, or without a disk tier), its location is in this folder's path, or names no folder (a
    memory tier's). A row another K/V folder wrote is left to that folder's clients: the folder may be on another
    host sharing the database, at another path or at the same one, and deleting the row there made its owner remove
    the file as unaccounted for.

    """
    if row.store_id is not None:
        return row.store_id == folder_id
    if not os.path.isabs(row.location):
        return True
    return Path(os.path.normpath(row.location)).parent.parent == disk.root


def plan_kv(files: Mapping[str, Sequence[Path]], rows: Sequence[KVEntryRecord], live: Mapping[str, str]) -> KVPlan:
    """Which K/V files and rows disagree with the memories.

    The snapshots must be taken in this order, each after the one before: ``files`` (the disk listing), ``rows``,
    then ``live``. A file is renamed into place only after its row is committed, and a row only after its memory,
    so every file of the listing had its row (and its memory) committed before the rows were read: a file no
    current row accounts for is one whose row was deleted with the memory or its old text. A row read before the
    memories holds a text hash at least as old as theirs: one that differs is stale.

    Args:
        files: the entry files by memory folder (:meth:`inferscale.kv.tiers.DiskTier.entry_files`).
        rows: every ``kv_entries`` row.
        live: the stored memories' text hashes by memory id.

    Returns:
        The plan; nothing is changed here.
    """
    plan = KVPlan()
    accounted: set[tuple[str, str]] = set()
    for row in rows:
        name = entry_file_name(row)
        if name is None or live.get(row.memory_id) != row.text_hash:
            plan.stale_rows.append(row)
            continue
        plan.current_rows.append(row)
        accounted.add((row.memory_id, name))
    for memory_id, paths in files.items():
        if memory_id not in live:
            plan.gone_folders.append(memory_id)
            continue
        plan.stray_files.extend(path for path in paths if (memory_id, path.name) not in accounted)
    return plan


# ---------------------------------------------------------------------------------------------------- SQL reads


@dataclass(frozen=True, slots=True)
class KVEntries:
    """Every ``kv_entries`` row."""

    def run(self, store: MemoryStore) -> list[KVEntryRecord]:
        return store.all_kv_entries()

    async def arun(self, store: AsyncMemoryStore) -> list[KVEntryRecord]:
        return await store.all_kv_entries()


@dataclass(frozen=True, slots=True)
class MemoryStates:
    """For each of ``ids`` this database ever stored: ``True`` while stored, ``False`` once deleted."""

    ids: tuple[str, ...]

    def run(self, store: MemoryStore) -> dict[str, bool]:
        return store.memory_states(self.ids)

    async def arun(self, store: AsyncMemoryStore) -> dict[str, bool]:
        return await store.memory_states(self.ids)


@dataclass(frozen=True, slots=True)
class DeleteKVRows:
    """Delete the ``kv_entries`` rows with these row ids (a write, run like the reads); the count deleted."""

    ids: tuple[int, ...]

    def run(self, store: MemoryStore) -> int:
        return store.delete_kv_entry_rows(self.ids)

    async def arun(self, store: AsyncMemoryStore) -> int:
        return await store.delete_kv_entry_rows(self.ids)


# ---------------------------------------------------------------------------------------------------- the repair


def _remove_stray_files(disk: DiskTier, paths: Sequence[Path]) -> int:
    """Remove ``paths`` (files no current row accounts for); returns how many were removed. A file that cannot be
    removed (a read-only K/V folder) is logged and left for a later reconciliation: it is never read (its key names a
    text or context no memory has, or no row), and the search or chat whose first use of the index ran this must not
    fail for it."""
    removed = 0
    failed: list[str] = []
    for path in paths:
        try:
            removed += disk.remove_file(path)
        except OSError as exc:
            failed.append(f"{path} ({exc.strerror or exc})")
    if failed:
        log.warning(
            "could not remove %d K/V files no memory accounts for (they are never read; a later reconciliation removes "
            "them once the folder is writable): %s",
            len(failed),
            "; ".join(failed[:3]) + ("; ..." if len(failed) > 3 else ""),
        )
    return removed


def reconcile_steps(stores: DerivedStores) -> Steps[ReconcileReport]:
    """Repair the index and the K/V store against SQL, and report what was repaired (logged when anything was).

    The index (loaded from its file if it is not loaded yet) gets a vector for every memory, embedded from its
    current text, and none for memories no longer stored. On disk, temporary files of dead writers, the
    K/V folders of memories this database deleted and K/V files no current row accounts for are removed;
    rows whose file is gone (older than :data:`inferscale.reconcile.KV_ROW_GRACE_S`, so not being written) or whose
    text is not the memory's any more are deleted. Snapshots are taken in
    the order :func:`inferscale.reconcile.plan_kv` needs (disk listing, rows, memories), so it is safe while
    other processes write: a race costs at most a re-encoding, never a served stale entry. Folders of memory
    ids this database never stored are left alone (another database may share the K/V folder).

    Args:
        stores: the client's derived stores; their index is loaded here when it is not loaded yet.

    Raises:
        ConfigError: when the index file is not a readable FAISS index (delete it: it is rebuilt).
        KVFormatError: when the K/V folder's ``store-id`` file holds anything but an id (the message says how to
            mend it).
    """
    disk = DiskTier(stores.kv_dir)
    files = disk.entry_files()
    temp_removed = disk.sweep_temp_files() + VectorIndex.sweep_temp_files(stores.index_path)
    rows: list[KVEntryRecord] = yield KVEntries()
    versions: MemoryVersions = yield Versions()

    index = stores.open_index()
    if index.embedder != stores.embedder_identity():  # another embedder's identity, or none: an earlier version's
        with stores.lock:  # sampled among the vectors of stored memories' current texts, the ones it can compare
            stale = index.stale_ids(versions.vector_ids, versions.hashes)
            current = np.setdiff1d(np.intersect1d(versions.vector_ids, index.ids()), stale)
        probe: dict[int, MemoryRecord] = yield RecordsByVectorId(tuple(int(i) for i in current[:EMBEDDER_PROBE_SIZE]))
        index = stores.settle_embedder(index, list(probe.values()))
    index = stores.publish_index(index)
    with stores.lock:
        held = index.ids()
        differ = index.stale_ids(versions.vector_ids, versions.hashes)
    extra = np.setdiff1d(held, versions.vector_ids)
    if extra.size:  # stored since the snapshot (another thread of this client): not extra
        stored: dict[int, MemoryRecord] = yield RecordsByVectorId(tuple(int(i) for i in extra))
        extra = np.setdiff1d(extra, np.fromiter(stored, dtype=np.int64, count=len(stored)))
    records: dict[int, MemoryRecord] = {}
    if differ.size:
        records = yield RecordsByVectorId(tuple(int(i) for i in differ))
    with stores.lock:
        vectors_removed = stores.remove_vectors(index, extra)
        stores.embed_into(index, list(records.values()))
    vectors_added = int(np.setdiff1d(differ, held).size)

    plan = plan_kv(files, rows, dict(zip(versions.ids, versions.hashes, strict=True)))
    states: dict[str, bool] = {}
    if plan.gone_folders:
        states = yield MemoryStates(tuple(plan.gone_folders))
    deleted = [memory_id for memory_id in plan.gone_folders if states.get(memory_id) is False]
    now = datetime.now(UTC)  # a row younger than the grace period may have its file renamed into place soon
    unseen = [row for row in plan.current_rows if not has_file(disk, row)]  # one stat per row, not two
    others: list[KVEntryRecord] = []  # another folder's: left alone
    unfiled: list[KVEntryRecord] = []  # this folder's, its file gone: deleted once settled
    folder_id = disk.existing_store_id() if any(row.store_id is not None for row in unseen) else None
    for row in unseen:
        if not filed_here(disk, row, folder_id):
            others.append(row)
        elif settled(row, now):
            unfiled.append(row)
    bad_rows = tuple(row.id for row in [*plan.stale_rows, *unfiled])
    rows_removed = 0
    if bad_rows:
        rows_removed = yield DeleteKVRows(bad_rows)
    with stores.lock:
        files_removed = _remove_stray_files(disk, plan.stray_files)
        kv_memories_removed = stores.forget_kv(deleted)
    report = ReconcileReport(
        vectors_added=vectors_added,
        vectors_refreshed=int(differ.size) - vectors_added,
        vectors_removed=vectors_removed,
        kv_memories_removed=kv_memories_removed,
        kv_files_removed=files_removed,
        kv_rows_removed=rows_removed,
        temp_files_removed=temp_removed,
        kv_folders_kept=sum(1 for memory_id in plan.gone_folders if memory_id not in states),
        kv_rows_kept=len(others),
    )
    if report.repairs:
        stores.save_index(force=True)
        log.info("reconciled the derived stores with SQL: %s", {k: v for k, v in report.as_dict().items() if v})
    else:
        log.debug("the derived stores are in step with SQL (%d memories)", len(versions))
    return report


__all__ = [
    "EMBEDDER_PROBE_SIZE",
    "KV_ROW_GRACE_S",
    "DeleteKVRows",
    "KVEntries",
    "KVPlan",
    "MemoryStates",
    "ReconcileReport",
    "entry_file_name",
    "entry_key",
    "filed_here",
    "has_file",
    "plan_kv",
    "reconcile_steps",
    "settled",
]
