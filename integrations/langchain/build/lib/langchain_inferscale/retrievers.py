"""``InferScaleRetriever``: a scope's memories as LangChain ``Document``s."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field, model_validator

from inferscale.async_client import AsyncMemoryClient
from inferscale.client import MemoryClient
from inferscale.remote import AsyncRemoteMemoryClient, RemoteMemoryClient

_CALL_KWARGS = frozenset({"k", "filters", "user_id", "agent_id", "memory_run_id", "threshold"})


class InferScaleRetriever(BaseRetriever):
    """The scope's memories most similar to the query, best first, as ``Document``s.

    Each document's ``page_content`` is the memory text, its ``id`` the memory id, and its metadata holds ``id``,
    ``score`` (cosine; higher is closer), ``user_id``, ``agent_id``, ``run_id``, the memory's own metadata under
    ``"metadata"``, and for a memory stored verbatim from a message its ``role`` (and ``actor_id``, the speaker's
    name, when the message had one).

    Example:
        .. code-block:: python

            retriever = InferScaleRetriever(client=client, user_id="maya", k=3)
            docs = retriever.invoke("pets")

    Per call: ``k``, ``filters``, ``threshold``, ``user_id``, ``agent_id`` and ``memory_run_id`` (LangChain reserves
    ``run_id`` for its tracing run). Any other keyword raises ``TypeError``.
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    client: MemoryClient | RemoteMemoryClient | None = Field(default=None, exclude=True)
    """Answers sync calls (a local client, or a server's: ``MemoryClient(host=...)``); built from ``config`` when
    neither client is given."""
    async_client: AsyncMemoryClient | AsyncRemoteMemoryClient | None = Field(default=None, exclude=True)
    """Answers async calls; without one they run the sync client on LangChain's executor."""
    config: dict[str, Any] | None = None
    user_id: str | None = None
    agent_id: str | None = None
    run_id: str | None = None
    k: int = Field(default=4, ge=0)
    """Documents returned at most."""
    filters: dict[str, Any] | None = None
    """A Mem0 filter dict applied within the scope."""
    threshold: float | None = None
    """Drop memories whose score is below it."""

    @model_validator(mode="after")
    def _resolve_client(self) -> Self:
        if self.client is None and self.async_client is None:
            self.client = MemoryClient(self.config)
        elif self.config is not None:
            raise ValueError("pass either client/async_client or config, not both")
        return self

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        if self.client is None:
            raise ValueError("this InferScaleRetriever has only an async_client: call it with ainvoke")
        found = self.client.search(query, **self._search_args(kwargs))
        return _documents(found["results"])

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        if self.async_client is None:
            return await super()._aget_relevant_documents(query, run_manager=run_manager, **kwargs)
        found = await self.async_client.search(query, **self._search_args(kwargs))
        return _documents(found["results"])

    def _search_args(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(kwargs) - _CALL_KWARGS)
        if unknown:
            raise TypeError(f"InferScaleRetriever got unexpected arguments {unknown}; it takes {sorted(_CALL_KWARGS)}")
        return {
            "user_id": kwargs.get("user_id", self.user_id),
            "agent_id": kwargs.get("agent_id", self.agent_id),
            "run_id": kwargs.get("memory_run_id", self.run_id),
            "filters": kwargs.get("filters", self.filters),
            "limit": kwargs.get("k", self.k),
            "threshold": kwargs.get("threshold", self.threshold),
        }


def _documents(results: list[dict[str, Any]]) -> list[Document]:
    return [
        Document(
            id=r["id"],
            page_content=r["memory"],
            metadata={
                "id": r["id"],
                "score": r["score"],
                "user_id": r.get("user_id"),
                "agent_id": r.get("agent_id"),
                "run_id": r.get("run_id"),
                "metadata": r.get("metadata") or {},
                **{key: r[key] for key in ("role", "actor_id") if key in r},  # a verbatim memory's speaker
            },
        )
        for r in results
    ]
