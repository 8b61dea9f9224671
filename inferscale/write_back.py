"""Storing a conversation's turns as memories after an agent framework has answered them (the write-back of the
LangChain middleware, the LlamaIndex memory and its blocks).

A direct ``add`` call is all or nothing: one message it cannot store refuses the whole call and stores nothing, which
is right for a caller that chose what to store. A write-back runs after the model has answered, on messages nobody
chose for memory: raising there loses the answer (an agent run raises, a chat engine's turn fails), and a message too
long to be a memory (:class:`~inferscale.errors.MemoryTooLongError`: with ``infer=False``, longer than
``max_memory_chars`` or than the model's context) would fail every turn that sends it. :func:`store_turns` therefore
stores what can be stored: the turns in one ``add`` (one transaction) when it takes them all, else each message alone,
leaving out those too long to be a memory, each with a warning that names the reason. Every other error is raised: a
scope refused, an id no backend stores, a server path that does not exist, a database down, a key that may not write
the scope.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

from inferscale.errors import MemoryTooLongError

log = logging.getLogger(__name__)

R = TypeVar("R")

Turn = Mapping[str, str]
"""One message as ``add`` takes it: ``{"role": ..., "content": ...}``."""


def store_turns(add: Callable[[list[Turn]], R], turns: Sequence[Turn]) -> list[R]:
    """Store ``turns`` with ``add`` (``lambda t: client.add(t, user_id=..., infer=...)``), leaving out the messages
    it refuses for what they hold.

    Returns:
        the results of the ``add`` calls that stored something: one for the whole turns, else one per message
        stored alone; ``[]`` when nothing was stored (a warning was logged for each message left out).

    Raises:
        Exception: any error of ``add`` other than :class:`~inferscale.errors.MemoryTooLongError`, as it is.
    """
    try:
        return [add(list(turns))]
    except MemoryTooLongError as error:
        alone = _one_by_one(turns, error)
    stored: list[R] = []
    for turn in alone:
        try:
            stored.append(add([turn]))
        except MemoryTooLongError as refusal:
            _not_stored(turn, refusal)
    return stored


async def astore_turns(add: Callable[[list[Turn]], Awaitable[R]], turns: Sequence[Turn]) -> list[R]:
    """:func:`store_turns` with an async ``add`` (``lambda t: async_client.add(t, ...)``); same results and errors."""
    try:
        return [await add(list(turns))]
    except MemoryTooLongError as error:
        alone = _one_by_one(turns, error)
    stored: list[R] = []
    for turn in alone:
        try:
            stored.append(await add([turn]))
        except MemoryTooLongError as refusal:
            _not_stored(turn, refusal)
    return stored


def _one_by_one(turns: Sequence[Turn], error: MemoryTooLongError) -> Sequence[Turn]:
    """After ``add`` refused all of ``turns`` with ``error``: the messages to store one at a time (none when there is
    one message, whose refusal is logged)."""
    if len(turns) == 1:
        _not_stored(turns[0], error)
        return []
    return turns


def _not_stored(turn: Turn, error: MemoryTooLongError) -> None:
    """Log that ``turn`` was refused as too long to be a memory."""
    log.warning(
        "a %s message (%s characters) was not stored as a memory: %s", turn["role"], f"{len(turn['content']):,}", error
    )
