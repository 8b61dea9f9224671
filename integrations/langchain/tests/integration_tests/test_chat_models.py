"""ChatInferScale on the embedded model, beyond the standard suite: greetings, memory metadata, streaming usage."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, trim_messages
from langchain_inferscale import ChatInferScale

from inferscale.client import MemoryClient
from inferscale.errors import InvalidInputError
from tests.integration_tests.shared import MAX_TOKENS, STANDARD_MEMORIES, STANDARD_USER


@pytest.mark.parametrize("greeting", ["Hello", "Hi", "Hey"])
def test_a_greeting_never_gets_an_empty_answer(client: MemoryClient, greeting: str) -> None:
    # the tightest budget: one token must already be text (whitespace is stripped from answers)
    model = ChatInferScale(client=client, user_id=STANDARD_USER, max_tokens=1)
    assert model.invoke(greeting).text.strip()
    assert "".join(chunk.text for chunk in model.stream(greeting)).strip()


def test_memories_are_reported_and_the_last_chunk_carries_usage(client: MemoryClient) -> None:
    model = ChatInferScale(client=client, user_id=STANDARD_USER, max_tokens=MAX_TOKENS, limit=2)
    chunks = list(model.stream("What is my dog called?"))
    assert [c.chunk_position for c in chunks].count("last") == 1 and chunks[-1].chunk_position == "last"
    assert all(c.usage_metadata is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.usage_metadata is not None and last.usage_metadata["input_token_details"]["cache_read"] > 0
    ids = last.response_metadata["memory_ids"]
    assert len(ids) == 2 and client.get(ids[0])["memory"] == STANDARD_MEMORIES[0]
    invoked = model.invoke("What is my dog called?")
    assert invoked.text == "".join(c.text for c in chunks)  # streaming and invoke give the same greedy answer
    assert invoked.response_metadata["finish_reason"] in ("stop", "length")


def test_prompt_mode_prefills_the_same_tokens(client: MemoryClient) -> None:
    kv = ChatInferScale(client=client, user_id=STANDARD_USER, max_tokens=1).invoke("What is my dog called?")
    prompt = ChatInferScale(client=client, user_id=STANDARD_USER, max_tokens=1, mode="prompt").invoke(
        "What is my dog called?"
    )
    assert prompt.response_metadata["memory_ids"] == kv.response_metadata["memory_ids"]
    assert prompt.usage_metadata["input_tokens"] == kv.usage_metadata["input_tokens"]
    assert "input_token_details" not in prompt.usage_metadata


def test_streaming_flag_answers_invoke_through_the_stream(client: MemoryClient) -> None:
    streamed = ChatInferScale(client=client, user_id=STANDARD_USER, max_tokens=2, streaming=True).invoke("Hello")
    plain = ChatInferScale(client=client, user_id=STANDARD_USER, max_tokens=2).invoke("Hello")
    assert streamed.text == plain.text
    assert streamed.usage_metadata == plain.usage_metadata
    assert streamed.response_metadata["memory_ids"] == plain.response_metadata["memory_ids"]


def test_timeout_is_checked_between_tokens(client: MemoryClient) -> None:
    model = ChatInferScale(client=client, user_id=STANDARD_USER, max_tokens=4, timeout=1e-6)
    with pytest.raises(TimeoutError, match="timeout"):
        model.invoke("Hello")


def test_tokens_are_counted_with_the_served_models_tokenizer(client: MemoryClient) -> None:
    """langchain-core's default tokenizer (GPT-2's, from the Hub) counted 0 tokens offline: trim_messages never
    trimmed."""
    model = ChatInferScale(client=client, user_id=STANDARD_USER)
    text = "What is my dog called?"
    want = client.engine.tokenizer.encode(text, add_special_tokens=False)
    assert model.get_token_ids(text) == want and len(want) > 0
    assert model.get_num_tokens(text) == len(want)
    long_turns = [HumanMessage("I like tea. " * 40), AIMessage("Noted. " * 40), HumanMessage("What do I like?")]
    kept = trim_messages(long_turns, max_tokens=20, token_counter=model, strategy="last")
    assert [m.text for m in kept] == ["What do I like?"]


def test_an_earlier_empty_question_in_a_checkpointed_thread_does_not_fail_later_turns(client: MemoryClient) -> None:
    """LangGraph checkpoints a thread's input even when the model node fails: after one empty question was refused,
    every later turn of the thread sent it again and was refused too (a review's find). Only the last user message
    must have text."""
    model = ChatInferScale(client=client, user_id=STANDARD_USER, max_tokens=MAX_TOKENS)
    with pytest.raises(InvalidInputError, match="user message with no text"):
        model.invoke([HumanMessage("What is my dog called?"), AIMessage("Biscuit."), HumanMessage("")])
    later = model.invoke(
        [
            HumanMessage("What is my dog called?"),
            AIMessage("Biscuit."),
            HumanMessage(""),
            HumanMessage("And where do I live?"),
        ]
    )
    assert later.text.strip()
