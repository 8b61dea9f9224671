"""One face for both clients, so that the API suite runs each test on :class:`MemoryClient` and on
:class:`AsyncMemoryClient`: the client's public methods as plain calls, the async client's coroutines run to the
end before the call returns."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from inferscale import AsyncMemoryClient, MemoryClient

if TYPE_CHECKING:  # annotations only: the adapter needs no more than the two clients at run time
    from inferscale import ChatChunk, ChatResult, MemoryConfig
    from inferscale.engines.base import Engine
    from inferscale.fact_kv import FactKVManager
    from inferscale.retrieval import VectorIndex
    from inferscale.storage import MemoryStore

ClientKind = Literal["sync", "async"]


class ClientAdapter:
    """``client``'s API as plain calls, with the client's own arguments, results and errors.

    The async client's calls all run on one event loop that the adapter owns (the async SQL engine is bound to the
    loop it first ran on). :meth:`close` closes the client and then the loop.
    """

    def __init__(self, client: MemoryClient | AsyncMemoryClient) -> None:
        self.client = client
        self.kind: ClientKind = "async" if isinstance(client, AsyncMemoryClient) else "sync"
        self._runner = asyncio.Runner() if self.kind == "async" else None
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

    def chat_stream_open(self, *args: Any, **kwargs: Any) -> Any:
        """``chat(..., stream=True)`` without reading the stream (the async client's call awaited): what the call
        itself returns or raises."""
        return self._call(self.client.chat, *args, stream=True, **kwargs)

    def chat_stream(self, *args: Any, **kwargs: Any) -> list[ChatChunk]:
        """``chat(..., stream=True)``, every chunk collected (errors raised by the call itself, as the client
        raises them before the first chunk)."""
        if isinstance(self.client, MemoryClient):
            return list(self.client.chat(*args, stream=True, **kwargs))
        client = self.client

        async def collect() -> list[ChatChunk]:
            return [chunk async for chunk in await client.chat(*args, stream=True, **kwargs)]

        assert self._runner is not None
        return self._runner.run(collect())

    def close(self) -> None:
        """Close the client (writing its index file), then the adapter's event loop. A second call does nothing."""
        if self._closed:
            return
        self._call(self.client.close)
        if self._runner is not None:
            self._runner.close()
        self._closed = True

    # ---- attributes both clients have -----------------------------------------------------------------------------
    @property
    def config(self) -> MemoryConfig:
        return self.client.config

    @property
    def db(self) -> MemoryStore:
        return self.client.db

    @property
    def fact_kv(self) -> FactKVManager:
        return self.client.fact_kv

    @property
    def engine(self) -> Engine:
        return self.client.engine

    @property
    def index(self) -> VectorIndex:
        """The sync client's FAISS index. The async client has no public one: tests read it under
        ``if m.kind == "sync"``."""
        if not isinstance(self.client, MemoryClient):
            raise TypeError("the async client has no public index")
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
    """A ``kind`` client (:class:`MemoryClient` or :class:`AsyncMemoryClient`) built from the same arguments,
    behind an adapter."""
    cls = AsyncMemoryClient if kind == "async" else MemoryClient
    return ClientAdapter(cls(config, engine=engine, embedder=embedder, generator=generator))
