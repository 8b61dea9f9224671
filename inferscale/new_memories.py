"""How new memories stored as they are (``add(infer=False)``, an import) are laid out: the context turns, and with
``kv.chain_block`` the chain, each one is stored (and so encoded) with (context-window encoding,
docs/architecture.md; chains: :mod:`inferscale.chains`).

Every context entry is a memory's text, so each is a neighbour (:attr:`~inferscale.storage.NewMemory.neighbours`):
one whose memory is deleted before the add commits is dropped, as it is later from the stored context.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from inferscale.chains import ChainLink, anchor_context, next_in_chain
from inferscale.config import KVConfig
from inferscale.memory.contexts import turn_contexts
from inferscale.storage.change_sets import NewMemory

MAX_CONTEXT_TURNS = 64
"""Conversation turns kept as a fact's encoding context (the largest ``kv.context_window``)."""


def in_turn_order(memories: Sequence[NewMemory], stored: Sequence[str], keep: int) -> tuple[NewMemory, ...]:
    """``memories`` (in the order they are said) each with the texts before it as its context: the scope's
    ``stored`` texts (the last ones stored, oldest first), then the earlier ``memories``, the last ``keep`` of them
    (:func:`~inferscale.memory.contexts.turn_contexts`)."""
    contexts = turn_contexts(stored, [new.text for new in memories], keep)
    return tuple(replace(new, context=c, neighbours=len(c)) for new, c in zip(memories, contexts, strict=True))


def in_chains(
    memories: Sequence[NewMemory], stored: Sequence[str], last: ChainLink | None, block: int, window: int
) -> tuple[NewMemory, ...]:
    """``memories`` (in order) in bounded chains of ``block`` (:mod:`inferscale.chains`): the first continues the
    block of the scope's ``last`` memory, each later one the block of the memory before it; one that starts a new
    block (an anchor) is stored with the last ``window`` texts its context would have without chains (the scope's
    ``stored`` texts, then the earlier ``memories``)."""
    texts = [*stored, *(new.text for new in memories)]
    laid: list[NewMemory] = []
    previous = last
    for i, new in enumerate(memories):
        continued = next_in_chain(previous, block)
        if continued is None:
            context = anchor_context(texts[: len(stored) + i], window)
            continued = (context, len(context))
        context, chain_from = continued
        laid.append(replace(new, context=context, neighbours=len(context), chain_from=chain_from))
        previous = ChainLink(new.text, context, chain_from)
    return tuple(laid)


def one_by_one(
    memories: Sequence[NewMemory], stored: Sequence[str], last: ChainLink | None, kv: KVConfig
) -> tuple[NewMemory, ...]:
    """``memories``, each with the context and chain ``add(infer=False)`` of its text would give it, one call after
    another: after the ``kv.context_window`` texts stored last before it (the scope's ``stored`` texts, then the
    earlier ``memories``), or in chains when ``kv.chain_block`` is set (continuing the scope's ``last`` memory)."""
    if kv.chains:
        return in_chains(memories, stored, last, kv.chain_block, kv.context_window)
    return in_turn_order(memories, stored, kv.context_window)


__all__ = ["MAX_CONTEXT_TURNS", "in_chains", "in_turn_order", "one_by_one"]
