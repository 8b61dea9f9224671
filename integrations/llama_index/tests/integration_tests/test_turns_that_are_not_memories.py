"""Turns a chat engine sends that cannot be memories, or that are memories already (a new user's finds, each with the
input that failed): the turn goes on, and nothing is recalled twice."""

from __future__ import annotations

import logging
from uuid import uuid4

import pytest
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms import MockLLM
from llama_index.core.memory import Memory
from llama_index.memory.inferscale import (
    InferScaleKVMemoryBlock,
    InferScaleMemory,
    InferScaleMemoryBlock,
    simple_chat_engine,
)

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
    """``put`` raised InvalidInputError from ``client.add`` for a message over 4,000 characters, so SimpleChatEngine
    failed on it before the LLM was called."""
    user = _user()
    async_client = None
    if path == "async-client":
        async_client = AsyncMemoryClient(client.config, engine=client.engine, embedder=client.embedder)
    memory = InferScaleMemory.from_client(context={"user_id": user}, client=client, async_client=async_client)
    engine = SimpleChatEngine.from_defaults(llm=MockLLM(max_tokens=4), memory=memory)
    with caplog.at_level(logging.WARNING, logger="inferscale.write_back"):
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


def test_a_memory_block_flush_holding_a_message_longer_than_a_memory_stores_the_others(
    client: MemoryClient, caplog: pytest.LogCaptureFixture
) -> None:
    """A review's find: LlamaIndex's Memory flushes old messages to its blocks in one batch, and the block's ``add``
    of a batch holding a 4,811-character message raised from a later turn's ``put``, storing none of the batch."""
    user = _user()
    block = InferScaleMemoryBlock(client, user_id=user)
    memory = Memory.from_defaults(
        token_limit=60, chat_history_token_ratio=0.5, token_flush_size=20, memory_blocks=[block]
    )
    turns = [
        ("user", "My dog is called Biscuit."),
        ("assistant", "Nice."),
        ("user", "Summarise: " + "lorem ipsum " * 400),
    ]
    turns += [("assistant", "Here is my answer.")]
    turns += [(role, f"{role} turn {i} about the weather.") for i in range(4) for role in ("user", "assistant")]
    with caplog.at_level(logging.WARNING, logger="inferscale.write_back"):
        for role, text in turns:
            memory.put(ChatMessage(role=role, content=text))
    stored = {m["memory"] for m in client.get_all(user_id=user)["results"]}
    assert {"My dog is called Biscuit.", "Nice.", "Here is my answer."} <= stored
    assert not any(text.startswith("Summarise:") for text in stored)
    [warning] = [r.getMessage() for r in caplog.records if "not stored as a memory" in r.getMessage()]
    assert "a user message (4,811 characters)" in warning


@pytest.mark.parametrize("kind", ["text", "kv"])
async def test_a_block_leaves_out_memories_that_repeat_a_message_in_view(client: MemoryClient, kind: str) -> None:
    """A question stored by earlier sessions (three copies, under three run ids) ranked first for that question and
    took the block's slots, so the model was shown its own question instead of the fact (stop 55 left this open:
    the chat and ``InferScaleMemory`` already left such memories out)."""
    user = _user()
    question = "Which city did I move to?"
    for run in ("r1", "r2", "r3"):
        client.add(question, user_id=user, run_id=run, infer=False)
    client.add("I moved to Porto last month.", user_id=user, infer=False)
    block_type = InferScaleMemoryBlock if kind == "text" else InferScaleKVMemoryBlock
    block = block_type(client, user_id=user, similarity_top_k=2)
    got = await block.aget(messages=[ChatMessage(role="user", content=question)])
    text = got if isinstance(got, str) else "\n".join(m.content or "" for m in got)
    assert "Porto" in text and question not in text
    plain = await block.aget(messages=[ChatMessage(role="user", content="Tell me where I live now.")])
    plain_text = plain if isinstance(plain, str) else "\n".join(m.content or "" for m in plain)
    assert question in plain_text  # only a repeat of a message in view is left out
