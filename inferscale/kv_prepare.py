"""Encode now the K/V a ``chat`` would otherwise encode on first use (``MemoryClient.prepare_kv``).

Stored K/V are keyed by the model's fingerprint and by every setting they depend on (:mod:`inferscale.kv.fingerprint`),
so a change of model, dtype, ``kv.storage_format``, ``kv.context_window`` or position buckets, or a data dir written
before a new encoding became the default (``kv.first_memory_context_free``), leaves memories whose K/V no tier holds
under the current settings. ``chat`` encodes such a memory when it retrieves it, on its own critical path; this
module encodes them all ahead of time, through the background encoder's own path
(:meth:`inferscale.derived.DerivedStores.encode_queued`: SQL read when each batch's turn comes, chunks that keep
memories sharing context turns together, yielding to ``chat``, nothing stale stored), on the calling thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inferscale.derived import DerivedStores

__all__ = ["PAGE_SIZE", "KVPrepareReport", "prepare_kv"]


@dataclass(frozen=True, slots=True)
class KVPrepareReport:
    """What one :func:`prepare_kv` did.

    Attributes:
        memories: the memories looked at.
        encoded: of them, those that lacked an encoding and now have every one stored.
        left: the ids of those that still lack one, in the order given: too long for the model's context window
            even without their context turns (``chat`` leaves them out too, with a warning), or changed while they
            were encoded (then encoded by the next ``chat`` that retrieves them, or by another call). A memory
            deleted meanwhile is in neither ``encoded`` nor ``left``.
    """

    memories: int
    encoded: int
    left: tuple[str, ...]


PAGE_SIZE = 1024
"""Memories read from SQL and checked against the store at a time: a pass over a whole database holds one page of
records, not all of them."""


def prepare_kv(derived: DerivedStores, memory_ids: Sequence[str], batch_size: int) -> KVPrepareReport:
    """Encode and store every encoding no tier holds of the memories ``memory_ids`` (each position bucket, and the
    context-free one with ``kv.first_memory_context_free``), :data:`PAGE_SIZE` memories checked at a time and
    ``batch_size`` encoded at a time.

    Loads the encoder (not vLLM). Other calls go on meanwhile: each chunk holds the client's lock only to pick its
    memories and to store what it encoded, and waits for the ``chat`` uses of the model running when it starts. A
    memory deleted or changed before its K/V are stored (an async client commits outside the client's lock; another
    process may share the database) is skipped, and the rest of its batch stored
    (:meth:`~inferscale.derived.DerivedStores.encode_queued`); once a page is done, what it still lacks is encoded
    once more, so a memory changed meanwhile is encoded in its new state.

    Raises:
        DatabaseUnavailableError: when the database cannot be connected to.
        ModelNotAvailableError: when the configured model's files cannot be found.
        OSError: when a K/V file cannot be written. What was stored before stays stored.
    """
    derived.load_encoder()  # a model that cannot be loaded is refused even when nothing lacks K/V
    encoded = 0
    left: list[str] = []
    for page in range(0, len(memory_ids), PAGE_SIZE):
        lacking = derived.missing_kv(memory_ids[page : page + PAGE_SIZE])
        for start in range(0, len(lacking), batch_size):
            derived.encode_queued(lacking[start : start + batch_size])
        changed = derived.missing_kv(lacking)  # and those too long for the context window, which encode nothing
        for start in range(0, len(changed), batch_size):
            derived.encode_queued(changed[start : start + batch_size])
        still = set(derived.missing_kv(lacking))
        present = derived.existing(lacking)
        encoded += sum(1 for memory_id in lacking if memory_id in present and memory_id not in still)
        left += [memory_id for memory_id in lacking if memory_id in still]
    return KVPrepareReport(memories=len(memory_ids), encoded=encoded, left=tuple(left))
