"""The package's public surface: ``inferscale.__all__`` is exactly this sorted list, and every name in it imports
(the clients and configs are loaded lazily on first access, so each is fetched here)."""

from __future__ import annotations

import importlib

import pytest

import inferscale

EXPECTED_ALL = [
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


def test_all_is_pinned_and_sorted() -> None:
    assert sorted(EXPECTED_ALL) == EXPECTED_ALL
    assert inferscale.__all__ == EXPECTED_ALL


@pytest.mark.parametrize("name", EXPECTED_ALL)
def test_every_public_name_imports(name: str) -> None:
    module = importlib.import_module("inferscale")
    assert getattr(module, name) is not None


def test_star_import_gives_every_public_name() -> None:
    namespace: dict[str, object] = {}
    exec("from inferscale import *", namespace)
    assert set(EXPECTED_ALL) <= set(namespace)
