"""Bounded chained contexts (``kv.chain_block``): how a memory joins a chain, and what a chained memory is encoded on.

Context-window encoding prefills a memory's last w context turns as text before its own tokens, about 5.5x the
fact's tokens at w=5. A chained memory is encoded on the *stored K/V* of the memories before it instead
(:attr:`inferscale.kv.encode.EncodeRequest.chained_on`), so it prefills only its own tokens; those K/V were encoded
on the memories before them in turn, so a chain carries its context forward without prefilling it again
(docs/architecture.md, runs 14 and 17-19). Bounding the chain keeps a change local: every B-th memory of a scope is
an *anchor*, encoded after its context turns' text, and a chain never reaches past its block's anchor, so deleting
or re-wording a memory changes the K/V of at most the B - 1 memories after it.

What a memory stores says all of it (``MemoryRecord.context`` and ``chain_from``):

- ``chain_from`` is ``None``: the memory is in no chain, encoded after the text of its last w context turns;
- ``chain_from == len(context)``: the memory anchors a block, and is encoded as if it were in none;
- ``chain_from < len(context)``: ``context[:chain_from]`` are its anchor's context turns and ``context[chain_from:]``
  the texts of the block's earlier memories, oldest first. It is encoded on the K/V of the last ``chain_window`` of
  them, each of which is the memory of that text whose context is ``context[:i]`` with the same ``chain_from``
  (:func:`chained_on`).

A chained memory's K/V are thus a function of its text, its whole context and its chain start alone, which its
encoding key covers (:meth:`inferscale.fact_kv.FactKVManager.encoding_key`); the memories it is encoded on are looked
up by text, and encoded first where their K/V are not stored. A text that leaves the scope leaves every stored
context (:mod:`inferscale.storage.contexts`), so it changes the key of every later memory of its block, whose K/V are
then encoded again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from inferscale.storage import MemoryRecord


@dataclass(frozen=True, slots=True)
class ChainLink:
    """A memory as its chain sees it: what its K/V are a function of.

    Attributes:
        text: the memory's text.
        context: its stored context turns, oldest first.
        chain_from: where its chain's texts start in ``context`` (``None``: in no chain).
    """

    text: str
    context: tuple[str, ...]
    chain_from: int | None

    @classmethod
    def of(cls, record: MemoryRecord) -> ChainLink:
        """The link of a stored memory."""
        return cls(record.text, tuple(record.context), record.chain_from)

    @property
    def chained(self) -> bool:
        """Whether the memory is encoded on the stored K/V of earlier memories of its block (it is in a chain and is
        not its block's anchor)."""
        return self.chain_from is not None and self.chain_from < len(self.context)


def chained_on(link: ChainLink, window: int) -> list[ChainLink]:
    """The memories a chained memory is encoded on, oldest first: the last ``window`` of its block's earlier
    memories, each with the context it was stored with (the memory's own context up to it) and the same chain start;
    ``[]`` for a memory that is not chained.

    Raises:
        ValueError: when ``window`` is under 1.
    """
    if window < 1:
        raise ValueError(f"a chain's window must be at least 1, got {window}")
    if not link.chained or link.chain_from is None:
        return []
    start = max(link.chain_from, len(link.context) - window)
    return [ChainLink(link.context[i], link.context[:i], link.chain_from) for i in range(start, len(link.context))]


def next_in_chain(previous: ChainLink | None, block: int) -> tuple[tuple[str, ...], int] | None:
    """The context and chain start of a memory added right after ``previous`` in its scope when it continues
    ``previous``'s block: ``previous``'s context and text, from the same chain start. ``None`` when it starts a new
    block instead (it is an anchor): ``previous`` is in no chain (or there is none), or its block holds ``block``
    memories with it.

    Raises:
        ValueError: when ``block`` is under 2.
    """
    if block < 2:
        raise ValueError(f"a chain's block must hold at least 2 memories, got {block}")
    if previous is None or previous.chain_from is None:
        return None
    position = len(previous.context) - previous.chain_from + 1  # previous's place in its block, its anchor 1st
    if position >= block:
        return None
    return (*previous.context, previous.text), previous.chain_from


def anchor_context(context: Sequence[str], window: int) -> tuple[str, ...]:
    """The context an anchor is stored with: the last ``window`` (w) turns of ``context``, the only ones its K/V
    depend on (every memory of its block repeats them)."""
    return tuple(context[-window:]) if window else ()


__all__ = ["ChainLink", "anchor_context", "chained_on", "next_in_chain"]
