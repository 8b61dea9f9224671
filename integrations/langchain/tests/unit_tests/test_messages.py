from __future__ import annotations

import pytest
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    ChatMessage,
    HumanMessage,
    HumanMessageChunk,
    SystemMessage,
    ToolMessage,
)
from langchain_inferscale import MEMORY_BLOCK_ID, MEMORY_IDS_KEY, memory_system_message
from langchain_inferscale.messages import prepare, with_memory_block

from inferscale import InvalidInputError


def test_roles_are_converted() -> None:
    prepared = prepare(
        [
            SystemMessage("Be brief."),
            HumanMessage("hi", name="maya"),
            AIMessage("hello"),
            ChatMessage(role="user", content="how are you"),
        ]
    )
    assert prepared.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "how are you"},
    ]
    assert prepared.memory_ids is None


def test_a_reply_built_from_a_stream_is_an_assistant_turn() -> None:
    reply = AIMessageChunk(content="Your dog ") + AIMessageChunk(content="is Biscuit.")  # full += chunk
    prepared = prepare([HumanMessageChunk(content="dog?"), reply, HumanMessage("and my cat?")])
    assert prepared.messages == [
        {"role": "user", "content": "dog?"},
        {"role": "assistant", "content": "Your dog is Biscuit."},
        {"role": "user", "content": "and my cat?"},
    ]


def test_text_blocks_are_joined() -> None:
    message = HumanMessage(content=[{"type": "text", "text": "a"}, "b"])
    assert prepare([message]).messages == [{"role": "user", "content": "a\nb"}]


@pytest.mark.parametrize(
    "message",
    [
        ToolMessage("42", tool_call_id="call-1"),
        ChatMessage(role="tool", content="42"),
        AIMessage("", tool_calls=[{"name": "f", "args": {}, "id": "call-1"}]),
        HumanMessage(content=[{"type": "image", "url": "https://example.com/a.png"}]),
    ],
)
def test_unsupported_messages_fail_clearly(message: object) -> None:
    with pytest.raises(InvalidInputError, match="message 1"):
        prepare([HumanMessage("hi"), message])  # type: ignore[list-item]


def test_tagged_string_message_is_removed_and_its_ids_kept() -> None:
    memory = memory_system_message([("m1", "My dog is Biscuit."), ("m2", "I live in Lisbon.")])
    assert "Biscuit" in memory.text  # a non-InferScale model reads the text
    prepared = prepare([SystemMessage("Be brief."), memory, HumanMessage("dog?")])
    assert prepared.memory_ids == ["m1", "m2"]
    assert prepared.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "dog?"}]


def test_memory_block_is_removed_and_instructions_kept() -> None:
    system = with_memory_block(SystemMessage("Be brief."), [("m1", "My dog is Biscuit.")], "Memories:")
    assert system.additional_kwargs[MEMORY_IDS_KEY] == ["m1"]
    assert [b["id"] for b in system.content if isinstance(b, dict) and "id" in b] == [MEMORY_BLOCK_ID]
    assert "Biscuit" in system.text
    prepared = prepare([system, HumanMessage("dog?")])
    assert prepared.memory_ids == ["m1"]
    assert prepared.messages[0] == {"role": "system", "content": "Be brief."}
    assert "Biscuit" not in str(prepared.messages)


def test_repeated_ids_are_injected_once() -> None:
    first = memory_system_message([("m1", "a"), ("m2", "b")])
    second = memory_system_message([("m2", "b"), ("m3", "c")])
    assert prepare([first, second, HumanMessage("q")]).memory_ids == ["m1", "m2", "m3"]


def test_bad_tag_fails() -> None:
    message = SystemMessage("x", additional_kwargs={MEMORY_IDS_KEY: "m1"})
    with pytest.raises(InvalidInputError, match=MEMORY_IDS_KEY):
        prepare([message, HumanMessage("q")])
