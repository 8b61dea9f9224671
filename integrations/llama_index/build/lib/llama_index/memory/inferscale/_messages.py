"""The tag contract between the memory classes and :class:`~llama_index.memory.inferscale.InferScaleLLM`.

A memory class that adds recalled memories to the conversation adds them as one system message of its own whose
text is the memories (for any LLM to read, the Mem0 way) and whose ``additional_kwargs[MEMORY_IDS_KEY]`` lists their
ids. :func:`split_memory` is how an InferScale model reads such a list: it drops every tagged message (its text is
memory text by construction, so nothing is parsed) and collects the ids, which ``MemoryClient.chat`` injects as
K/V. Untagged messages are the conversation and go through unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llama_index.core.base.llms.types import CachePoint, ChatMessage, MessageRole, TextBlock, ThinkingBlock

from inferscale import InvalidInputError
from inferscale.storable import is_blank

_KEPT_BLOCKS = (TextBlock, CachePoint, ThinkingBlock)
"""The blocks a message may hold: text, prompt-cache markers (nothing to prefill) and an earlier turn's reasoning
(another model's, left out as models leave out earlier turns' reasoning). Any other block (an image, a document,
audio, a tool call, a citation) is refused rather than left out of the prompt."""

MEMORY_IDS_KEY = "inferscale_memory_ids"
"""The ``ChatMessage.additional_kwargs`` key of a memory message: the ids of the memories its text holds."""

MEMORY_INTRO = "Relevant memories:"
"""The first line of a memory message's text (what a non-InferScale LLM reads before the memories)."""

_ROLES: Mapping[str, str] = {
    MessageRole.SYSTEM.value: "system",
    MessageRole.DEVELOPER.value: "system",
    MessageRole.USER.value: "user",
    MessageRole.ASSISTANT.value: "assistant",
    MessageRole.CHATBOT.value: "assistant",
    MessageRole.MODEL.value: "assistant",
}


def memory_message(hits: Sequence[Mapping[str, Any]]) -> ChatMessage:
    """The tagged system message holding ``hits`` (search results, ``{"id", "memory", ...}``), best first.

    Its text is :data:`MEMORY_INTRO` and one ``- memory`` line per hit, or ``""`` when there is none: the tag (an
    empty list) still tells an InferScale model that the memory chose no memory, so it retrieves none itself.
    """
    text = "\n".join([MEMORY_INTRO, *(f"- {hit['memory']}" for hit in hits)]) if hits else ""
    return ChatMessage(
        role=MessageRole.SYSTEM, content=text, additional_kwargs={MEMORY_IDS_KEY: [str(h["id"]) for h in hits]}
    )


def memory_ids_of(message: ChatMessage) -> list[str] | None:
    """The ids a memory message is tagged with, or ``None`` for an untagged message.

    Raises:
        InvalidInputError: when the tag is not a list of non-empty strings.
    """
    ids = message.additional_kwargs.get(MEMORY_IDS_KEY)
    if ids is None:
        return None
    if isinstance(ids, str) or not isinstance(ids, Sequence) or not all(isinstance(i, str) and i for i in ids):
        raise InvalidInputError(f"additional_kwargs[{MEMORY_IDS_KEY!r}] must be a list of memory ids, got {ids!r}")
    return list(ids)


def split_memory(messages: Sequence[ChatMessage]) -> tuple[list[dict[str, str]], list[str] | None]:
    """Split a LlamaIndex message list into the conversation ``MemoryClient.chat`` prefills and the memory ids it
    injects.

    Returns:
        ``(conversation, memory_ids)``: the untagged messages as ``{"role", "content"}`` dicts (developer → system,
        chatbot/model → assistant), and the ids of every tagged message in order without repeats, or ``None`` when
        no message is tagged.

    Raises:
        InvalidInputError: for a tool or function message (tool calling is not supported), a message holding a
            block other than text, a cache point or reasoning (:data:`_KEPT_BLOCKS`), a bad tag, or a
            tagged message holding more than the one text block :func:`memory_message` made (other text was merged
            into it, which dropping the message would lose).
    """
    conversation: list[dict[str, str]] = []
    memory_ids: list[str] | None = None
    for i, message in enumerate(messages):
        ids = memory_ids_of(message)
        if ids is not None:
            if len(message.blocks) > 1:
                raise InvalidInputError(
                    f"messages[{i}] is tagged with {MEMORY_IDS_KEY!r} but holds {len(message.blocks)} content "
                    "blocks: other text was merged into the memory message and would be lost with it. LlamaIndex's "
                    "Memory puts its text blocks into the first system message, which is InferScaleKVMemoryBlock's: "
                    "build it with Memory.from_defaults(..., insert_method='user'), or use InferScaleMemoryBlock "
                    "(memories as text) instead of InferScaleKVMemoryBlock"
                )
            memory_ids = memory_ids or []
            memory_ids.extend(mid for mid in ids if mid not in memory_ids)
            continue
        dropped = sorted({type(b).__name__ for b in message.blocks if not isinstance(b, _KEPT_BLOCKS)})
        if dropped or message.additional_kwargs.get("tool_calls"):
            raise InvalidInputError(
                f"messages[{i}] holds {dropped or ['tool_calls']}: InferScaleLLM takes text only, and would answer "
                "without them"
            )
        role = _ROLES.get(message.role.value)
        if role is None:
            raise InvalidInputError(
                f"messages[{i}] has role {message.role.value!r}; InferScaleLLM takes system, user and assistant "
                "messages (tool calling is not supported)"
            )
        conversation.append({"role": role, "content": message.content or ""})
    return conversation, memory_ids


def search_text(messages: Sequence[ChatMessage], limit: int, input: str | None = None) -> str:
    """What a memory searches with: the last ``limit`` user/assistant messages as ``"role: content"`` lines, then
    ``input`` as a user line (Mem0Memory's query; system and memory messages are left out)."""
    turns = [m for m in messages if m.role in (MessageRole.USER, MessageRole.ASSISTANT) and m.content]
    lines = [f"{m.role.value}: {m.content}" for m in turns[-limit:]] if limit > 0 else []
    if input:
        lines.append(f"user: {input}")
    return "\n".join(lines)


def turns_to_add(messages: Sequence[ChatMessage]) -> list[dict[str, str]]:
    """The user and assistant messages with text, as ``{"role", "content"}`` dicts for ``MemoryClient.add``; memory
    messages and everything else are left out."""
    return [
        {"role": m.role.value, "content": m.content or ""}
        for m in messages
        if m.role in (MessageRole.USER, MessageRole.ASSISTANT)
        and not is_blank(m.content or "")
        and memory_ids_of(m) is None
    ]
