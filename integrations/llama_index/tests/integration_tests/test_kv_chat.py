"""SimpleChatEngine with InferScaleLLM + InferScaleMemory on the embedded model: the memory ids reach the LLM and
are injected as K/V, no memory text is prefilled; the token_limit=50 case; async and streaming paths."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.bridge.pydantic import Field
from llama_index.core.callbacks import CallbackManager, TokenCountingHandler
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.instrumentation.events.llm import LLMChatEndEvent, LLMChatStartEvent
from llama_index.memory.inferscale import (
    MEMORY_IDS_KEY,
    InferScaleLLM,
    InferScaleMemory,
    simple_chat_engine,
    split_memory,
)

import inferscale
from inferscale import ChatResult, MemoryClient
from tests.integration_tests.shared import MAX_NEW_TOKENS


class Recorder(BaseEventHandler):
    """Keeps LLM chat events: the messages the LLM received and its responses."""

    events: list[BaseEvent] = Field(default_factory=list)

    @classmethod
    def class_name(cls) -> str:
        return "Recorder"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        if isinstance(event, (LLMChatStartEvent, LLMChatEndEvent)):
            self.events.append(event)

    def calls(self) -> list[tuple[list[ChatMessage], ChatResult]]:
        starts = [e.messages for e in self.events if isinstance(e, LLMChatStartEvent)]
        ends = [
            e.response.raw["result"] for e in self.events if isinstance(e, LLMChatEndEvent) and e.response is not None
        ]
        return list(zip(starts, ends, strict=True))


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    dispatcher = get_dispatcher()
    recorder = Recorder(events=[])
    dispatcher.add_event_handler(recorder)
    yield recorder
    dispatcher.event_handlers.remove(recorder)


def prefilled_conversation_ids(client: MemoryClient, messages: list[ChatMessage]) -> list[int]:
    conversation, _ = split_memory(messages)
    return client.engine.conversation_token_ids([inferscale.ChatMessage(m["role"], m["content"]) for m in conversation])


def contains(haystack: list[int], needle: list[int]) -> bool:
    return any(haystack[i : i + len(needle)] == needle for i in range(len(haystack) - len(needle) + 1))


def test_three_turns_inject_the_memory_ids_as_kv_and_prefill_no_memory_text(
    client: MemoryClient, memory_ids: dict[str, set[str]], recorder: Recorder
) -> None:
    engine = simple_chat_engine(client, user_id="alice", system_prompt="Answer briefly.", max_new_tokens=MAX_NEW_TOKENS)
    for question in ("What is my dog called?", "Where do I live?", "What breed is my dog?"):
        assert str(engine.chat(question))
    calls = recorder.calls()
    assert len(calls) == 3
    prefix = client.engine.system_prefix_ids()
    for messages, result in calls:
        tagged = [m for m in messages if MEMORY_IDS_KEY in m.additional_kwargs]
        assert len(tagged) == 1 and tagged[0].role == "system"
        assert result.mode == "kv"
        assert result.memory_ids == tagged[0].additional_kwargs[MEMORY_IDS_KEY]  # the memory's choice reached chat
        assert not set(result.memory_ids) & memory_ids["bob"]
        conversation_ids = prefilled_conversation_ids(client, messages)
        # the prompt is [prefix][memory K/V][conversation]: only the conversation was prefilled as text
        assert result.prompt_tokens == len(prefix) + result.memory_tokens + len(conversation_ids)
        conversation, _ = split_memory(messages)
        assert all(
            memory not in m["content"] for memory in result.memories for m in conversation if m["role"] != "assistant"
        )
        for memory in result.memories:
            assert not contains(conversation_ids, client.engine.fact_token_ids(memory)[:-1])
    first_ids = calls[0][1].memory_ids
    assert first_ids and set(first_ids) <= memory_ids["alice"]
    assert "Biscuit" in " ".join(calls[0][1].memories)


def test_token_limit_50_with_a_200_token_system_prompt_and_6_prior_turns(
    client: MemoryClient, recorder: Recorder
) -> None:
    system_prompt = " ".join(["Please answer kindly and briefly."] * 40)
    memory = InferScaleMemory.from_client(context={"user_id": "alice"}, client=client, token_limit=50)
    count = memory.tokenizer_fn
    assert 190 <= len(count(system_prompt)) <= 260
    turns = []
    for i in range(6):
        turns += [
            ChatMessage(role="user", content=f"Turn {i}: tell me something about the weather in Porto today."),
            ChatMessage(role="assistant", content=f"Answer {i}: it is sunny and warm in Porto this afternoon."),
        ]
    for history in (turns, [ChatMessage(role="system", content=system_prompt), *turns]):
        memory.reset()
        memory.set([*history, ChatMessage(role="user", content="What is my dog called?")])
        got = memory.get()
        assert MEMORY_IDS_KEY in got[0].additional_kwargs
        window = got[1:]
        assert sum(len(count(m.content or "")) for m in window) <= 50
        assert 0 < len(window) < len(history) and window[-1].content == "What is my dog called?"

    memory.reset()
    memory.set(turns)
    llm = InferScaleLLM(client, user_id="alice", max_new_tokens=MAX_NEW_TOKENS)
    engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory, system_prompt=system_prompt)
    assert str(engine.chat("What is my dog called?"))
    ((messages, result),) = recorder.calls()
    assert messages[0].content == system_prompt
    window = [m for m in messages[1:] if MEMORY_IDS_KEY not in m.additional_kwargs]
    assert sum(len(count(m.content or "")) for m in window) <= 50  # the prefix used the budget: only the question
    assert window[-1].content == "What is my dog called?"
    assert result.memory_ids  # the memories still come, as K/V


def test_stream_and_async_paths(client: MemoryClient) -> None:
    import asyncio

    llm = InferScaleLLM(client, user_id="alice", max_new_tokens=MAX_NEW_TOKENS)
    ids = sorted(m["id"] for m in client.search("dog", user_id="alice", limit=1)["results"])
    tagged = ChatMessage(
        role="system", content="- My dog is a beagle named Biscuit.", additional_kwargs={MEMORY_IDS_KEY: ids}
    )
    messages = [tagged, ChatMessage(role="user", content="What is my dog called?")]
    whole = llm.chat(messages)
    assert whole.raw["result"].memory_ids == ids
    streamed = list(llm.stream_chat(messages))
    assert streamed[-1].raw["result"].memory_ids == ids
    assert "".join(r.delta or "" for r in streamed) == streamed[-1].message.content == whole.message.content

    async def run() -> tuple[Any, list[Any]]:
        answer = await llm.achat(messages)
        chunks = [r async for r in await llm.astream_chat(messages)]
        return answer, chunks

    answer, chunks = asyncio.run(run())
    assert answer.message.content == whole.message.content and answer.raw["result"].memory_ids == ids
    assert chunks[-1].message.content == whole.message.content
    completion = llm.complete("What is my dog called?", memory_ids=ids)
    assert completion.raw["result"].memory_ids == ids and completion.text
    assert llm.metadata.model_name == client.model_name and llm.metadata.is_chat_model


def test_token_counting_handler_counts_the_reported_tokens(client: MemoryClient) -> None:
    """LlamaIndex's standard token counter raised TypeError on every call (it read the ChatResult in ``raw`` as a
    dict); it now counts what the client reports: the whole prompt, and the tokens decoded."""
    counter = TokenCountingHandler()
    llm = InferScaleLLM(
        client, user_id="alice", max_new_tokens=MAX_NEW_TOKENS, callback_manager=CallbackManager([counter])
    )
    whole = llm.chat([ChatMessage(role="user", content="What is my dog called?")])
    completion = llm.complete("Where do I live?")
    results = [whole.raw["result"], completion.raw["result"]]
    assert counter.prompt_llm_token_count == sum(r.prompt_tokens for r in results) > 0
    assert counter.completion_llm_token_count == sum(r.generated_tokens for r in results) > 0
