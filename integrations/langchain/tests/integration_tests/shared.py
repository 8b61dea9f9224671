"""One embedded client per test session, shared by every integration test (the model loads once).

The standard suites build their model from a class property, where fixtures cannot reach, so the client lives here
and ``conftest.py`` closes it at the end of the session. Each test uses scope ids of its own.
"""

from __future__ import annotations

import functools
import tempfile

from inferscale.async_client import AsyncMemoryClient
from inferscale.client import MemoryClient

MAX_TOKENS = 12
"""Answer budget of the tests (tokens): enough for a short answer, small enough for two CPU cores."""

STANDARD_USER = "standard-suite"
"""The scope of the standard suites; it holds the memories below."""

STANDARD_MEMORIES = (
    "My dog is called Biscuit.",
    "I live in Lisbon.",
    "I work as a nurse.",
    "I like green tea.",
)


@functools.cache
def data_dir() -> str:
    return tempfile.mkdtemp(prefix="langchain-inferscale-")


@functools.cache
def shared_client() -> MemoryClient:
    """The session's client on the embedded models, with :data:`STANDARD_MEMORIES` stored for
    :data:`STANDARD_USER`."""
    client = MemoryClient({"data_dir": data_dir(), "engine": {"dtype": "float32"}})
    client.add([{"role": "user", "content": m} for m in STANDARD_MEMORIES], user_id=STANDARD_USER, infer=False)
    return client


@functools.cache
def shared_async_client() -> AsyncMemoryClient:
    """An async client on the same database, sharing the sync client's engine and embedder."""
    sync = shared_client()
    return AsyncMemoryClient(sync.config, engine=sync.engine, embedder=sync.embedder)
