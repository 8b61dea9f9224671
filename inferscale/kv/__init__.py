"""The KV core: pre-RoPE fact encoding, chunked RoPE, composition and storage. Torch only: no SQL, no HTTP."""

from inferscale.kv.compose import AssembledKV, PrefixKV, SegmentWorkspace, assemble
from inferscale.kv.encode import EncodeRequest, FactEncoder
from inferscale.kv.fact import FactKV
from inferscale.kv.fingerprint import model_fingerprint
from inferscale.kv.quantization import STORAGE_FORMATS, KVScales
from inferscale.kv.rope import RopeTable, apply_rope, rotate_half
from inferscale.kv.rope_config import max_static_position
from inferscale.kv.store import KVKey, KVStore, KVStoreStats, TieredKVStore
from inferscale.kv.tiers import DeviceTier, DiskTier, HostTier, KVFormatError, KVTier

__all__ = [
    "STORAGE_FORMATS",
    "AssembledKV",
    "DeviceTier",
    "DiskTier",
    "EncodeRequest",
    "FactEncoder",
    "FactKV",
    "HostTier",
    "KVFormatError",
    "KVKey",
    "KVScales",
    "KVStore",
    "KVStoreStats",
    "KVTier",
    "PrefixKV",
    "RopeTable",
    "SegmentWorkspace",
    "TieredKVStore",
    "apply_rope",
    "assemble",
    "max_static_position",
    "model_fingerprint",
    "rotate_half",
]
