"""Normalisation of the ``messages`` argument of ``add``: a string, one message dict, or a list of them.

Everything downstream (extraction, context-window KV encoding) sees a ``list[Message]`` with a known role and
non-empty text, so shape errors surface here, before anything is written.
"""

from __future__ import annotations

import logging
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inferscale.conversation import ROLE_ALIASES
from inferscale.errors import InvalidInputError
from inferscale.storable import check_storable, is_blank

TOOL_ROLES: frozenset[str] = frozenset({"tool", "function"})
"""The roles of tool results (``function`` is OpenAI's older name): stored by ``add(infer=False)``, never shown to
fact extraction, as Mem0 treats them."""

ROLES: frozenset[str] = frozenset({"user", "assistant", "system"}) | TOOL_ROLES

_EXPECTED = (
    'a string, a dict {"role": "user" | "assistant" | "system" | "developer" | "tool" | "function", "content": '
    '"<non-empty text>"} or a list of such dicts'
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Message:
    """One conversation turn.

    Attributes:
        role: ``"user"``, ``"assistant"``, ``"system"``, or ``"tool"``/``"function"`` (a tool result).
        content: the turn's text, never empty or whitespace only.
        name: an optional speaker name (OpenAI's ``name`` field), kept for prompts; ``None`` when not given.
    """

    role: str
    content: str
    name: str | None = None

    def as_chat_dict(self) -> dict[str, str]:
        """The OpenAI-style dict ``{"role": ..., "content": ...}`` (plus ``"name"`` when set)."""
        out = {"role": self.role, "content": self.content}
        if self.name is not None:
            out["name"] = self.name
        return out


def _is_tool_call(item: Mapping[Any, Any]) -> bool:
    """Whether ``item`` is an assistant turn that only calls tools (OpenAI's ``tool_calls``, or the older
    ``function_call``, with no text): an agent's conversation holds one before each tool result."""
    return (
        item.get("role") == "assistant"
        and item.get("content") in (None, "", [])
        and bool(item.get("tool_calls") or item.get("function_call"))
    )


def _text_of_parts(content: list[Any], where: str) -> str | None:
    """The text of OpenAI content parts (``[{"type": "text", "text": ...}, ...]``), joined by spaces as Mem0 joins
    them, or ``None`` when no part is text; other parts (an image) are left out with a warning.

    Raises:
        InvalidInputError: for a part that is not a dict with a ``type``, or a text part without a str ``text``.
    """
    texts: list[str] = []
    for i, part in enumerate(content):
        if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
            raise InvalidInputError(f"{where}.content[{i}] is {part!r}; expected a part {{'type': ..., ...}}")
        if part["type"] == "text":
            if not isinstance(part.get("text"), str):
                raise InvalidInputError(
                    f"{where}.content[{i}] is a text part without a str 'text' ({part!r}); expected "
                    "{'type': 'text', 'text': '...'}"
                )
            texts.append(part["text"])
    if len(texts) < len(content):
        log.warning("%s: left out %d content parts that are not text", where, len(content) - len(texts))
    return " ".join(texts) if not all(is_blank(t) for t in texts) else None


def _from_dict(item: Mapping[Any, Any], where: str) -> Message | None:
    """The message of ``item``, or ``None`` for one without text that Mem0 skips too: an assistant turn that only
    calls tools, content ``None``, or content parts none of which is text. A ``developer`` message is a ``system``
    one (:data:`inferscale.conversation.ROLE_ALIASES`)."""
    if _is_tool_call(item):
        return None
    missing = [key for key in ("role", "content") if key not in item]
    if missing:
        raise InvalidInputError(f"{where} lacks {', '.join(map(repr, missing))}; expected {_EXPECTED}")
    role, content, name = item["role"], item["content"], item.get("name")
    if not isinstance(role, str) or ROLE_ALIASES.get(role, role) not in ROLES:
        raise InvalidInputError(f"{where} has role {role!r}; expected one of {sorted(ROLES | set(ROLE_ALIASES))}")
    role = ROLE_ALIASES.get(role, role)
    if content is None:
        log.warning("%s (%s) has no content (None); it is skipped", where, role)
        return None
    if isinstance(content, list):
        content = _text_of_parts(content, where)
        if content is None:
            return None
    if not isinstance(content, str):
        raise InvalidInputError(
            f"{where} has content of type {type(content).__name__} ({content!r}); expected a non-empty string"
        )
    if is_blank(content):
        raise InvalidInputError(f"{where} has empty content {content!r}; expected a non-empty string")
    check_storable(content, where)
    if name is not None and (not isinstance(name, str) or is_blank(name)):
        raise InvalidInputError(f"{where} has name {name!r}; expected a non-empty string or no 'name' key")
    return Message(role=role, content=content, name=name)


def normalize_messages(messages: str | Mapping[str, Any] | Sequence[Any]) -> list[Message]:
    """Turn any accepted ``messages`` shape into a list of :class:`Message`.

    Args:
        messages: a string (one user message), a dict with ``"role"`` and ``"content"`` (and optionally
            ``"name"``), or a non-empty list (or tuple) of such dicts; :class:`Message` instances are accepted
            in place of dicts.

    An agent's OpenAI-style conversation is taken as Mem0 takes it: an assistant turn that only calls tools
    (``tool_calls`` and no text) is skipped, and so is a message whose content is ``None`` (with a warning), a
    ``tool`` result is a message like the others (stored by ``infer=False``, never shown to fact extraction), and
    content given as parts has its text parts joined by spaces (a message with no text part is skipped; other parts,
    such as images, are left out with a warning). A ``developer`` message is a ``system`` one: neither stored nor
    shown to extraction as a turn.

    Returns:
        The messages in order, those skipped left out (possibly none); content is kept exactly as given (not
        stripped).

    Raises:
        InvalidInputError: for an empty string or list, a non-dict item, a missing ``role``/``content``, a role
            other than user/assistant/system/developer/tool/function, non-string (or malformed parts) or
            whitespace-only content, or content no backend can store (a lone surrogate or NUL:
            :func:`inferscale.storable.check_storable`). The message names the bad index and value and the expected
            shape.
    """
    if isinstance(messages, str):
        if is_blank(messages):
            raise InvalidInputError(f"messages is an empty string {messages!r}; expected {_EXPECTED}")
        check_storable(messages, "messages")
        return [Message(role="user", content=messages)]
    if isinstance(messages, Message):
        messages = [messages]
    if isinstance(messages, Mapping):
        one = _from_dict(messages, "message")
        return [] if one is None else [one]
    if isinstance(messages, list | tuple):
        if not messages:
            raise InvalidInputError(f"messages is an empty list; expected {_EXPECTED}")
        out: list[Message] = []
        for index, item in enumerate(messages):
            where = f"messages[{index}]"
            if isinstance(item, Message):
                item = {"role": item.role, "content": item.content, "name": item.name}
            if not isinstance(item, Mapping):
                raise InvalidInputError(f"{where} is a {type(item).__name__} ({item!r}); expected {_EXPECTED}")
            message = _from_dict(item, where)
            if message is not None:
                out.append(message)
        return out
    raise InvalidInputError(f"messages is a {type(messages).__name__} ({messages!r}); expected {_EXPECTED}")


def user_turns(messages: Sequence[Message], max_chars: int) -> list[str]:
    """The user turns' texts, stripped, in order: what ``add(infer=True)`` stores verbatim when no usable fact can be
    had from the LLM (its answer is unusable, or every fact it gave fails the grounding check), and beside the facts
    it keeps when the grounding check drops some.

    A turn longer than ``max_chars`` characters (``max_memory_chars``: a memory is a fact, not a document) is cut
    into consecutive pieces of at most that many, at whitespace where it can be (``textwrap``), each its own memory.

    Raises:
        InvalidInputError: when ``max_chars < 1``.
    """
    if max_chars < 1:
        raise InvalidInputError(f"max_chars must be >= 1, got {max_chars}")
    turns: list[str] = []
    for m in messages:
        text = m.content.strip()
        if m.role != "user" or is_blank(text):
            continue
        if len(text) <= max_chars:
            turns.append(text)
        else:
            turns.extend(textwrap.wrap(text, width=max_chars, break_on_hyphens=False))
    return turns
