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
the memories; see its docstring); :meth:`inferscale.derived.DerivedStores.reconcile_steps` takes the snapshots,
applies the plan and repairs the index.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

from inferscale.errors import InvalidInputError
from inferscale.kv.tiers.base import KVKey
from inferscale.kv.tiers.disk import SUFFIX
from inferscale.storage import KVEntryRecord

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
    """

    vectors_added: int = 0
    vectors_refreshed: int = 0
    vectors_removed: int = 0
    kv_memories_removed: int = 0
    kv_files_removed: int = 0
    kv_rows_removed: int = 0
    temp_files_removed: int = 0
    kv_folders_kept: int = 0

    @property
    def repairs(self) -> int:
        """Everything repaired, summed (the folders left alone are not repairs)."""
        return sum(self.as_dict().values()) - self.kv_folders_kept

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


def entry_file_name(row: KVEntryRecord) -> str | None:
    """The file name the disk tier stores ``row``'s entry under, or ``None`` when the row's fields make no key."""
    try:
        key = KVKey(row.memory_id, row.text_hash, row.fingerprint, row.encoding_key)
    except InvalidInputError:
        return None
    return f"{key.digest()}{SUFFIX}"


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


__all__ = ["KV_ROW_GRACE_S", "KVPlan", "ReconcileReport", "entry_file_name", "plan_kv", "settled"]
