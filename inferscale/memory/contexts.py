"""What each memory of an ``add(infer=False)`` call is encoded after (context-window encoding, ``kv.context_window``).

One rule, shared by the write path (:class:`inferscale.client_core.ClientCore`) and the fidelity slices
(:func:`inferscale.eval.fidelity_cases.memories_with_contexts`), so that what the eval measures is what the product
stores: a message's context is the texts of the memories its scope stored last (oldest first), then the call's
messages before it, cut to the last ``keep`` entries.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["turn_contexts"]


def turn_contexts(stored: Sequence[str], turns: Sequence[str], keep: int) -> list[tuple[str, ...]]:
    """The context of each of ``turns`` (one ``add`` call's user/assistant messages, in order).

    Args:
        stored: the texts of the scope's memories stored before the call, oldest first.
        turns: the call's messages, in order; a text may repeat (each occurrence gets its own context).
        keep: how many entries each context keeps at most (the last ones); ``0`` keeps none.

    Returns:
        One tuple per turn: the last ``keep`` entries of ``(*stored, *turns[:i])`` for turn ``i`` (``()`` when
        ``keep`` is 0).

    Raises:
        ValueError: when ``keep`` is negative.
    """
    if keep < 0:
        raise ValueError(f"keep must be >= 0, got {keep}")
    texts = [*stored, *turns]
    first = len(stored)
    return [tuple(texts[max(0, first + i - keep) : first + i]) for i in range(len(turns))]
