""":class:`InferScaleRetriever`: a scope's memories as LlamaIndex nodes."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.callbacks import CallbackManager
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from llama_index.memory.inferscale._scope import InferScaleContext

from inferscale import AsyncMemoryClient, MemoryClient


class InferScaleRetriever(BaseRetriever):
    """Retrieve a scope's memories most similar to the query (``MemoryClient.search``), best first.

    Each result is ``NodeWithScore(node=TextNode(id_=memory id, text=memory, metadata=scope ids), score=cosine)``.

    Args:
        client: the InferScale ``MemoryClient``.
        user_id, agent_id, run_id: the scope (at least one).
        similarity_top_k: how many memories at most.
        filters: a Mem0 filter dict, applied within the scope.
        async_client: an ``AsyncMemoryClient`` for ``aretrieve``; without one the sync client runs on a thread.

    Raises:
        ScopeError: when no scope id is given.
    """

    def __init__(
        self,
        client: MemoryClient,
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        run_id: str | None = None,
        similarity_top_k: int = 5,
        filters: Mapping[str, Any] | None = None,
        async_client: AsyncMemoryClient | None = None,
        callback_manager: CallbackManager | None = None,
        verbose: bool = False,
    ) -> None:
        super().__init__(callback_manager=callback_manager, verbose=verbose)
        self._client = client
        self._async_client = async_client
        self._scope = InferScaleContext.of(user_id=user_id, agent_id=agent_id, run_id=run_id)
        self.similarity_top_k = similarity_top_k
        self.filters = dict(filters) if filters else None

    def _search_kwargs(self) -> dict[str, Any]:
        return {**self._scope.ids(), "limit": self.similarity_top_k, "filters": self.filters}

    def _nodes(self, results: list[dict[str, Any]]) -> list[NodeWithScore]:
        metadata = self._scope.ids()
        return [
            NodeWithScore(node=TextNode(id_=r["id"], text=r["memory"], metadata=dict(metadata)), score=r["score"])
            for r in results
        ]

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return self._nodes(self._client.search(query_bundle.query_str, **self._search_kwargs())["results"])

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if self._async_client is not None:
            found = await self._async_client.search(query_bundle.query_str, **self._search_kwargs())
        else:
            found = await asyncio.to_thread(self._client.search, query_bundle.query_str, **self._search_kwargs())
        return self._nodes(found["results"])
