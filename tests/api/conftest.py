"""The API suite runs each test on both clients: ``client_kind`` is "sync" (MemoryClient), then "async"
(AsyncMemoryClient, its coroutines run to the end by :class:`client_adapter.ClientAdapter`)."""

from __future__ import annotations

import pytest
from client_adapter import ClientKind


@pytest.fixture(params=["sync", "async"])
def client_kind(request: pytest.FixtureRequest) -> ClientKind:
    """Which client a test runs on; the async case is skipped when async SQLAlchemy's drivers are missing."""
    if request.param == "async":
        pytest.importorskip("aiosqlite", reason="the async client needs aiosqlite (pip install aiosqlite)")
        pytest.importorskip("greenlet", reason="async SQLAlchemy needs greenlet (pip install 'sqlalchemy[asyncio]')")
    kind: ClientKind = request.param
    return kind
