"""Fixtures of the server tests: a real server (uvicorn on 127.0.0.1, a free port) over an async memory client built
with the API suite's fakes (HashEmbedder, ScriptedGenerator) and, for chats, a tiny float32 engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mem0_fakes import HashEmbedder, ScriptedGenerator, fake_config
from server_fixture import running_server
from server_harness import MakeServer, Served
from tiny_models import tiny_engine

from inferscale import AsyncMemoryClient
from inferscale.server.app import create_app
from inferscale.server.keys import KeyStore
from inferscale.server.options import ServerOptions


@pytest.fixture(scope="session")
def chat_engine() -> Any:
    """A tiny float32 Llama with a byte-level tokenizer (fast, real generation), shared by the session."""
    return tiny_engine("llama")


@pytest.fixture
def make_server(tmp_path: Path, chat_engine: Any) -> Iterator[MakeServer]:
    """Starts servers for this test: ``make_server(options=None, generator=None, db_url=None)``; stopped after the
    test."""
    stack: list[Any] = []

    def start(
        options: ServerOptions | None = None, generator: ScriptedGenerator | None = None, db_url: str | None = None
    ) -> Served:
        config = fake_config(tmp_path / f"server{len(stack)}", db_url)
        client = AsyncMemoryClient(
            config, engine=chat_engine, embedder=HashEmbedder(), generator=generator or ScriptedGenerator()
        )
        options = options or ServerOptions()
        keys = KeyStore.for_config(config, options.key_check_limits)  # as serve_transformers builds it
        app = create_app(client, keys=keys, options=options)
        context = running_server(app)
        url = context.__enter__()
        stack.append((context, keys))
        return Served(url, keys, config, client)

    yield start
    for context, keys in reversed(stack):
        context.__exit__(None, None, None)
        keys.close()


@pytest.fixture
def served(make_server: MakeServer) -> Served:
    """A server with the default options and no keys yet (open)."""
    return make_server()
