"""The tag contract, model-free: memory_message, memory_ids_of, split_memory (also on a real LlamaIndex Memory)."""

from __future__ import annotations

import pytest
from llama_index.core.base.llms.types import (
    CacheControl,
    CachePoint,
    ChatMessage,
    DocumentBlock,
    ImageBlock,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)
from llama_index.core.memory import Memory, StaticMemoryBlock
from llama_index.memory.inferscale import MEMORY_IDS_KEY, InferScaleKVMemoryBlock, split_memory
from llama_index.memory.inferscale._messages import MEMORY_INTRO, memory_ids_of, memory_message

from inferscale import InvalidInputError
from tests.unit_tests.stubs import HITS, StubClient


def test_memory_message_holds_the_memories_and_is_tagged_with_their_ids() -> None:
    hits = [{"id": "a", "memory": "one"}, {"id": "b", "memory": "two"}]
    message = memory_message(hits)
    assert message.role == "system" and message.content == f"{MEMORY_INTRO}\n- one\n- two"
    assert message.additional_kwargs == {MEMORY_IDS_KEY: ["a", "b"]}
    assert memory_ids_of(message) == ["a", "b"]
    assert memory_ids_of(ChatMessage(role="system", content="plain")) is None


@pytest.mark.parametrize("tag", ["a", [""], [1], {"a": 1}])
def test_a_bad_tag_is_refused(tag: object) -> None:
    with pytest.raises(InvalidInputError, match=MEMORY_IDS_KEY):
        memory_ids_of(ChatMessage(role="system", content="x", additional_kwargs={MEMORY_IDS_KEY: tag}))


def test_split_memory_drops_tagged_messages_and_merges_their_ids_in_order() -> None:
    messages = [
        ChatMessage(role="system", content="Be brief."),
        memory_message([{"id": "a", "memory": "one"}, {"id": "b", "memory": "two"}]),
        ChatMessage(role="user", content="hi"),
        ChatMessage(role="system", content="", additional_kwargs={MEMORY_IDS_KEY: ["b", "c"]}),
        ChatMessage(role="chatbot", content="hello"),
        ChatMessage(role="developer", content="dev"),
        ChatMessage(role="user", content="and?"),
    ]
    conversation, ids = split_memory(messages)
    assert ids == ["a", "b", "c"]
    assert conversation == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "system", "content": "dev"},
        {"role": "user", "content": "and?"},
    ]
    assert split_memory([ChatMessage(role="user", content="hi")])[1] is None
    assert split_memory([memory_message([]), ChatMessage(role="user", content="hi")])[1] == []


def test_split_memory_refuses_tool_messages() -> None:
    with pytest.raises(InvalidInputError, match="tool"):
        split_memory([ChatMessage(role="user", content="hi"), ChatMessage(role="tool", content="42")])


def test_split_memory_refuses_a_tagged_message_other_text_was_merged_into() -> None:
    tagged = memory_message(HITS)
    tagged.blocks = [TextBlock(text="<memory>other block</memory>"), *tagged.blocks]
    with pytest.raises(InvalidInputError, match="insert_method='user'"):
        split_memory([tagged, ChatMessage(role="user", content="hi")])


async def test_a_text_block_next_to_the_kv_block_in_a_real_memory_is_not_lost() -> None:
    # async calls on one event loop: Memory's sync get/put run a loop per call, and its in-memory SQL store's
    # connection thread then reports to a loop already closed
    kv_block = InferScaleKVMemoryBlock(StubClient(HITS), user_id="alice")
    static = StaticMemoryBlock(name="profile", static_content="The user prefers short answers.")
    question = ChatMessage(role="user", content="What is my dog called?")

    memory = Memory.from_defaults(token_limit=2000, memory_blocks=[static, kv_block])
    await memory.aput(question)
    messages = await memory.aget()  # Memory puts the profile text into the first system message: the tagged one
    with pytest.raises(InvalidInputError, match="holds 2 content blocks"):
        split_memory(messages)

    memory = Memory.from_defaults(token_limit=2000, memory_blocks=[static, kv_block], insert_method="user")
    await memory.aput(question)
    conversation, ids = split_memory(await memory.aget())
    assert ids == ["m1"]
    assert [m["role"] for m in conversation] == ["user"]
    assert "The user prefers short answers." in conversation[0]["content"]
    assert "Biscuit" not in conversation[0]["content"]


@pytest.mark.parametrize(
    "message",
    [
        ChatMessage(
            role="user", blocks=[ImageBlock(image=b"\x89PNG", image_mimetype="image/png"), TextBlock(text="?")]
        ),
        ChatMessage(role="user", blocks=[DocumentBlock(data=b"%PDF-1.4", document_mimetype="application/pdf")]),
        ChatMessage(role="assistant", blocks=[ToolCallBlock(tool_call_id="1", tool_name="weather", tool_kwargs={})]),
        ChatMessage(role="assistant", content="", additional_kwargs={"tool_calls": [{"id": "1"}]}),
    ],
)
def test_split_memory_refuses_blocks_it_would_drop(message: ChatMessage) -> None:
    """An image, a document or a tool call was left out of the prompt (``message.content`` keeps text blocks only)
    and the model answered without it, e.g. describing an image it never saw."""
    with pytest.raises(InvalidInputError, match=r"messages\[1\] holds .*text only"):
        split_memory([ChatMessage(role="user", content="hi"), message])


def test_split_memory_leaves_out_an_earlier_turns_reasoning() -> None:
    """A history written by a reasoning model holds ThinkingBlocks; they are left out, as models leave out earlier
    turns' reasoning, not refused."""
    answer = ChatMessage(
        role="assistant", blocks=[ThinkingBlock(content="They asked about dogs."), TextBlock(text="Rex")]
    )
    assert split_memory([answer])[0] == [{"role": "assistant", "content": "Rex"}]


def test_split_memory_keeps_text_blocks_and_ignores_cache_points() -> None:
    message = ChatMessage(
        role="user", blocks=[TextBlock(text="My dog?"), CachePoint(cache_control=CacheControl(type="ephemeral"))]
    )
    assert split_memory([message]) == ([{"role": "user", "content": "My dog?"}], None)
