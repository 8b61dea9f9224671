"""Remove the stored K/V that no ``chat`` of this client looks up (``MemoryClient.prune_kv``).

Stored K/V are keyed by the model's fingerprint and by every setting they depend on (:mod:`inferscale.kv.fingerprint`),
and an entry under another key is kept, for clients still running with it. After a change of model, dtype,
``kv.storage_format``, ``kv.context_window`` or position buckets, or an upgrade whose fingerprint or encoding differs,
the entries of the old key stay on disk beside the new ones: switching to ``kv.storage_format="int8"`` to halve the
K/V at rest would otherwise leave the model-dtype files too. Pruning removes, for each memory, every entry except
those this client's chats would serve (:meth:`inferscale.fact_kv.FactKVManager.served_keys`): their copies in every
tier, then their ``kv_entries`` rows. A client with other settings sharing the store then encodes its own again on
first use; nothing is ever served stale (lookups are by key, and each file's header is checked). A dry run reads the
same files' headers and rows, and reports what it would remove.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from inferscale.kv_prepare import PAGE_SIZE

if TYPE_CHECKING:
    from inferscale.derived import DerivedStores

__all__ = ["KVPruneReport", "prune_kv"]


@dataclass(frozen=True, slots=True)
class KVPruneReport:
    """What one :func:`prune_kv` removed, or, in a dry run, would remove.

    Attributes:
        memories: the memories looked at (those still stored when their page was read).
        entries_removed: K/V entry copies removed from the tiers (a file on disk, a copy in host or device memory;
            an entry held in two tiers counts twice).
        rows_removed: ``kv_entries`` rows this call deleted.
        bytes_removed: the size of the K/V tensors those rows recorded (bytes; rows another call deleted first are not
            counted).
        dry_run: whether nothing was removed: the counts are then what a prune at that moment would remove.
    """

    memories: int
    entries_removed: int
    rows_removed: int
    bytes_removed: int
    dry_run: bool = False


def prune_kv(derived: DerivedStores, memory_ids: Sequence[str], *, dry_run: bool = False) -> KVPruneReport:
    """Remove every stored K/V entry of ``memory_ids`` that this client's chats would not look up, :data:`PAGE_SIZE`
    memories at a time (module docstring). Memories no longer stored are left to reconciliation. ``dry_run`` removes
    nothing and reports what would be removed.

    Loads the encoder's tokenizer and model fingerprint (not vLLM); encodes nothing.

    Raises:
        DatabaseUnavailableError: when the database cannot be connected to.
        ModelNotAvailableError: when the configured model's files cannot be found.
        OSError: when a K/V file cannot be removed (what was removed before stays removed; that memory's rows stay).
        KVFormatError: when the K/V folder's ``store-id`` file holds anything but an id (nothing is removed).
    """
    memories = entries = rows = nbytes = 0
    for page in range(0, len(memory_ids), PAGE_SIZE):
        found, pruned = derived.prune_unserved(memory_ids[page : page + PAGE_SIZE], dry_run=dry_run)
        memories, entries = memories + found, entries + pruned.copies
        rows, nbytes = rows + pruned.rows, nbytes + pruned.nbytes
    return KVPruneReport(
        memories=memories, entries_removed=entries, rows_removed=rows, bytes_removed=nbytes, dry_run=dry_run
    )
