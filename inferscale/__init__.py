"""InferScale: long-term memory for LLM agents with KV-injected recall.

from inferscale import MemoryClient
client = MemoryClient()
client.add("I adopted a beagle named Biscuit.", user_id="maya")
print(client.chat("What is my dog's name?", user_id="maya").answer)
"""

from typing import TYPE_CHECKING, Any

from inferscale.conversation import ChatMessage
from inferscale.errors import (
    APIKeyNotFoundError,
    AuthenticationError,
    ConfigError,
    ContextLengthError,
    DatabaseUnavailableError,
    EngineClosedError,
    ExtractionError,
    InferScaleError,
    InvalidInputError,
    KVFingerprintMismatchError,
    MemoryNotFoundError,
    MemoryTooLongError,
    MethodNotAllowedError,
    ModelNotAvailableError,
    PermissionDeniedError,
    RateLimitedError,
    RequestTooLargeError,
    RouteNotFoundError,
    SchemaError,
    ScopeError,
    ServerError,
    UnsupportedModelError,
)
from inferscale.types import ChatChunk, ChatResult, RecalledMemory, Timings

if TYPE_CHECKING:
    from inferscale.async_client import AsyncMemory, AsyncMemoryClient
    from inferscale.client import Memory, MemoryClient
    from inferscale.config import EmbedderConfig, EngineConfig, KVConfig, LLMConfig, MemoryConfig, SearchConfig

__version__ = "0.1.0"


_CONFIG_NAMES = ("EmbedderConfig", "EngineConfig", "KVConfig", "LLMConfig", "MemoryConfig", "SearchConfig")


def __getattr__(name: str) -> Any:
    # The clients pull in torch, transformers, FAISS and SQLAlchemy, and the config pydantic; import them on first
    # use so that the KV core (torch only) can be imported on its own, e.g. on a GPU box with only torch and
    # transformers (benchmarks/gpu_check.sh).
    if name in _CONFIG_NAMES:
        from inferscale import config

        return getattr(config, name)
    if name in ("MemoryClient", "Memory"):
        from inferscale import client

        return getattr(client, name)
    if name in ("AsyncMemoryClient", "AsyncMemory"):
        from inferscale import async_client

        return getattr(async_client, name)
    raise AttributeError(f"module 'inferscale' has no attribute {name!r}")


__all__ = [
    "APIKeyNotFoundError",
    "AsyncMemory",
    "AsyncMemoryClient",
    "AuthenticationError",
    "ChatChunk",
    "ChatMessage",
    "ChatResult",
    "ConfigError",
    "ContextLengthError",
    "DatabaseUnavailableError",
    "EmbedderConfig",
    "EngineClosedError",
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
    "MemoryTooLongError",
    "MethodNotAllowedError",
    "ModelNotAvailableError",
    "PermissionDeniedError",
    "RateLimitedError",
    "RecalledMemory",
    "RequestTooLargeError",
    "RouteNotFoundError",
    "SchemaError",
    "ScopeError",
    "SearchConfig",
    "ServerError",
    "Timings",
    "UnsupportedModelError",
    "__version__",
]
