"""On the embedded model: a stream the consumer leaves early is closed (and the next chat works); the memory's
pass-throughs stay in its context; the async path runs on an AsyncMemoryClient, never the sync client."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.memory import Memory
from llama_index.memory.inferscale import (
    MEMORY_IDS_KEY,
    InferScaleKVMemoryBlock,
    InferScaleLLM,
    InferScaleMemory,
    InferScaleMemoryBlock,
)

from inferscale import AsyncMemoryClient, InvalidInputError, MemoryClient
from tests.integration_tests.shared import MAX_NEW_TOKENS

QUESTION = ChatMessage(role="user", content="What is my dog called?")


def test_leaving_a_stream_early_closes_it_and_the_next_chat_works(
    client: MemoryClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    streams: list[Iterator[Any]] = []
    chat = client.chat

    def recording_chat(**kwargs: Any) -> Any:
        out = chat(**kwargs)
        if kwargs.get("stream"):
            streams.append(out)
        return out

    monkeypatch.setattr(client, "chat", recording_chat)
    llm = InferScaleLLM(client, user_id="alice", max_new_tokens=MAX_NEW_TOKENS)
    responses = llm.stream_chat([QUESTION])
    assert next(responses).delta
    responses.close()
    assert streams[0].gi_frame is None  # the client's generator is closed: its request and cache are released
    assert llm.chat([QUESTION]).message.content
    assert llm.metadata.context_window == client.context_window  # read once the call had loaded the model


def test_the_memorys_search_and_add_stay_in_its_context(client: MemoryClient, memory_ids: dict[str, set[str]]) -> None:
    memory = InferScaleMemory.from_client(context={"user_id": "alice"}, client=client)
    found = {h["id"] for h in memory.search("Where do I live?", limit=10)["results"]}
    assert found and not found & memory_ids["bob"]
    with pytest.raises(InvalidInputError, match="outside this memory's context"):
        memory.search("Where do I live?", user_id="bob")


class UnusedClient:
    """A sync client the async path must not touch."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the sync client was used: {name}")


def test_the_async_path_runs_on_an_async_memory_client(client: MemoryClient) -> None:
    async_client = AsyncMemoryClient(client.config, engine=client.engine, embedder=client.embedder)
    sync = UnusedClient()

    async def run() -> None:
        memory = InferScaleMemory.from_client(context={"user_id": "frank"}, client=sync, async_client=async_client)  # type: ignore[arg-type]
        await memory.aput(ChatMessage(role="user", content="My sister is called Ines."))
        stored = (await async_client.get_all(user_id="frank"))["results"]
        assert [m["memory"] for m in stored] == ["My sister is called Ines."]
        later = InferScaleMemory.from_client(context={"user_id": "frank"}, client=sync, async_client=async_client)  # type: ignore[arg-type]
        await later.aput(ChatMessage(role="user", content="What is my sister called?"))  # a new session
        first = (await later.aget())[0]
        assert stored[0]["id"] in first.additional_kwargs[MEMORY_IDS_KEY]

        kv_block = InferScaleKVMemoryBlock(sync, async_client=async_client, user_id="frank")  # type: ignore[arg-type]
        text_block = InferScaleMemoryBlock(sync, async_client=async_client, user_id="frank")  # type: ignore[arg-type]
        messages = [ChatMessage(role="user", content="What is my sister called?")]
        (tagged,) = await kv_block.aget(messages)
        assert stored[0]["id"] in tagged.additional_kwargs[MEMORY_IDS_KEY]
        assert "Ines" in await text_block.aget(messages)
        await kv_block.aput([ChatMessage(role="user", content="I collect stamps.")])
        block_memory = Memory.from_defaults(token_limit=2000, memory_blocks=[kv_block])
        await block_memory.aput(messages[0])
        assert any(MEMORY_IDS_KEY in m.additional_kwargs for m in await block_memory.aget())

        llm = InferScaleLLM(client, async_client=async_client, user_id="frank", max_new_tokens=MAX_NEW_TOKENS)
        responses = await llm.astream_chat([tagged, messages[0]])
        async for _ in responses:
            break
        await responses.aclose()
        answer = await llm.achat([tagged, messages[0]])
        assert answer.raw["result"].memory_ids == tagged.additional_kwargs[MEMORY_IDS_KEY]

    asyncio.run(run())
    assert any(m["memory"] == "I collect stamps." for m in client.get_all(user_id="frank")["results"])
    asyncio.run(async_client.close())
