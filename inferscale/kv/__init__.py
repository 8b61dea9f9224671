"""The KV core: pre-RoPE fact encoding, chunked RoPE, composition and storage. Torch only: no SQL, no HTTP."""

from inferscale.kv.compose import AssembledKV, PrefixKV, assemble
from inferscale.kv.encode import EncodeRequest, FactEncoder
from inferscale.kv.fact import FactKV
from inferscale.kv.fingerprint import model_fingerprint
from inferscale.kv.rope import RopeTable, apply_rope, max_static_position, rotate_half
from inferscale.kv.store import KVKey, KVStore

__all__ = [
    "AssembledKV",
    "EncodeRequest",
    "FactEncoder",
    "FactKV",
    "KVKey",
    "KVStore",
    "PrefixKV",
    "RopeTable",
    "apply_rope",
    "assemble",
    "max_static_position",
    "model_fingerprint",
    "rotate_half",
]
