from __future__ import annotations

import tempfile
from typing import Any

import pytest
from langchain_inferscale import InferScaleRetriever, memory_tools
from langchain_inferscale.chat_models import ChatInferScale

_CONFIG = {"data_dir": tempfile.mkdtemp(prefix="langchain-inferscale-unit-"), "engine": {"dtype": "float32"}}


def test_retriever_search_args() -> None:
    retriever = InferScaleRetriever(config=_CONFIG, user_id="maya", k=2, filters={"category": "pets"})
    assert retriever._search_args({}) == {
        "user_id": "maya",
        "agent_id": None,
        "run_id": None,
        "filters": {"category": "pets"},
        "limit": 2,
        "threshold": None,
    }
    args = retriever._search_args({"k": 5, "user_id": "bob", "memory_run_id": "r"})
    assert (args["limit"], args["user_id"], args["run_id"]) == (5, "bob", "r")
    with pytest.raises(TypeError, match="top_k"):
        retriever._search_args({"top_k": 1})


def test_tools_have_mem0_names_and_arguments() -> None:
    client = ChatInferScale(config=_CONFIG).client
    assert client is not None
    tools = {tool.name: tool for tool in memory_tools(client, user_id="alex")}
    assert list(tools) == ["add_memory", "search_memory", "get_all_memory"]
    assert set(tools["add_memory"].args) == {"messages", "user_id", "output_format", "metadata"}
    assert set(tools["search_memory"].args) == {"query", "filters"}
    assert set(tools["get_all_memory"].args) == {"version", "filters", "page", "page_size"}
    assert all(tool.coroutine is None for tool in tools.values())  # no async_client: LangChain's executor


class RecordingClient:
    """Records each call's method and keyword arguments; answers an empty result."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def _record(self, method: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        self.calls.append((method, kwargs))
        return {"results": []}

    def add(self, messages: Any, **kwargs: Any) -> dict[str, Any]:
        return self._record("add", {"messages": messages, **kwargs})

    def search(self, query: str, **kwargs: Any) -> dict[str, Any]:
        return self._record("search", {"query": query, **kwargs})

    def get_all(self, **kwargs: Any) -> dict[str, Any]:
        return self._record("get_all", kwargs)


class AsyncRecordingClient(RecordingClient):
    async def add(self, messages: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        return self._record("add", {"messages": messages, **kwargs})

    async def search(self, query: str, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        return self._record("search", {"query": query, **kwargs})

    async def get_all(self, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        return self._record("get_all", kwargs)


_ADD = {"messages": [{"role": "user", "content": "I like tea."}], "output_format": "v1.1", "metadata": {"k": 1}}
_GET_ALL = {"version": "v2", "filters": {"category": "drinks"}, "page": 2, "page_size": 3}
_EXPECTED = [
    (
        "add",
        {
            "messages": [{"role": "user", "content": "I like tea."}],
            "user_id": "alex",
            "agent_id": None,
            "run_id": None,
            "metadata": {"k": 1},
            "infer": False,
            "output_format": "v1.1",
        },
    ),
    (
        "get_all",
        {
            "user_id": "alex",
            "agent_id": None,
            "run_id": None,
            "filters": {"category": "drinks"},
            "limit": 6,
            "version": "v2",
        },
    ),
]


def test_tools_pass_output_format_and_version_through() -> None:
    client = RecordingClient()
    add_memory, _, get_all_memory = memory_tools(client, user_id="alex", infer=False)  # type: ignore[arg-type]
    add_memory.invoke(_ADD)
    assert get_all_memory.invoke(_GET_ALL) == {"page": 2, "page_size": 3, "results": []}
    assert client.calls == _EXPECTED


async def test_tools_run_on_the_async_client() -> None:
    client, async_client = RecordingClient(), AsyncRecordingClient()
    tools = memory_tools(client, async_client=async_client, user_id="alex", infer=False)  # type: ignore[arg-type]
    add_memory, search_memory, get_all_memory = tools
    await add_memory.ainvoke(_ADD)
    await get_all_memory.ainvoke(_GET_ALL)
    await search_memory.ainvoke({"query": "tea"})
    assert client.calls == []
    assert async_client.calls == [
        *_EXPECTED,
        ("search", {"query": "tea", "user_id": "alex", "agent_id": None, "run_id": None, "filters": None}),
    ]


def test_the_retriever_takes_a_servers_client() -> None:
    """A tester's report: ``InferScaleRetriever(client=MemoryClient(host=...))`` was a pydantic ValidationError."""
    from inferscale import AsyncMemoryClient, MemoryClient
    from inferscale.remote import AsyncRemoteMemoryClient, RemoteMemoryClient

    remote = MemoryClient(host="http://127.0.0.1:9", api_key="isk_0123456789ab_s")
    aremote = AsyncMemoryClient(host="http://127.0.0.1:9", api_key="isk_0123456789ab_s")
    retriever = InferScaleRetriever(client=remote, async_client=aremote, user_id="maya")
    assert isinstance(retriever.client, RemoteMemoryClient)
    assert isinstance(retriever.async_client, AsyncRemoteMemoryClient)
