"""The KV store: fact K/V keyed by (memory id, text hash, model fingerprint, encoding parameters), in tiers.

Tiers, fastest first: device (GPU memory, only with a CUDA device), host (CPU memory, pinned with CUDA), disk
(one safetensors file per entry, which survives restarts). The composite :class:`TieredKVStore` keeps their
policies in one place:

- lookup goes device ▸ host ▸ disk, and a hit below the top is promoted to the top memory tier;
- the memory tiers are exclusive (an entry lives in one of them), the disk is inclusive: every ``put`` is
  written through to disk before it is cached, so an entry evicted from memory is only demoted
  (device ▸ host ▸ dropped from memory, still on disk), never lost while there is a disk tier;
- a disk file recorded under another key (another model, tokenizer, text or encoding) is refused with
  :class:`~inferscale.errors.KVFingerprintMismatchError` and never injected. A changed fingerprint gives another
  key, so entries of another model are simply misses and the fact is encoded again.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from inferscale.errors import InvalidInputError
from inferscale.kv.fact import FactKV
from inferscale.kv.tiers.base import KVKey, KVTier, check_memory_id
from inferscale.kv.tiers.device import DeviceTier
from inferscale.kv.tiers.disk import DiskTier
from inferscale.kv.tiers.host import HostTier

__all__ = [
    "DEFAULT_DEVICE_BUDGET_BYTES",
    "DEFAULT_HOST_BUDGET_BYTES",
    "KVKey",
    "KVStore",
    "KVStoreStats",
    "TieredKVStore",
]

DEFAULT_HOST_BUDGET_BYTES = 2 << 30
"""Host tier capacity when none is given (2 GiB)."""

DEFAULT_DEVICE_BUDGET_BYTES = 1 << 30
"""Device tier capacity when ``device`` is a CUDA device and no budget is given (1 GiB)."""


@dataclass(frozen=True, slots=True)
class KVStoreStats:
    """Counters of a :class:`TieredKVStore` since it was built (or :meth:`TieredKVStore.reset_stats`).

    Attributes:
        hits: lookups answered by each tier, by tier name (``"device"``, ``"host"``, ``"disk"``).
        misses: lookups no tier could answer.
        promotions: entries moved up into a higher memory tier after a hit below it (an entry larger than every
            memory tier's budget stays where it was and is not counted).
        demotions: entries moved down one memory tier to make room.
        drops: entries evicted from the last memory tier (still on disk when there is a disk tier); an entry too
            large to be cached at all was never held, and is not counted.
        nbytes: bytes held by each tier, by tier name (K/V bytes in memory, file sizes on disk).
        entries: entries held by each memory tier, by tier name.
    """

    hits: Mapping[str, int]
    misses: int
    promotions: int
    demotions: int
    drops: int
    nbytes: Mapping[str, int]
    entries: Mapping[str, int]


def _on(fact: FactKV, device: torch.device) -> FactKV:
    """``fact`` with its tensors on ``device``, 8-bit ones still as codes and scales (the same object when they are
    there already)."""
    if fact.keys.device == device and fact.values.device == device:
        return fact
    return fact.map_tensors(lambda t: t.to(device, non_blocking=True))


class TieredKVStore:
    """Device ▸ host ▸ disk store of fact K/V; thread-safe (one lock around each call).

    The constructor does no I/O. Entries are returned as stored (no defensive copy): do not modify them in place.
    An entry stored in 8 bits (``kv.storage_format``) stays 8-bit in every tier, and the byte budgets count its
    codes and scales (:attr:`FactKV.nbytes`); it is dequantised only when a cache is assembled.

    Args:
        directory: the disk tier's folder; ``None`` keeps entries in memory only (lost on eviction and restart).
        host_budget_bytes: host tier capacity (bytes, >= 0; 0 disables the tier).
        device: where :meth:`get` returns tensors (the engine's device, e.g. ``"cpu"`` or ``"cuda:0"``).
        device_budget_bytes: device tier capacity (bytes, >= 0; 0 disables the tier). ``None`` means
            :data:`DEFAULT_DEVICE_BUDGET_BYTES` when ``device`` is a CUDA device, else no device tier.
        pin_memory: keep the host tier in page-locked memory; ``None`` means "when ``device`` is a CUDA device".
        fsync: fsync each disk file before it is renamed into place.

    Raises:
        ConfigError: when a device tier is asked for without CUDA (``device_budget_bytes > 0`` with a CPU
            ``device``, or a CUDA ``device`` on a machine without CUDA), or ``pin_memory=True`` without CUDA.
        InvalidInputError: when a budget is negative.
    """

    def __init__(
        self,
        directory: Path | None,
        host_budget_bytes: int = DEFAULT_HOST_BUDGET_BYTES,
        device: torch.device | str = "cpu",
        device_budget_bytes: int | None = None,
        pin_memory: bool | None = None,
        fsync: bool = True,
    ) -> None:
        self._device = torch.device(device)
        on_cuda = self._device.type == "cuda"
        if device_budget_bytes is None:
            device_budget_bytes = DEFAULT_DEVICE_BUDGET_BYTES if on_cuda else 0
        self._device_tier = DeviceTier(self._device, device_budget_bytes) if device_budget_bytes > 0 else None
        if self._device_tier is not None:
            self._device = self._device_tier.device
        self._host = HostTier(host_budget_bytes, pin_memory=on_cuda if pin_memory is None else pin_memory)
        self._memory: list[KVTier] = [t for t in (self._device_tier, self._host) if t is not None]
        self._disk = DiskTier(Path(directory), fsync=fsync) if directory is not None else None
        self._lock = threading.RLock()
        self.reset_stats()

    def __repr__(self) -> str:
        tiers = " > ".join(t.name for t in self.tiers)
        return f"TieredKVStore({tiers}, device={str(self._device)!r})"

    # ------------------------------------------------------------------ tiers
    @property
    def tiers(self) -> tuple[KVTier, ...]:
        """The tiers in lookup order (device, host, disk; absent ones left out)."""
        return tuple(self._memory) + ((self._disk,) if self._disk is not None else ())

    @property
    def device(self) -> torch.device:
        """Where :meth:`get` returns tensors."""
        return self._device

    @property
    def directory(self) -> Path | None:
        """The disk tier's folder, or ``None``."""
        return self._disk.root if self._disk is not None else None

    @property
    def host_bytes(self) -> int:
        """K/V bytes held in the host tier (bytes)."""
        return self._host.nbytes

    @property
    def device_bytes(self) -> int:
        """K/V bytes held in the device tier (bytes; 0 without one)."""
        return self._device_tier.nbytes if self._device_tier is not None else 0

    def location(self, key: KVKey) -> str:
        """Where :meth:`put` makes ``key`` durable: its file path, or the top memory tier's name without a disk."""
        if self._disk is not None:
            return str(self._disk.path(key))
        return self._memory[0].name

    def store_id(self) -> str | None:
        """The disk tier's folder id (:meth:`inferscale.kv.tiers.DiskTier.store_id`, made on first use), or ``None``
        without a disk tier.

        Raises:
            KVFormatError: when the folder's id file holds anything but an id.
            OSError: when the folder or its id file cannot be written.
        """
        return self._disk.store_id() if self._disk is not None else None

    # ------------------------------------------------------------------ reads and writes
    def get(self, key: KVKey) -> FactKV | None:
        """The entry for ``key`` with K/V on :attr:`device`, or ``None`` on a miss; promotes a lower-tier hit.

        Raises:
            KVFingerprintMismatchError: when the disk file found for ``key`` records another fingerprint, text
                hash, encoding key or memory id; nothing is returned or cached.
            KVFormatError: when that file is not in this version's layout.
        """
        with self._lock:
            for level, tier in enumerate(self._memory):
                fact = tier.get(key)
                if fact is not None:
                    self._hits[tier.name] += 1
                    if level > 0:
                        tier.pop(key)
                        fact, placed = self._cache(key, fact)
                        if placed is not None and placed < level:
                            self._promotions += 1
                    return _on(fact, self._device)
            fact = self._disk.get(key) if self._disk is not None else None
            if self._disk is None or fact is None:
                self._misses += 1
                return None
            self._hits[self._disk.name] += 1
            if self._memory:
                fact, placed = self._cache(key, fact)
                if placed is not None:
                    self._promotions += 1
            return _on(fact, self._device)

    def contains(self, key: KVKey) -> bool:
        """Whether some tier holds ``key``; unlike :meth:`get` it counts no hit or miss, promotes nothing and reads
        no file."""
        with self._lock:
            return any(tier.contains(key) for tier in self.tiers)

    def put(self, key: KVKey, fact: FactKV) -> str:
        """Write ``fact`` through to disk, then cache it in the top memory tier; returns :meth:`location`.

        Raises:
            InvalidInputError: when ``fact`` is held in another storage format than ``key`` records
                (:attr:`KVKey.storage_tag`); nothing is written.
            OSError: when the disk file cannot be written (nothing is cached then).
        """
        if fact.storage_tag != key.storage_tag:
            raise InvalidInputError(
                f"K/V stored as {fact.storage_tag!r} cannot be written under a key for {key.storage_tag!r} "
                f"({key.encoding_key!r}); quantise them as the key says (FactKV.quantized)"
            )
        with self._lock:
            if self._disk is not None:
                self._disk.put(key, fact)
                fact = fact.with_source(str(self._disk.path(key)))
            for tier in self._memory:
                tier.pop(key)
            if self._memory:
                self._cache(key, fact)
            return self.location(key)

    def _cache(self, key: KVKey, fact: FactKV) -> tuple[FactKV, int | None]:
        """Insert into the top memory tier, demoting what it evicts; returns the copy cached highest and the level
        of its tier (``fact`` and ``None`` when no tier could hold it)."""
        self._insert(0, key, fact, key)
        for level, tier in enumerate(self._memory):
            cached = tier.get(key)
            if cached is not None:
                return cached, level
        return fact, None

    def _insert(self, level: int, key: KVKey, fact: FactKV, new: KVKey) -> None:
        """Put ``key`` in the tier at ``level``, each entry it evicts into the next. ``new`` is the entry being
        cached: a tier too small for it passes it on without counting a demotion or a drop (it held nothing)."""
        for victim, evicted in self._memory[level].put(key, fact):
            if level + 1 < len(self._memory):
                if victim != new:
                    self._demotions += 1
                self._insert(level + 1, victim, evicted, new)
            elif victim != new:
                self._drops += 1

    # ------------------------------------------------------------------ removal
    def delete_memory(self, memory_id: str) -> int:
        """Remove every entry of ``memory_id`` from every tier.

        Returns:
            entry copies removed, summed over tiers (an entry cached in memory and on disk counts twice).

        Raises:
            InvalidInputError: when ``memory_id`` is not a plain id (:func:`inferscale.kv.tiers.check_memory_id`).
        """
        check_memory_id(memory_id)
        with self._lock:
            return sum(tier.delete_memory(memory_id) for tier in self.tiers)

    def prune(self, memory_ids: Collection[str], keep: Callable[[KVKey], bool], *, dry_run: bool = False) -> int:
        """Remove the entries of ``memory_ids`` that ``keep`` refuses from every tier (e.g. those written under an
        older key format, which no lookup can match again). One pass over each memory tier's keys; on disk, reads
        the headers of those memories' files only. ``dry_run`` counts them and removes nothing.

        Returns:
            entry copies removed (or that would be), summed over tiers.

        Raises:
            InvalidInputError: when a memory id is not a plain id (:func:`inferscale.kv.tiers.check_memory_id`).
        """
        wanted = {check_memory_id(memory_id) for memory_id in memory_ids}
        with self._lock:
            removed = 0
            for tier in self._memory:
                for key in tier.keys():  # noqa: SIM118  (a snapshot: popping while iterating)
                    if key.memory_id in wanted and not keep(key) and (dry_run or tier.pop(key) is not None):
                        removed += 1
            if self._disk is not None:
                removed += sum(self._disk.prune(memory_id, keep, dry_run=dry_run) for memory_id in sorted(wanted))
            return removed

    def clear(self) -> None:
        """Drop every entry from every tier (only the files the disk tier wrote are removed)."""
        with self._lock:
            for tier in self.tiers:
                tier.clear()

    # ------------------------------------------------------------------ statistics
    def stats(self) -> KVStoreStats:
        """Hit counters per tier and sizes (reads the disk folder's listing when there is a disk tier)."""
        with self._lock:
            return KVStoreStats(
                hits={t.name: self._hits[t.name] for t in self.tiers},
                misses=self._misses,
                promotions=self._promotions,
                demotions=self._demotions,
                drops=self._drops,
                nbytes={t.name: t.nbytes for t in self.tiers},
                entries={t.name: len(t.keys()) for t in self._memory},
            )

    def reset_stats(self) -> None:
        """Zero the hit, miss, promotion, demotion and drop counters."""
        with self._lock:
            self._hits: Counter[str] = Counter()
            self._misses = 0
            self._promotions = 0
            self._demotions = 0
            self._drops = 0


KVStore = TieredKVStore
"""The name the rest of InferScale uses for the tiered store."""
