"""The API suite runs each test on both clients: ``client_kind`` is "sync" (MemoryClient), then "async"
(AsyncMemoryClient, its coroutines run to the end by :class:`client_adapter.ClientAdapter`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from client_adapter import ClientAdapter, ClientKind, MakeClient, open_client
from mem0_fakes import HashEmbedder, ScriptedGenerator, fake_config

from inferscale import MemoryConfig


@pytest.fixture(params=["sync", "async"])
def client_kind(request: pytest.FixtureRequest) -> ClientKind:
    """Which client a test runs on; the async case is skipped when async SQLAlchemy's drivers are missing."""
    if request.param == "async":
        pytest.importorskip("aiosqlite", reason="the async client needs aiosqlite (pip install aiosqlite)")
        pytest.importorskip("greenlet", reason="async SQLAlchemy needs greenlet (pip install 'sqlalchemy[asyncio]')")
    kind: ClientKind = request.param
    return kind


@pytest.fixture
def make(tmp_path: Path, db_url: str, client_kind: ClientKind) -> Iterator[MakeClient]:
    """Builds clients of this test's kind on ``db_url``: ``make(generator=None, *, config=None, embedder=None)``
    (defaults: the fake config, a HashEmbedder, an empty ScriptedGenerator). Closes them after the test."""
    built: list[ClientAdapter] = []

    def build(
        generator: ScriptedGenerator | None = None,
        *,
        config: MemoryConfig | None = None,
        embedder: HashEmbedder | None = None,
    ) -> ClientAdapter:
        client = open_client(
            client_kind,
            config or fake_config(tmp_path, db_url),
            embedder=embedder or HashEmbedder(),
            generator=generator or ScriptedGenerator(),
        )
        built.append(client)
        return client

    yield build
    for client in built:
        client.close()


@pytest.fixture
def m(make: MakeClient) -> ClientAdapter:
    """A client of this test's kind with the fakes' defaults."""
    return make()
