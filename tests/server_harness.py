"""What a server test holds: :class:`Served` (a running server, its key store, config and client), the
``make_server`` factory type of tests/server/conftest.py, and :func:`free_port` for a server in a child process."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from sqlalchemy import text

from inferscale import AsyncMemoryClient, MemoryConfig
from inferscale.server.keys import KeyStore
from inferscale.storage import make_engine
from inferscale.storage.schema import MEMORY_SCHEMA, ensure_schema


@dataclass
class Served:
    """A running server and what a test needs around it."""

    url: str
    keys: KeyStore
    config: MemoryConfig
    client: AsyncMemoryClient

    def http(self, key: str | None = None, scheme: str = "Token") -> httpx.Client:
        """An HTTP client for the server, sending ``key`` in the Authorization header when given."""
        headers = {"Authorization": f"{scheme} {key}"} if key is not None else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60.0)

    def row_counts(self) -> tuple[int, int]:
        """(memories, history rows) in the server's database, read outside the server (the tables are created when
        no request has written yet, by the store's own migrations: tables made from today's models without a version
        table would be refused as unversioned 0.1 tables once they differ from its baseline)."""
        engine = make_engine(self.config.database_url())
        ensure_schema(engine, MEMORY_SCHEMA)
        try:
            with engine.connect() as conn:
                memories = conn.execute(text("select count(*) from memories")).scalar_one()
                history = conn.execute(text("select count(*) from memory_history")).scalar_one()
        finally:
            engine.dispose()
        return int(memories), int(history)


MakeServer = Callable[..., Served]


def app_routes(app: Any) -> list[tuple[str, set[str]]]:
    """``(path template, methods)`` of every HTTP route of a FastAPI app, included routers' routes too (FastAPI 0.16x
    keeps them nested under ``app.routes``; older versions copy them there)."""
    from starlette.routing import Route

    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:
        routes: list[Any] = list(app.routes)
    else:
        routes = list(iter_route_contexts(app.routes))
    found = [(route.path, set(route.methods or ())) for route in routes if isinstance(route.path, str)]
    assert all(isinstance(getattr(r, "original_route", r), Route) for r in routes), routes  # no mount, no socket
    return found


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago, for a server started in a child process."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
