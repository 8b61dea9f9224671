"""A stand-in for ``MemoryClient`` that records its calls and loads nothing (the unit tests never load a model)."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from inferscale import ChatChunk


class StubClient:
    """``search`` returns the first ``limit`` of ``hits``; ``add`` stores nothing; ``chat(stream=True)`` yields
    ``n_chunks`` chunks and records in ``closed`` whether each stream was closed (it keeps each stream, as an engine
    keeps its request, so only an explicit ``close()`` ends one, not the garbage collector). Reading
    ``context_window`` fails (it would load the model)."""

    model_name = "stub-model"

    def __init__(self, hits: list[dict[str, Any]] | None = None, n_chunks: int = 50) -> None:
        self.hits = hits or []
        self.n_chunks = n_chunks
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.closed: list[bool] = []
        self.streams: list[Iterator[ChatChunk]] = []
        self.config = SimpleNamespace(engine=SimpleNamespace(max_new_tokens=32))

    @property
    def context_window(self) -> int:
        raise AssertionError("context_window loads the model")

    def search(self, query: str, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("search", {"query": query, **kwargs}))
        return {"results": self.hits[: kwargs.get("limit", len(self.hits))]}

    def add(self, messages: Any, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("add", {"messages": messages, **kwargs}))
        return {"results": []}

    def chat(self, **kwargs: Any) -> Iterator[ChatChunk]:
        self.calls.append(("chat", kwargs))
        assert kwargs.get("stream"), "the stub only streams"
        index = len(self.closed)
        self.closed.append(False)

        def chunks() -> Iterator[ChatChunk]:
            try:
                for i in range(self.n_chunks):
                    yield ChatChunk(delta=f"t{i} ")
            finally:
                self.closed[index] = True

        self.streams.append(chunks())
        return self.streams[-1]


HITS = [{"id": "m1", "memory": "My dog is a beagle named Biscuit.", "score": 0.9}]
