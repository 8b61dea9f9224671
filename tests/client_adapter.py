"""One face for every client, so that the API suite runs each test on :class:`MemoryClient`,
:class:`AsyncMemoryClient` and the remote clients: the client's public methods as plain calls, the async clients'
coroutines run to the end before the call returns.

The remote kinds ("remote": :class:`RemoteMemoryClient`, "remote-async": :class:`AsyncRemoteMemoryClient`) talk to a
real InferScale server (uvicorn on 127.0.0.1, a free port) that serves an :class:`AsyncMemoryClient` built from the
test's config, engine, embedder and generator. The "remote" server is open (no API keys); the "remote-async" one has
an admin key in its database, which the client sends, so the keyed path (authentication, :class:`Caller`'s scope
rules) must give the same answers as the local clients too. Tests that read a client's internals (``db``, ``fact_kv``,
``engine``, ``config``) read that served client's.

The admin key is created once per session, by :meth:`KeyStore.create` on a scratch database, and its row copied into
each "remote-async" test's database (:func:`install_admin_key`): creating a key costs a scrypt (~40 ms of CPU), which
the keyed server still runs, once per test, when it checks the key on the first request.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from functools import cache
from typing import TYPE_CHECKING, Any, Literal

from inferscale import AsyncMemoryClient, MemoryClient
from inferscale.remote import AsyncRemoteMemoryClient, RemoteMemoryClient

if TYPE_CHECKING:  # annotations only: the adapter needs no more than the clients at run time
    from inferscale import ChatChunk, ChatResult, MemoryConfig
    from inferscale.engines.base import Engine
    from inferscale.fact_kv import FactKVManager
    from inferscale.reconcile import ReconcileReport
    from inferscale.retrieval import VectorIndex
    from inferscale.server.keys import KeyStore
    from inferscale.storage import MemoryStore

ClientKind = Literal["sync", "async", "remote", "remote-async"]
REMOTE_KINDS: tuple[ClientKind, ...] = ("remote", "remote-async")
AnyClient = MemoryClient | AsyncMemoryClient | RemoteMemoryClient | AsyncRemoteMemoryClient


def kind_of(client: AnyClient) -> ClientKind:
    """Which kind of client ``client`` is."""
    if isinstance(client, RemoteMemoryClient):
        return "remote"
    if isinstance(client, AsyncRemoteMemoryClient):
        return "remote-async"
    return "async" if isinstance(client, AsyncMemoryClient) else "sync"


class ClientAdapter:
    """``client``'s API as plain calls, with the client's own arguments, results and errors.

    The async clients' calls all run on one event loop that the adapter owns (the async SQL engine is bound to the
    loop it first ran on). :meth:`close` closes the client, then the server of a remote client, then the loop.

    Args:
        client: the client.
        served: for a remote client, the client its server serves (its internals stand for the remote client's).
        server: for a remote client, what keeps its server running; closed by :meth:`close` (which stops the
            server, and the server closes the client it serves).
    """

    def __init__(
        self, client: AnyClient, served: AsyncMemoryClient | None = None, server: ExitStack | None = None
    ) -> None:
        self.client = client
        self.kind: ClientKind = kind_of(client)
        self._served = served
        self._server = server
        self._runner = asyncio.Runner() if self.kind in ("async", "remote-async") else None
        self._closed = False

    def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        result = method(*args, **kwargs)
        return result if self._runner is None else self._runner.run(result)

    # ---- the API, one line each --------------------------------------------------------------------------------
    def add(self, *args: Any, **kwargs: Any) -> dict[str, list[dict[str, Any]]]:
        return self._call(self.client.add, *args, **kwargs)

    def search(self, *args: Any, **kwargs: Any) -> dict[str, list[dict[str, Any]]]:
        return self._call(self.client.search, *args, **kwargs)

    def get(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        return self._call(self.client.get, *args, **kwargs)

    def get_all(self, *args: Any, **kwargs: Any) -> dict[str, list[dict[str, Any]]]:
        return self._call(self.client.get_all, *args, **kwargs)

    def update(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return self._call(self.client.update, *args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> dict[str, str]:
        return self._call(self.client.delete, *args, **kwargs)

    def delete_all(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return self._call(self.client.delete_all, *args, **kwargs)

    def history(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        return self._call(self.client.history, *args, **kwargs)

    def reset(self) -> None:
        self._call(self.client.reset)

    def chat(self, *args: Any, **kwargs: Any) -> ChatResult:
        return self._call(self.client.chat, *args, **kwargs)

    def reconcile(self) -> ReconcileReport:
        """The local clients' ``reconcile`` (the remote ones have none)."""
        if isinstance(self.client, (RemoteMemoryClient, AsyncRemoteMemoryClient)):
            raise TypeError(f"the {self.kind} client has no reconcile")
        return self._call(self.client.reconcile)

    def wait_for_encoding(self, timeout: float | None = None) -> bool:
        """Every client's ``wait_for_encoding`` (a remote client's asks its server, ``POST /v1/encoding/wait/``)."""
        return bool(self._call(self.client.wait_for_encoding, timeout))

    def ping(self) -> dict[str, Any]:
        """The remote clients' ``ping`` (the local ones have none)."""
        if not isinstance(self.client, (RemoteMemoryClient, AsyncRemoteMemoryClient)):
            raise TypeError(f"the {self.kind} client has no ping")
        return self._call(self.client.ping)

    def chat_stream_open(self, *args: Any, **kwargs: Any) -> Any:
        """``chat(..., stream=True)`` without reading the stream (the async client's call awaited): what the call
        itself returns or raises."""
        return self._call(self.client.chat, *args, stream=True, **kwargs)

    def chat_stream(self, *args: Any, **kwargs: Any) -> list[ChatChunk]:
        """``chat(..., stream=True)``, every chunk collected (errors raised by the call itself, as the client
        raises them before the first chunk)."""
        if isinstance(self.client, (MemoryClient, RemoteMemoryClient)):
            return list(self.client.chat(*args, stream=True, **kwargs))
        client = self.client

        async def collect() -> list[ChatChunk]:
            return [chunk async for chunk in await client.chat(*args, stream=True, **kwargs)]

        assert self._runner is not None
        return self._runner.run(collect())

    def close(self) -> None:
        """Close the client (a local one writes its index file), then a remote client's server (which closes the
        client it serves), then the adapter's event loop. A second call does nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            self._call(self.client.close)
        finally:
            if self._server is not None:
                self._server.close()
            if self._runner is not None:
                self._runner.close()

    # ---- attributes every client has here (a remote client's are its server's) --------------------------------
    @property
    def _local(self) -> MemoryClient | AsyncMemoryClient:
        """The client whose internals the tests read: the client itself, or the one a remote client's server
        serves."""
        if isinstance(self.client, (MemoryClient, AsyncMemoryClient)):
            return self.client
        if self._served is None:
            raise TypeError("this remote client has no server in the test process: it has no internals to read")
        return self._served

    @property
    def config(self) -> MemoryConfig:
        return self._local.config

    @property
    def db(self) -> MemoryStore:
        return self._local.db

    @property
    def fact_kv(self) -> FactKVManager:
        return self._local.fact_kv

    @property
    def engine(self) -> Engine:
        return self._local.engine

    @property
    def index(self) -> VectorIndex:
        """The sync client's FAISS index. The async clients (and a server's, which is async) have no public one:
        tests read it under ``if m.kind == "sync"``."""
        if not isinstance(self.client, MemoryClient):
            raise TypeError(f"the {self.kind} client has no public index")
        return self.client.index


MakeClient = Callable[..., ClientAdapter]


def open_client(
    kind: ClientKind,
    config: MemoryConfig,
    *,
    engine: Engine | None = None,
    embedder: Any = None,
    generator: Any = None,
) -> ClientAdapter:
    """A ``kind`` client built from the same arguments, behind an adapter: :class:`MemoryClient` or
    :class:`AsyncMemoryClient`; or a remote client (``MemoryClient(host=...)`` / ``AsyncMemoryClient(host=...)``)
    on a server started here, on 127.0.0.1, that serves an :class:`AsyncMemoryClient` built from them: open for
    "remote", with an admin key (sent by the client) for "remote-async"."""
    if kind == "sync":
        return ClientAdapter(MemoryClient(config, engine=engine, embedder=embedder, generator=generator))
    if kind == "async":
        return ClientAdapter(AsyncMemoryClient(config, engine=engine, embedder=embedder, generator=generator))
    from server_fixture import running_server

    from inferscale.server.app import create_app
    from inferscale.server.keys import KeyStore
    from inferscale.server.options import ServerOptions

    served = AsyncMemoryClient(config, engine=engine, embedder=embedder, generator=generator)
    server = ExitStack()
    keys, api_key = None, None
    if kind == "remote-async":
        keys = KeyStore.for_config(config)
        server.callback(keys.close)  # after the server stopped (an ExitStack unwinds last in, first out)
        api_key = install_admin_key(keys)
    url = server.enter_context(running_server(create_app(served, keys=keys, options=ServerOptions())))
    if kind == "remote":
        client: AnyClient = MemoryClient(host=url)
    else:
        client = AsyncMemoryClient(host=url, api_key=api_key)
    adapter = ClientAdapter(client, served, server)
    _SERVING.append(adapter)
    return adapter


_SERVING: list[ClientAdapter] = []


@cache
def _session_admin_key() -> tuple[dict[str, Any], str]:
    """An admin key made by :meth:`KeyStore.create` on a scratch database, once per session: its ``api_keys`` row
    (column name -> value: the scrypt hash and salt of its secret, ...) and its key string."""
    from sqlalchemy.orm import Session

    from inferscale.server.keys import ApiKeyRow, KeyStore
    from inferscale.storage import make_engine

    with tempfile.TemporaryDirectory() as folder:
        store = KeyStore(f"sqlite:///{folder}/keys.db")
        key, api_key = store.create("api suite admin", admin=True)
        store.close()
        engine = make_engine(store.url)
        try:
            with Session(engine) as session:
                row = session.get(ApiKeyRow, key.key_id)
                assert row is not None
                columns = {column.key: getattr(row, column.key) for column in ApiKeyRow.__table__.columns}
        finally:
            engine.dispose()
    return columns, api_key


def install_admin_key(keys: KeyStore) -> str:
    """Write the session's admin key (:func:`_session_admin_key`: the row :meth:`KeyStore.create` wrote, copied)
    into ``keys``' database, unless it is there already; returns its key string."""
    from sqlalchemy.orm import Session

    from inferscale.server.keys import ApiKeyRow
    from inferscale.storage import make_engine

    columns, api_key = _session_admin_key()
    engine = make_engine(keys.url)
    try:
        ApiKeyRow.metadata.create_all(engine)
        with Session(engine) as session, session.begin():
            if session.get(ApiKeyRow, columns["key_id"]) is None:  # a second client on the same database shares it
                session.add(ApiKeyRow(**columns))
    finally:
        engine.dispose()
    return api_key


def close_remote_clients() -> None:
    """Close every remote client :func:`open_client` opened and its server (a test that leaves a client open
    leaves no server running behind it)."""
    while _SERVING:
        _SERVING.pop().close()
