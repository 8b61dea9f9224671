"""Turns a chat engine sends that cannot be memories, or that are memories already (a new user's finds, each with the
input that failed): the turn goes on, and nothing is recalled twice."""

from __future__ import annotations

import logging
from uuid import uuid4

import pytest
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms import MockLLM
from llama_index.memory.inferscale import InferScaleMemory, simple_chat_engine

from inferscale import AsyncMemoryClient, InvalidInputError, MemoryClient
from tests.integration_tests.shared import MAX_NEW_TOKENS

LONG_MESSAGE = "Please summarise this report. " + "The quarterly figures rose. " * 150  # 4,230 characters
"""Longer than a memory holds (``max_memory_chars=4,000``), well within the model's context."""


def _user() -> str:
    return f"turns-{uuid4().hex}"


@pytest.mark.parametrize("path", ["sync", "async", "async-client"])
async def test_a_message_longer_than_a_memory_joins_the_history_and_the_chat_goes_on(
    client: MemoryClient, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    """``put`` raised InvalidInputError from ``client.add`` for a 4,228-character message, so SimpleChatEngine failed
    on it before the LLM was called."""
    user = _user()
    async_client = None
    if path == "async-client":
        async_client = AsyncMemoryClient(client.config, engine=client.engine, embedder=client.embedder)
    memory = InferScaleMemory.from_client(context={"user_id": user}, client=client, async_client=async_client)
    engine = SimpleChatEngine.from_defaults(llm=MockLLM(max_tokens=4), memory=memory)
    with caplog.at_level(logging.WARNING, logger="llama_index.memory.inferscale.base"):
        answer = engine.chat(LONG_MESSAGE) if path == "sync" else await engine.achat(LONG_MESSAGE)
    assert answer.response
    assert [m.content for m in memory.get_all()] == [LONG_MESSAGE, answer.response]
    stored = [m["memory"] for m in client.get_all(user_id=user)["results"]]
    assert stored == [answer.response]
    [warning] = [r.getMessage() for r in caplog.records if "not stored as a memory" in r.getMessage()]
    assert f"{len(LONG_MESSAGE):,} characters" in warning and "max_memory_chars" in warning


def test_a_message_already_stored_is_not_recalled_beside_itself(client: MemoryClient) -> None:
    """The same question in a second session was recalled as a memory next to itself: ``add`` keeps one memory per
    text and returns no id for a repeat, so the window's ids did not name it."""
    user = _user()
    client.add("My beagle is called Biscuit.", user_id=user, infer=False)
    question = ChatMessage(role="user", content="What is my dog called?")
    recalled = []
    for _ in range(2):  # two sessions
        memory = InferScaleMemory.from_client(context={"user_id": user}, client=client)
        memory.put(question)
        first, *window = memory.get()
        recalled.append(first.content.splitlines()[1:])
        assert window == [question]
    assert recalled == [["- My beagle is called Biscuit."]] * 2


def test_an_empty_question_fails_alone_and_the_next_turns_are_answered(client: MemoryClient) -> None:
    """SimpleChatEngine keeps a user message in its history when the LLM refuses it: one empty question made every
    later turn fail with 'messages[2] is a user message with no text'."""
    user = _user()
    client.add("My dog is a beagle named Biscuit.", user_id=user, infer=False)
    engine = simple_chat_engine(client, user_id=user, max_new_tokens=MAX_NEW_TOKENS)
    assert engine.chat("What is my dog called?").response
    with pytest.raises(InvalidInputError, match="user message with no text"):
        engine.chat("")
    assert engine.chat("What is my dog called?").response
    assert engine.chat("Hello?").response
    assert [m.content for m in engine.chat_history if m.role.value == "user"] == [
        "What is my dog called?",
        "",
        "What is my dog called?",
        "Hello?",
    ]
