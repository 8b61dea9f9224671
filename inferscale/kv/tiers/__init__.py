"""Storage tiers of the KV store: one small interface (:class:`KVTier`), one module per tier.

The composite that chains them (lookup device ▸ host ▸ disk) is :class:`inferscale.kv.store.TieredKVStore`.
"""

from inferscale.kv.tiers.base import Evicted, KVKey, KVTier, check_memory_id
from inferscale.kv.tiers.device import DeviceTier
from inferscale.kv.tiers.disk import DiskTier
from inferscale.kv.tiers.eviction import LRUPolicy
from inferscale.kv.tiers.host import HostTier
from inferscale.kv.tiers.memory import MemoryTier
from inferscale.kv.tiers.serialization import KVFormatError

__all__ = [
    "DeviceTier",
    "DiskTier",
    "Evicted",
    "HostTier",
    "KVFormatError",
    "KVKey",
    "KVTier",
    "LRUPolicy",
    "MemoryTier",
    "check_memory_id",
]
