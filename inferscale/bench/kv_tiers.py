"""Staging the tiers of the KV store for ``inferscale bench ttft``: which tiers the store has, moving entries so
that the next lookups are answered by a chosen tier, and counting which tier answered."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from inferscale.bench.ttft_report import TIER_ORDER

if TYPE_CHECKING:
    from inferscale.client import MemoryClient
    from inferscale.kv.store import KVStore

__all__ = ["available_tiers", "hit_delta", "hits", "make_resident", "stage"]


def available_tiers(store: KVStore) -> list[str]:
    """Names of the tiers of ``store`` this benchmark can stage (device, host, disk), fastest first."""
    names = {t.name for t in store.tiers}
    return [name for name in TIER_ORDER if name in names]


def stage(store: KVStore, tier: str) -> None:
    """Arrange for the next lookups to be answered by ``tier``.

    ``device``: nothing (entries are promoted to the top memory tier by every hit). ``host``: move every entry
    of the tiers above the host tier down into it. ``disk``: empty every memory tier (entries stay on disk).
    """
    tiers = {t.name: t for t in store.tiers}
    if tier == "host":
        host = tiers["host"]
        for name in TIER_ORDER[: TIER_ORDER.index("host")]:
            upper = tiers.get(name)
            if upper is None:
                continue
            snapshot = upper.keys()  # a KVTier method returning a list, not a dict view
            for key in snapshot:
                fact = upper.pop(key)
                if fact is not None:
                    host.put(key, fact)  # evicted entries are still on disk
    elif tier == "disk":
        for name in ("device", "host"):
            if name in tiers:
                tiers[name].clear()


def make_resident(client: MemoryClient, memory_ids: Sequence[str]) -> None:
    """Look the memories' K/V up once (untimed), which promotes disk-only entries to the top memory tier."""
    client.memory_kv(memory_ids)


def hits(store: KVStore) -> dict[str, int]:
    """Lookups answered so far per tier, and ``"miss"`` (encoded), from the store's counters."""
    s = store.stats()
    out = {str(k): int(v) for k, v in s.hits.items()}
    out["miss"] = int(s.misses)
    return out


def hit_delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    """The non-zero changes between two :func:`hits` readings."""
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}
