"""InferScaleLLM without a model: memory_ids merging, metadata that loads nothing, streams closed when the consumer
stops early (sync, thread and async-client paths)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.callbacks.token_counting import get_tokens_from_response
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.constants import DEFAULT_CONTEXT_WINDOW
from llama_index.memory.inferscale import MEMORY_IDS_KEY, InferScaleKVMemoryBlock, InferScaleLLM, simple_chat_engine
from llama_index.memory.inferscale.llm import _chat_response

from inferscale import AsyncMemoryClient, ChatChunk, ChatResult, MemoryClient, ScopeError, Timings
from tests.unit_tests.stubs import HITS, StubClient

QUESTION = ChatMessage(role="user", content="What is my dog called?")


def tagged(*ids: str) -> ChatMessage:
    return ChatMessage(role="system", content="- memories", additional_kwargs={MEMORY_IDS_KEY: list(ids)})


def test_explicit_memory_ids_join_the_tagged_ones_in_order_without_repeats() -> None:
    llm = InferScaleLLM(StubClient(), user_id="alice")
    request = llm._chat_kwargs([tagged("a", "b"), QUESTION], {"memory_ids": ["b", "c"]})
    assert request["memory_ids"] == ["a", "b", "c"]
    assert all("memories" not in m["content"] for m in request["messages"])
    assert llm._chat_kwargs([tagged("a"), QUESTION], {})["memory_ids"] == ["a"]
    assert llm._chat_kwargs([QUESTION], {"memory_ids": ["c"]})["memory_ids"] == ["c"]
    assert llm._chat_kwargs([tagged("a"), QUESTION], {"memory_ids": []})["memory_ids"] == ["a"]
    assert "memory_ids" not in llm._chat_kwargs([QUESTION], {})
    chooser = InferScaleLLM(StubClient(), user_id="a", auto_retrieve=False)
    assert chooser._chat_kwargs([QUESTION], {})["memory_ids"] == []


def test_metadata_and_a_chat_engine_with_a_system_prompt_load_no_model() -> None:
    llm = InferScaleLLM(StubClient(), user_id="alice")  # the stub fails when context_window is read
    assert llm.metadata.context_window == DEFAULT_CONTEXT_WINDOW and llm.metadata.model_name == "stub-model"
    SimpleChatEngine.from_defaults(llm=llm, system_prompt="Answer briefly.")
    assert InferScaleLLM(StubClient(), user_id="alice", context_window=8192).metadata.context_window == 8192


def test_breaking_out_of_a_sync_stream_closes_the_client_stream() -> None:
    client = StubClient()
    llm = InferScaleLLM(client, user_id="alice", context_window=8192)
    for response in llm.stream_chat([QUESTION]):
        assert response.delta == "t0 "
        break
    assert client.closed == [True]
    completions = llm.stream_complete("hi")
    next(completions)
    completions.close()
    assert client.closed == [True, True]


async def closed_soon(is_closed: Callable[[], bool]) -> bool:
    """Whether ``is_closed()`` turns true within a second: LlamaIndex's callback wrapper around ``astream_chat``
    drops our generator without ``aclose``, so the event loop's async-generator finalizer closes it in a task."""
    for _ in range(100):
        if is_closed():
            return True
        await asyncio.sleep(0.01)
    return False


def test_stopping_an_async_stream_on_a_thread_closes_the_client_stream() -> None:
    client = StubClient()
    llm = InferScaleLLM(client, user_id="alice", context_window=8192)

    async def run() -> None:
        responses = await llm.astream_chat([QUESTION])
        async for _ in responses:
            break
        await responses.aclose()
        assert await closed_soon(lambda: client.closed == [True])
        completions = await llm.astream_complete("hi")
        await anext(completions)
        await completions.aclose()
        assert await closed_soon(lambda: client.closed == [True, True])

    asyncio.run(run())


class StubAsyncClient:
    """``await chat(stream=True)`` gives an async generator that records whether it was closed."""

    def __init__(self) -> None:
        self.closed = False
        self.streams: list[AsyncIterator[ChatChunk]] = []

    async def chat(self, **kwargs: Any) -> AsyncIterator[ChatChunk]:
        async def chunks() -> AsyncIterator[ChatChunk]:
            try:
                for i in range(50):
                    yield ChatChunk(delta=f"t{i} ")
            finally:
                self.closed = True

        self.streams.append(chunks())
        return self.streams[-1]


def test_stopping_an_async_client_stream_closes_it() -> None:
    async_client = StubAsyncClient()
    llm = InferScaleLLM(StubClient(), async_client=async_client, user_id="alice", context_window=8192)

    async def run() -> None:
        responses = await llm.astream_chat([QUESTION])
        async for _ in responses:
            break
        await responses.aclose()
        assert await closed_soon(lambda: async_client.closed)  # before asyncio.run's shutdown closes it

    asyncio.run(run())


def test_a_remote_client_is_refused_with_the_way_to_use_a_server() -> None:
    """A tester's report: ``InferScaleLLM(MemoryClient(host=...))`` failed on first use with an AttributeError."""
    remote = MemoryClient(host="http://127.0.0.1:9", api_key="isk_0123456789ab_s")
    with pytest.raises(TypeError, match=r"needs a local inferscale client as client, got a RemoteMemoryClient"):
        InferScaleLLM(remote, user_id="alice")
    aremote = AsyncMemoryClient(host="http://127.0.0.1:9", api_key="isk_0123456789ab_s")  # a review's find
    with pytest.raises(TypeError, match=r"as async_client, got a AsyncRemoteMemoryClient"):
        InferScaleLLM(StubClient(), async_client=aremote, user_id="alice")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="use InferScaleMemory"):
        simple_chat_engine(remote, user_id="alice")


def test_the_scope_is_read_from_the_fields_on_every_call() -> None:
    """The scope was fixed at construction: a copy made for Bob, or ``llm.user_id = "bob"``, used Maya's memories."""
    llm = InferScaleLLM(StubClient(), user_id="maya")
    bob = llm.model_copy(update={"user_id": "bob"})
    assert bob._chat_kwargs([QUESTION], {})["user_id"] == "bob"
    assert llm._chat_kwargs([QUESTION], {})["user_id"] == "maya"
    llm.user_id = "erin"
    assert llm._chat_kwargs([QUESTION], {})["user_id"] == "erin"
    with pytest.raises(ScopeError):
        llm.model_copy(update={"user_id": None})._chat_kwargs([QUESTION], {})
    client = StubClient(hits=HITS)
    block = InferScaleKVMemoryBlock(client, user_id="maya").model_copy(update={"user_id": "bob"})
    asyncio.run(block._hits([QUESTION]))
    assert [(name, call["user_id"]) for name, call in client.calls] == [("search", "bob")]


def test_token_counting_reads_the_usage_in_raw() -> None:
    """LlamaIndex's TokenCountingHandler read ``raw`` as a dict: the ChatResult there raised TypeError on every
    call."""
    timings = Timings(retrieval_ms=1.0, kv_assembly_ms=1.0, prefill_ms=1.0, ttft_ms=3.0, total_ms=4.0)
    result = ChatResult("Biscuit.", ["m1"], ["My dog is Biscuit."], "kv", timings, 10, 6, 2)
    response = _chat_response("Biscuit.", None, result)
    assert get_tokens_from_response(response) == (10, 2)
    assert response.raw is not None and response.raw["result"] is result
    assert _chat_response("Bis", "Bis", None).raw is None  # a stream's chunks before the last carry none
