"""A search widened until enough of its hits are kept: for callers that leave some hits out after searching (a chat
leaves out memories repeating its conversation, :class:`inferscale.chat_request.SentTexts`; the framework packages
also leave out memories stored from the messages in view), so that ``limit`` hits remain however many are left out.

``search(k)`` returns the best ``k`` hits, best first (fewer when there are no more). It is asked for ``limit +
extra`` hits first, then twice as many each time, until ``limit`` are kept, it returns fewer than it was asked for
(there are no more), or ``k`` reaches ``most``. A text stored many times (under several run ids, or with other
whitespace) is thus left out whatever its count, and a search with nothing to leave out runs once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

_Hit = TypeVar("_Hit")


def search_kept(
    search: Callable[[int], Sequence[_Hit]],
    keep: Callable[[_Hit], bool],
    limit: int,
    *,
    extra: int,
    most: int | None = None,
) -> list[_Hit]:
    """The first ``limit`` hits of ``search`` that ``keep`` keeps, in its order (module docstring).

    Args:
        search: ``k -> the best k hits``.
        keep: whether a hit is kept.
        limit: hits wanted (0: ``search(0)`` once, nothing kept).
        extra: hits asked for on top of ``limit`` the first time (those the caller expects to leave out).
        most: the largest ``k`` to ask for (a search's own limit), or ``None``.

    Raises:
        Whatever ``search`` raises.
    """
    k = _first_k(limit, extra, most)
    while True:
        found = search(k)
        kept = [hit for hit in found if keep(hit)][:limit]
        k_next = _next_k(k, len(found), len(kept), limit, most)
        if k_next is None:
            return kept
        k = k_next


async def asearch_kept(
    search: Callable[[int], Awaitable[Sequence[_Hit]]],
    keep: Callable[[_Hit], bool],
    limit: int,
    *,
    extra: int,
    most: int | None = None,
) -> list[_Hit]:
    """:func:`search_kept` with an async ``search``; same arguments, result and errors."""
    k = _first_k(limit, extra, most)
    while True:
        found = await search(k)
        kept = [hit for hit in found if keep(hit)][:limit]
        k_next = _next_k(k, len(found), len(kept), limit, most)
        if k_next is None:
            return kept
        k = k_next


def _first_k(limit: int, extra: int, most: int | None) -> int:
    k = limit + extra if limit else 0
    return k if most is None else min(k, most)


def _next_k(k: int, found: int, kept: int, limit: int, most: int | None) -> int | None:
    """The next ``k``, or ``None`` when the search at ``k`` decides: ``limit`` kept, fewer than ``k`` found (no more
    hits), or ``k`` is ``most``."""
    if kept >= limit or found < k or k == most:
        return None
    return 2 * k if most is None else min(2 * k, most)


__all__ = ["asearch_kept", "search_kept"]
