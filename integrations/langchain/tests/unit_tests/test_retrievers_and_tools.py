from __future__ import annotations

import tempfile

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
    assert set(tools["add_memory"].args) == {"messages", "user_id", "metadata"}
    assert set(tools["search_memory"].args) == {"query", "filters"}
    assert set(tools["get_all_memory"].args) == {"filters", "page", "page_size"}
