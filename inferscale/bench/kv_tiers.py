"""Staging the tiers of the KV store for ``inferscale bench ttft``: which tiers the store has, moving entries so
that the next lookups are answered by a chosen tier, and counting which tier answered."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from inferscale.bench.ttft_report import TIER_ORDER

if TYPE_CHECKING:
    from inferscale.client import MemoryClient

__all__ = ["available_tiers", "hit_delta", "hits", "kv_store", "make_resident", "stage"]


def kv_store(client: MemoryClient) -> Any | None:
    """The client's tiered KV store, or ``None`` when it cannot be reached."""
    manager = client.fact_kv
    return getattr(manager, "store", None) or getattr(manager, "_store", None)


def available_tiers(store: Any) -> list[str]:
    """Names of the tiers of ``store`` this benchmark can stage (device, host, disk), fastest first."""
    tiers = getattr(store, "tiers", None)
    if tiers is None:
        return []
    names = {getattr(t, "name", None) for t in tiers}
    return [name for name in TIER_ORDER if name in names]


def stage(store: Any, tier: str) -> None:
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
    records = [client.db.get(memory_id) for memory_id in memory_ids]
    client.fact_kv.ensure([r for r in records if r is not None])


def hits(store: Any) -> dict[str, int]:
    """Lookups answered so far per tier, and ``"miss"`` (encoded), from the store's counters (``{}``: none)."""
    stats = getattr(store, "stats", None)
    if stats is None:
        return {}
    s = stats()
    out = {str(k): int(v) for k, v in s.hits.items()}
    out["miss"] = int(s.misses)
    return out


def hit_delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    """The non-zero changes between two :func:`hits` readings."""
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}
