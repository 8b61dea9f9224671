"""InferScale: long-term memory for LLM agents with KV-injected recall.

from inferscale import MemoryClient
client = MemoryClient()
client.add("I adopted a beagle named Biscuit.", user_id="maya")
print(client.chat("What is my dog's name?", user_id="maya").answer)
"""

from typing import TYPE_CHECKING, Any

from inferscale.config import EmbedderConfig, EngineConfig, KVConfig, LLMConfig, MemoryConfig
from inferscale.errors import (
    ConfigError,
    ExtractionError,
    InferScaleError,
    InvalidInputError,
    KVFingerprintMismatchError,
    MemoryNotFoundError,
    ModelNotAvailableError,
    ScopeError,
    UnsupportedModelError,
)
from inferscale.types import ChatResult, Timings

if TYPE_CHECKING:
    from inferscale.async_client import AsyncMemory, AsyncMemoryClient
    from inferscale.client import Memory, MemoryClient

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # The client pulls in torch, transformers and FAISS; import it on first use so that light modules
    # (errors, config, the KV core) can be imported on their own.
    if name in ("MemoryClient", "Memory"):
        from inferscale import client

        return getattr(client, name)
    if name in ("AsyncMemoryClient", "AsyncMemory"):
        from inferscale import async_client

        return getattr(async_client, name)
    raise AttributeError(f"module 'inferscale' has no attribute {name!r}")


__all__ = [
    "AsyncMemory",
    "AsyncMemoryClient",
    "ChatResult",
    "ConfigError",
    "EmbedderConfig",
    "EngineConfig",
    "ExtractionError",
    "InferScaleError",
    "InvalidInputError",
    "KVConfig",
    "KVFingerprintMismatchError",
    "LLMConfig",
    "Memory",
    "MemoryClient",
    "MemoryConfig",
    "MemoryNotFoundError",
    "ModelNotAvailableError",
    "ScopeError",
    "Timings",
    "UnsupportedModelError",
    "__version__",
]
