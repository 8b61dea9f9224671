"""Split a long conversation into pieces that fit the extraction LLM's context window.

Token counts are estimated without a tokenizer as ``ceil(utf8_bytes / 3)``: an over-estimate for English
(about 4 bytes per token) and close for CJK text (3 bytes per character, roughly one token each), so a piece
under the budget by this estimate is under it for the real tokenizer too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from inferscale.errors import InvalidInputError
from inferscale.memory.messages import Message

_PER_MESSAGE_OVERHEAD = 4  # role tag and newline in the rendered conversation (tokens)


def estimate_tokens(text: str) -> int:
    """A conservative token count of ``text``: ``ceil(len(text.encode("utf-8")) / 3)``."""
    return math.ceil(len(text.encode("utf-8")) / 3)


def split_text(text: str, max_tokens: int) -> list[str]:
    """Cut ``text`` into consecutive pieces of at most ``max_tokens`` (estimated), at whitespace when possible.

    Returns:
        The pieces, which concatenate back to ``text`` up to the whitespace at the cuts; ``[text]`` when it fits.

    Raises:
        InvalidInputError: when ``max_tokens < 1``.
    """
    if max_tokens < 1:
        raise InvalidInputError(f"max_tokens must be >= 1, got {max_tokens}")
    if estimate_tokens(text) <= max_tokens:
        return [text]
    pieces: list[str] = []
    rest = text
    while rest:
        if estimate_tokens(rest) <= max_tokens:
            pieces.append(rest)
            break
        # The longest prefix under the budget: bytes ~ 3 * tokens, and a character is 1-4 bytes.
        end = _prefix_chars(rest, 3 * max_tokens)
        cut = rest.rfind(" ", 0, end)
        cut = cut if cut > end // 2 else end
        pieces.append(rest[:cut].strip())
        rest = rest[cut:].lstrip()
    return [p for p in pieces if p]


def _prefix_chars(text: str, max_bytes: int) -> int:
    used = 0
    for index, char in enumerate(text):
        used += len(char.encode("utf-8"))
        if used > max_bytes:
            return max(1, index)
    return len(text)


def chunk_messages(messages: Sequence[Message], max_tokens: int) -> list[list[Message]]:
    """Group consecutive messages into chunks of at most ``max_tokens`` (estimated); a message longer than that
    is split into several messages of the same role.

    Returns:
        The chunks in order; one chunk when everything fits; ``[]`` for no messages.

    Raises:
        InvalidInputError: when ``max_tokens`` is smaller than the per-message overhead plus one.
    """
    budget = max_tokens - _PER_MESSAGE_OVERHEAD
    if budget < 1:
        raise InvalidInputError(f"max_tokens must be > {_PER_MESSAGE_OVERHEAD}, got {max_tokens}")
    chunks: list[list[Message]] = []
    current: list[Message] = []
    used = 0
    for message in messages:
        for piece in split_text(message.content, budget):
            cost = estimate_tokens(piece) + _PER_MESSAGE_OVERHEAD
            if current and used + cost > max_tokens:
                chunks.append(current)
                current, used = [], 0
            current.append(Message(message.role, piece, message.name))
            used += cost
    if current:
        chunks.append(current)
    return chunks


__all__ = ["chunk_messages", "estimate_tokens", "split_text"]
