"""How the memory classes search on the event loop: one ``k -> hits`` function over the async client when there is
one, else the sync client on a thread (the shape :func:`inferscale.kept_search.asearch_kept` widens)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from llama_index.memory.inferscale._scope import ScopeKwargs

from inferscale import AsyncMemoryClient, MemoryClient
from inferscale.remote import AsyncRemoteMemoryClient, RemoteMemoryClient


def async_search(
    client: MemoryClient | RemoteMemoryClient,
    async_client: AsyncMemoryClient | AsyncRemoteMemoryClient | None,
    query: str,
    scope: ScopeKwargs,
) -> Callable[[int], Awaitable[list[Mapping[str, Any]]]]:
    """``k -> the best k search hits for query in scope``, best first (``search(...)["results"]``): on
    ``async_client`` when given, else ``client`` on a thread.

    Raises (when called): whatever the client's ``search`` raises.
    """

    async def search(k: int) -> list[Mapping[str, Any]]:
        if async_client is not None:
            return list((await async_client.search(query, **scope, limit=k))["results"])
        return list((await asyncio.to_thread(lambda: client.search(query, **scope, limit=k)))["results"])

    return search


__all__ = ["async_search"]
