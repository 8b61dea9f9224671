"""Two users never see each other's memories, through any class of the package."""

from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage
from langchain_inferscale import ChatInferScale, InferScaleRetriever, memory_system_message, memory_tools

from inferscale import InvalidInputError, MemoryNotFoundError
from inferscale.client import MemoryClient
from tests.integration_tests.shared import MAX_TOKENS, shared_async_client


@pytest.fixture(scope="module")
def memories(client: MemoryClient) -> dict[str, dict[str, str]]:
    out = {}
    for user, fact in (("iso-alice", "My dog is called Biscuit."), ("iso-bob", "My dog is called Rex.")):
        added = client.add([{"role": "user", "content": fact}], user_id=user, infer=False)
        out[user] = {r["id"]: r["memory"] for r in added["results"]}
    return out


def test_chat_model_retrieves_only_its_users_memories(client: MemoryClient, memories: dict) -> None:
    for user in ("iso-alice", "iso-bob"):
        answer = ChatInferScale(client=client, user_id=user, max_tokens=MAX_TOKENS).invoke("What is my dog called?")
        assert set(answer.response_metadata["memory_ids"]) == set(memories[user])


def test_chat_model_refuses_another_users_ids(client: MemoryClient, memories: dict) -> None:
    model = ChatInferScale(client=client, user_id="iso-alice", max_tokens=MAX_TOKENS)
    [bob_id] = memories["iso-bob"]
    with pytest.raises(MemoryNotFoundError):
        model.invoke("What is my dog called?", memory_ids=[bob_id])
    with pytest.raises(MemoryNotFoundError):
        model.invoke([memory_system_message([(bob_id, "My dog is called Rex.")]), HumanMessage("Dog?")])


async def test_async_chat_model_isolation(client: MemoryClient, memories: dict) -> None:
    model = ChatInferScale(client=client, async_client=shared_async_client(), user_id="iso-bob", max_tokens=MAX_TOKENS)
    answer = await model.ainvoke("What is my dog called?")
    assert set(answer.response_metadata["memory_ids"]) == set(memories["iso-bob"])


async def test_retriever_returns_only_its_users_memories(client: MemoryClient, memories: dict) -> None:
    for user in ("iso-alice", "iso-bob"):
        retriever = InferScaleRetriever(client=client, async_client=shared_async_client(), user_id=user, k=10)
        for docs in (retriever.invoke("dog"), await retriever.ainvoke("dog")):
            assert {d.id for d in docs} == set(memories[user])
            assert all(d.metadata["user_id"] == user and d.metadata["id"] == d.id for d in docs)
            assert all(isinstance(d.metadata["score"], float) for d in docs)
            assert all(d.metadata["role"] == "user" and "role" not in d.metadata["metadata"] for d in docs)


def test_bound_tools_stay_in_their_scope(client: MemoryClient, memories: dict) -> None:
    add, search, get_all = memory_tools(client, user_id="iso-alice", infer=False)
    found = search.invoke({"query": "dog"})
    assert {r["id"] for r in found["results"]} == set(memories["iso-alice"])
    assert {r["id"] for r in get_all.invoke({})["results"]} == set(memories["iso-alice"])
    with pytest.raises(InvalidInputError):
        search.invoke({"query": "dog", "filters": {"user_id": "iso-bob"}})
    with pytest.raises(InvalidInputError):
        add.invoke({"messages": [{"role": "user", "content": "x"}], "user_id": "iso-bob"})


def test_unbound_tools_take_mem0_recipe_arguments(client: MemoryClient) -> None:
    add, search, get_all = memory_tools(client, infer=False)
    added = add.invoke(
        {
            "messages": [{"role": "user", "content": "I am allergic to nuts."}],
            "user_id": "iso-carol",
            "metadata": {"food": "vegan"},
        }
    )
    [memory] = added["results"]
    found = search.invoke({"query": "allergies", "filters": {"AND": [{"user_id": "iso-carol"}]}})
    assert [r["id"] for r in found["results"]] == [memory["id"]]
    page = get_all.invoke({"filters": {"user_id": "iso-carol"}, "page": 1, "page_size": 50})
    assert [r["metadata"]["food"] for r in page["results"]] == ["vegan"]
    assert get_all.invoke({"filters": {"user_id": "iso-carol"}, "page": 2, "page_size": 50})["results"] == []
