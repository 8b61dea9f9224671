"""Normalisation of the ``messages`` argument of ``add``: a string, one message dict, or a list of them.

Everything downstream (extraction, context-window KV encoding) sees a ``list[Message]`` with a known role and
non-empty text, so shape errors surface here, before anything is written.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inferscale.errors import InvalidInputError
from inferscale.storable import check_storable

ROLES: frozenset[str] = frozenset({"user", "assistant", "system"})

_EXPECTED = (
    'a string, a dict {"role": "user" | "assistant" | "system", "content": "<non-empty text>"} or a list of such dicts'
)


@dataclass(frozen=True, slots=True)
class Message:
    """One conversation turn.

    Attributes:
        role: ``"user"``, ``"assistant"`` or ``"system"``.
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


def _from_dict(item: Mapping[Any, Any], where: str) -> Message:
    missing = [key for key in ("role", "content") if key not in item]
    if missing:
        raise InvalidInputError(f"{where} lacks {', '.join(map(repr, missing))}; expected {_EXPECTED}")
    role, content, name = item["role"], item["content"], item.get("name")
    if not isinstance(role, str) or role not in ROLES:
        raise InvalidInputError(f"{where} has role {role!r}; expected one of {sorted(ROLES)}")
    if not isinstance(content, str):
        raise InvalidInputError(
            f"{where} has content of type {type(content).__name__} ({content!r}); expected a non-empty string"
        )
    if not content.strip():
        raise InvalidInputError(f"{where} has empty content {content!r}; expected a non-empty string")
    check_storable(content, where)
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise InvalidInputError(f"{where} has name {name!r}; expected a non-empty string or no 'name' key")
    return Message(role=role, content=content, name=name)


def normalize_messages(messages: str | Mapping[str, Any] | Sequence[Any]) -> list[Message]:
    """Turn any accepted ``messages`` shape into a list of :class:`Message`.

    Args:
        messages: a string (one user message), a dict with ``"role"`` and ``"content"`` (and optionally
            ``"name"``), or a non-empty list (or tuple) of such dicts; :class:`Message` instances are accepted
            in place of dicts.

    Returns:
        The messages in order; content is kept exactly as given (not stripped).

    Raises:
        InvalidInputError: for an empty string or list, a non-dict item, a missing ``role``/``content``, a role
            other than user/assistant/system, non-string or whitespace-only content, or content no backend can
            store (a lone surrogate or NUL: :func:`inferscale.storable.check_storable`). The message names the bad
            index and value and the expected shape.
    """
    if isinstance(messages, str):
        if not messages.strip():
            raise InvalidInputError(f"messages is an empty string {messages!r}; expected {_EXPECTED}")
        check_storable(messages, "messages")
        return [Message(role="user", content=messages)]
    if isinstance(messages, Message):
        messages = [messages]
    if isinstance(messages, Mapping):
        return [_from_dict(messages, "message")]
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
            out.append(_from_dict(item, where))
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
        if m.role != "user" or not text:
            continue
        if len(text) <= max_chars:
            turns.append(text)
        else:
            turns.extend(textwrap.wrap(text, width=max_chars, break_on_hyphens=False))
    return turns
