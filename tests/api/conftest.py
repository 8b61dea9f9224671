"""The API suite runs each test on every client: ``client_kind`` is "sync" (MemoryClient), "async"
(AsyncMemoryClient, its coroutines run to the end by :class:`client_adapter.ClientAdapter`), then "remote" and
"remote-async" (``MemoryClient(host=...)`` and ``AsyncMemoryClient(host=...)``, each over HTTP to a real server app of
its own, on a port of its own of the session's uvicorn server (:mod:`server_fixture`), that serves an AsyncMemoryClient
built from the test's arguments: "remote" on an open server, "remote-async" on a keyed one with an admin key, so both
of the server's paths answer as the local clients do)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from client_adapter import REMOTE_KINDS, ClientAdapter, ClientKind, MakeClient, close_remote_clients, open_client
from mem0_fakes import HashEmbedder, ScriptedGenerator, fake_config
from sqlalchemy import create_engine, func, select

from inferscale import MemoryConfig
from inferscale.storage.models import HistoryRow, MemoryRow


@pytest.fixture(params=["sync", "async", "remote", "remote-async"])
def client_kind(request: pytest.FixtureRequest) -> ClientKind:
    """Which client a test runs on. The remote cases (a server serves an async client) are skipped without the server
    extra (FastAPI, uvicorn)."""
    if request.param in REMOTE_KINDS:
        pytest.importorskip("fastapi", reason="the server needs FastAPI (pip install 'inferscale-memory[server]')")
        pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install 'inferscale-memory[server]')")
    kind: ClientKind = request.param
    return kind


@pytest.fixture(autouse=True)
def _no_server_left_running() -> Iterator[None]:
    """Stop the servers of remote clients a test opened and left open."""
    yield
    close_remote_clients()


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


@pytest.fixture
def row_counts(db_url: str) -> Iterator[Callable[[], tuple[int, int]]]:
    """``() -> (memories, history rows)`` read straight from the test's database, whichever client wrote."""
    engine = create_engine(db_url)

    def count() -> tuple[int, int]:
        with engine.connect() as conn:
            memories = conn.execute(select(func.count()).select_from(MemoryRow)).scalar_one()
            history = conn.execute(select(func.count()).select_from(HistoryRow)).scalar_one()
        return memories, history

    yield count
    engine.dispose()
