"""LangChain messages to InferScale's ``{"role", "content"}`` turns, and the memory tag.

The tag is how memory travels by id. A component that adds memory text to a prompt (the middleware's text path, a
user's own chain) marks it with the memories' ids under ``additional_kwargs["inferscale_memory_ids"]``:

- a :class:`~langchain_core.messages.SystemMessage` whose content is a string holds only memory: an InferScale
  model drops the whole message;
- a system message whose content is a list of blocks keeps its other blocks (the agent's own instructions): an
  InferScale model drops only the text blocks whose ``id`` is :data:`MEMORY_BLOCK_ID`.

Either way the ids are injected as K/V, so no memory is injected twice and no memory text is parsed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import BaseMessage, SystemMessage
from langchain_core.messages.utils import convert_to_openai_messages

from inferscale import InvalidInputError

MEMORY_IDS_KEY = "inferscale_memory_ids"
"""``additional_kwargs`` key of a system message that carries memories: their ids, in prompt order."""

MEMORY_BLOCK_ID = "inferscale_memories"
"""``id`` of the text block that holds memory text inside a system message with list content."""

_CHAT_ROLES = ("user", "assistant", "system")


@dataclass(frozen=True, slots=True)
class Prepared:
    """A LangChain conversation split into what InferScale receives.

    Attributes:
        messages: the conversation as ``{"role", "content"}`` dicts, memory text removed.
        memory_ids: the ids of the tagged memories, in order, without repeats; ``None`` when no message was tagged.
    """

    messages: list[dict[str, str]]
    memory_ids: list[str] | None


def memory_system_message(
    memories: Sequence[tuple[str, str]], header: str = "Memories about the user:"
) -> SystemMessage:
    """A system message holding ``memories`` (``(id, text)`` pairs) as text, tagged with their ids.

    A non-InferScale model reads the text; :class:`~langchain_inferscale.ChatInferScale` drops it and injects the ids.
    """
    text = "\n".join([header, *(f"- {memory}" for _, memory in memories)])
    return SystemMessage(content=text, additional_kwargs={MEMORY_IDS_KEY: [memory_id for memory_id, _ in memories]})


def with_memory_block(system: SystemMessage | None, memories: Sequence[tuple[str, str]], header: str) -> SystemMessage:
    """``system`` with the memories appended as one tagged text block (the Mem0 way: memory in the system prompt).

    The agent's own instructions stay in their blocks; the memory block has ``id`` :data:`MEMORY_BLOCK_ID` and the
    message lists the ids under :data:`MEMORY_IDS_KEY`, after any ids it already carried.
    """
    text = "\n".join([header, *(f"- {memory}" for _, memory in memories)])
    blocks: list[str | dict[str, Any]] = []
    kwargs: dict[str, Any] = {}
    if system is not None:
        blocks = [{"type": "text", "text": system.content}] if isinstance(system.content, str) else list(system.content)
        kwargs = dict(system.additional_kwargs)
    kwargs[MEMORY_IDS_KEY] = _unique([*kwargs.get(MEMORY_IDS_KEY, []), *(memory_id for memory_id, _ in memories)])
    blocks.append({"type": "text", "text": text, "id": MEMORY_BLOCK_ID})
    return SystemMessage(content=blocks, additional_kwargs=kwargs)


def prepare(messages: Sequence[BaseMessage]) -> Prepared:
    """Convert a LangChain conversation for :meth:`inferscale.MemoryClient.chat`, taking tagged memory out.

    Roles and text come from langchain-core's :func:`~langchain_core.messages.utils.convert_to_openai_messages`
    (``text_format="string"``): human, AI and system messages, their chunks (a reply assembled from a stream) and
    a :class:`~langchain_core.messages.ChatMessage` with one of InferScale's roles become user, assistant and
    system turns; text blocks are joined with newlines.

    Raises:
        InvalidInputError: for another role (tool, function), an AI message with tool calls, a content block that
            is not text (images, audio), or a tag that is not a list of ids.
    """
    turns: list[dict[str, str]] = []
    memory_ids: list[str] | None = None
    for i, message in enumerate(messages):
        if isinstance(message, SystemMessage) and MEMORY_IDS_KEY in message.additional_kwargs:
            memory_ids = [*(memory_ids or []), *_tagged_ids(i, message)]
            if isinstance(message.content, str):
                continue
            message = message.model_copy(update={"content": [b for b in message.content if not _is_memory_block(b)]})
            turn = _turn(i, message)
            if turn["content"]:
                turns.append(turn)
            continue
        turns.append(_turn(i, message))
    return Prepared(turns, None if memory_ids is None else _unique(memory_ids))


def _turn(i: int, message: BaseMessage) -> dict[str, str]:
    converted = convert_to_openai_messages(message, text_format="string")
    role, content = converted["role"], converted["content"]
    if converted.get("tool_calls"):
        raise InvalidInputError(f"message {i} is an AI message with tool calls; ChatInferScale does not call tools")
    if role not in _CHAT_ROLES:
        raise InvalidInputError(
            f"message {i} is a {type(message).__name__} with role {role!r}; ChatInferScale takes the roles "
            f"{', '.join(_CHAT_ROLES)} (no tool calling): convert it to a human, AI or system message first"
        )
    if not isinstance(content, str):
        kinds = sorted({block.get("type", "?") for block in content if isinstance(block, dict)} - {"text"})
        raise InvalidInputError(f"message {i} has {kinds} content blocks; ChatInferScale takes text only")
    return {"role": role, "content": content}


def _tagged_ids(i: int, message: BaseMessage) -> list[str]:
    ids = message.additional_kwargs[MEMORY_IDS_KEY]
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise InvalidInputError(f"message {i}: {MEMORY_IDS_KEY} must be a list of memory ids, got {ids!r}")
    ids = list(ids)
    if not all(isinstance(memory_id, str) and memory_id for memory_id in ids):
        raise InvalidInputError(f"message {i}: {MEMORY_IDS_KEY} must hold non-empty str ids, got {ids!r}")
    return ids


def _is_memory_block(block: str | dict[str, Any]) -> bool:
    return isinstance(block, dict) and block.get("id") == MEMORY_BLOCK_ID


def _unique(ids: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(ids))
