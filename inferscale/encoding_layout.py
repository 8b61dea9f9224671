"""What a memory's K/V encoding lays out, and whether it fits the model's context window.

A memory is encoded after (system prefix) + (its last w context turns), at each position bucket
(:attr:`~inferscale.config.KVConfig.position_buckets`), and, with ``kv.first_memory_context_free``, once more after
the system prefix alone (:data:`inferscale.fact_kv.CONTEXT_FREE`). :class:`EncodingLayout` is the one place that turns
a memory's text and context into the engine's :class:`~inferscale.kv.encode.EncodeRequest`: the K/V manager encodes
what it builds (:class:`~inferscale.fact_kv.FactKVManager`), and ``add``, ``update`` and ``chat`` measure it.
Measuring needs the engine's tokenizer alone (the token-layout methods of :class:`~inferscale.engines.base.Engine`
load no weights), so :func:`span_steps` settles every new memory's span before anything is stored, in every
``kv.encode_on_add`` mode, without a model load: a new memory whose context turns would carry it past the model's
context keeps only its last turns that fit (its context is what it is encoded after; the turns are the conversation's,
not the caller's fact), and a fact that does not fit even after the system prefix alone, or a new text that does not
fit after its memory's stored turns, is refused.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence

from inferscale.chains import ChainLink, anchor_context, chained_on, next_in_chain
from inferscale.config import KVConfig
from inferscale.engines.base import Engine
from inferscale.errors import UnsupportedModelError
from inferscale.kv.encode import EncodeRequest, check_spans
from inferscale.kv.serving import gap_for_bucket
from inferscale.steps import MemoryById, Steps
from inferscale.storage import MemoryRecord
from inferscale.storage.change_sets import ChangeSet, NewMemory, validate_changes

log = logging.getLogger(__name__)

PREVIEW_CHARS = 40
"""How much of a memory's text an error message quotes."""


def context_turns(context: Sequence[str], window: int) -> list[str]:
    """The context turns a memory is encoded after: the last ``window`` (w) of its stored ``context``; none when
    w = 0."""
    return list(context[-window:]) if window and context else []


def preview(text: str) -> str:
    """``text`` quoted for a message, cut to :data:`PREVIEW_CHARS` characters."""
    return repr(text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "…")


class EncodingLayout:
    """The encode requests of memories under an engine's token layout and the K/V settings.

    Args:
        engine: the chat engine (its token-layout methods and :attr:`~inferscale.engines.base.Engine.max_context_tokens`
            load the tokenizer and config alone when the model is not loaded).
        config: the K/V settings: w, whether facts follow the system prefix, the position buckets.
    """

    def __init__(self, engine: Engine, config: KVConfig) -> None:
        self._engine = engine
        self._config = config

    def requests(self, text: str, context: Sequence[str], buckets: Sequence[int]) -> list[EncodeRequest]:
        """What to encode for a memory of ``text`` and stored ``context``, once per position bucket of ``buckets``
        (tokens from the prefix), in order: its fact tokens after (system prefix) + (its last w context turns),
        placed ``bucket`` tokens after the prefix when the turns are shorter than that
        (:func:`inferscale.kv.serving.gap_for_bucket`). Tokenises once; runs no model."""
        prefix = self._engine.system_prefix_ids() if self._config.encode_after_system_prefix else []
        window = context_turns(context, self._config.context_window)
        turns = self._engine.context_token_ids(window) if window else []
        fact_ids = self._engine.fact_token_ids(text)
        return [
            EncodeRequest(fact_ids=fact_ids, context_ids=prefix + turns, position_gap=gap_for_bucket(b, len(turns)))
            for b in buckets
        ]

    def check_chains(self) -> None:
        """Refuse chains (``kv.chain_block``) on an engine that cannot encode them; nothing when chains are off.

        Raises:
            UnsupportedModelError: when chains are on and the model has sliding-window layers
                (:attr:`~inferscale.engines.base.Engine.encodes_chains`).
        """
        if self._config.chains and not self._engine.encodes_chains:
            raise UnsupportedModelError(
                "kv.chain_block needs a model without sliding-window attention: this one's layers attend over a "
                "window, and facts cannot be encoded on stored K/V on it; set kv.chain_block=0"
            )

    def chained(self, link: ChainLink) -> bool:
        """Whether the memory of ``link`` is encoded on the stored K/V of earlier memories under these settings
        (chains on, and the memory in a chain but not its anchor)."""
        return self._config.chains and link.chained

    def span_requests(self, text: str, context: Sequence[str], chain_from: int | None = None) -> list[EncodeRequest]:
        """Requests with the positions a memory's encoding needs, one per position bucket: :meth:`requests`; for a
        chained memory (:meth:`chained`), the one request over ``[prefix][the tokens of the memories it is chained
        on][fact]``, whose span is the chained encoding's (their stored K/V stand where their tokens would), or,
        when that does not fit, the request it is encoded by instead (:meth:`chain_fallback`)."""
        link = ChainLink(text, tuple(context), chain_from)
        if not self.chained(link):
            return self.requests(text, context, self._config.position_buckets)
        fallback = self.chain_fallback(link)
        return [fallback] if fallback is not None else [self._chain_span_request(link)]

    def _chain_span_request(self, link: ChainLink) -> EncodeRequest:
        before = [
            t
            for member in chained_on(link, self._config.chain_window)
            for t in self._engine.fact_token_ids(member.text)
        ]
        return EncodeRequest(self._engine.fact_token_ids(link.text), self._engine.system_prefix_ids() + before)

    def chain_fallback(self, link: ChainLink) -> EncodeRequest | None:
        """``None`` when a chained memory's chain fits the model's context window with it; else what it is encoded
        by instead: as an anchor, after the last of its last w context turns that fit (none when no turn fits).

        A chain can stop fitting after it is stored: a deletion or re-wording in its block slides a longer text of
        the block into its window. The fallback depends only on the stored memory, the model and the tokenizer, all
        in its key (text, context and chain start; the model fingerprint), so its K/V are what a fresh encoding
        gives. Tokenises; runs no model."""
        if self._chain_span_request(link).span <= self._engine.max_context_tokens:
            return None
        turns = self._last_fitting_turns(link.text, context_turns(link.context, self._config.context_window))
        return self.requests(link.text, turns or (), (0,))[0]

    def _last_fitting_turns(self, text: str, turns: Sequence[str]) -> tuple[str, ...] | None:
        """The most of the last of ``turns`` after which ``text``'s encoding fits the model's context window at
        every position bucket (``()``: it fits after none of them), or ``None`` when it does not fit even alone."""
        for keep in range(len(turns), -1, -1):
            kept = tuple(turns[len(turns) - keep :])
            if self._fits(text, kept):
                return kept
        return None

    def check(self, memories: Sequence[tuple[str, str, Sequence[str], int | None]]) -> None:
        """Refuse memories whose encoding reaches past the model's context window at some position bucket.

        Args:
            memories: ``(name, text, context, chain_from)`` of each, ``name`` saying what it is in the message
                (``"the memory 'My dog…'"``).

        Raises:
            InvalidInputError: naming the first memory that does not fit, the positions it needs and the context
                (:func:`inferscale.kv.encode.check_spans`, the message the engine's own check gives).
        """
        if not memories:
            return
        limit = self._engine.max_context_tokens
        for name, text, context, chain_from in memories:
            requests = self.span_requests(text, context, chain_from)
            check_spans(requests, limit, names=[name] * len(requests))

    @property
    def context_window(self) -> int:
        """w, the context turns a memory that is not chained is encoded after."""
        return self._config.context_window

    @property
    def chain_block(self) -> int:
        """B, the memories of a chain's block (``kv.chain_block``; 0: no chains)."""
        return self._config.chain_block

    def fits(self, record: MemoryRecord) -> bool:
        """Whether ``record``'s encoding fits the model's context window at every position bucket."""
        return self._fits(record.text, record.context, record.chain_from)

    def fits_after(self, text: str, turns: Sequence[str]) -> bool:
        """Whether a memory of ``text`` encoded after (system prefix) + its last w of ``turns`` fits the model's
        context window at every position bucket (the encoding of a memory that is not chained)."""
        return self._fits(text, turns)

    def fits_alone(self, text: str) -> bool:
        """Whether a memory of ``text``'s context-free encoding (its fact tokens right after the system prefix) fits
        the model's context window."""
        return all(r.span <= self._engine.max_context_tokens for r in self.requests(text, (), (0,)))

    def fits_new(self, new: NewMemory) -> bool:
        """Whether a new memory's encoding, as it is to be stored, fits the model's context window."""
        return self._fits(new.text, new.context, new.chain_from)

    def _fits(self, text: str, context: Sequence[str], chain_from: int | None = None) -> bool:
        limit = self._engine.max_context_tokens
        return all(r.span <= limit for r in self.span_requests(text, context, chain_from))

    def fitting_context(self, name: str, text: str, context: Sequence[str]) -> tuple[str, ...]:
        """The context a new memory of ``text`` is stored with so that its encoding fits the model's context window
        at every position bucket: ``context`` as it is when its last w turns fit; else its last turns that fit (the
        most that do; every turn before them is dropped, so none slides into the window).

        Args:
            name: what the memory is, for the message (``"the memory 'My dog…'"``).

        Raises:
            InvalidInputError: when the fact does not fit even after no turn (the system prefix alone, at the
                farthest position bucket), naming it and the positions it needs
                (:func:`inferscale.kv.encode.check_spans`, the message the engine's own check gives).
        """
        window = context_turns(context, self._config.context_window)
        kept = self._last_fitting_turns(text, window)
        if kept is not None:
            return tuple(context) if len(kept) == len(window) else kept
        alone = self.requests(text, (), self._config.position_buckets)
        check_spans(alone, self._engine.max_context_tokens, names=[name] * len(alone))
        return ()


def span_steps(layout: Callable[[], EncodingLayout], changes: ChangeSet) -> Steps[ChangeSet]:
    """``changes`` as they are to be written, once every memory they add or re-word is known to fit the model's
    context window when encoded: a new memory keeps the last of its context turns that fit
    (:meth:`EncodingLayout.fitting_context`; logged at INFO when turns are dropped), and a new text given to a stored
    memory must fit after that memory's stored turns. Reads each re-worded memory's context (one read per update
    with a text); an id that names no memory is left to the write to report. ``changes`` are validated first as
    the write validates them (:func:`~inferscale.storage.change_sets.validate_changes`), so a text no backend can
    store is refused with the store's own message before any tokenizer sees it.

    Args:
        layout: builds the :class:`EncodingLayout`; called only when ``changes`` adds or re-words a memory.

    With chains (``kv.chain_block``), an anchor whose turns are cut changes the chain of the adds after it in
    ``changes`` that continue its block: they are chained anew from it as it is stored (:func:`_rechained`), so
    every chain they store is one a stored memory holds.

    Returns:
        ``changes``, with the context of each new memory that needed it cut (and its count of neighbour turns with
        it); the same object when nothing was cut.

    Raises:
        InvalidInputError: for changes the write would refuse (an empty or unstorable text, a bad id or metadata),
            or naming the first memory that does not fit: a fact too long even after the system prefix alone, or a
            new text too long after its memory's turns. Nothing has been written.
        UnsupportedModelError: when chains are on and the model cannot encode them
            (:meth:`EncodingLayout.check_chains`). Nothing has been written.
    """
    validate_changes(changes)
    memories: list[tuple[str, str, Sequence[str], int | None]] = []
    for update in changes.updates:
        if update.text is not None:
            record: MemoryRecord | None = yield MemoryById(update.memory_id)
            if record is not None:
                name = f"the new text {preview(update.text)} of memory {update.memory_id!r}"
                memories.append((name, update.text, record.context, record.chain_from))
    if not memories and not changes.adds:
        return changes
    built = layout()
    built.check_chains()
    built.check(memories)
    replanned: dict[ChainLink, ChainLink] = {}
    fitted: list[NewMemory] = []
    for planned in changes.adds:
        new = _fitted(built, _rechained(built, planned, replanned))
        if new is not planned:
            replanned[_link(planned)] = _link(new)
        fitted.append(new)
    if not replanned:
        return changes
    return dataclasses.replace(changes, adds=tuple(fitted))


def _link(new: NewMemory) -> ChainLink:
    return ChainLink(new.text, new.context, new.chain_from)


def _rechained(layout: EncodingLayout, new: NewMemory, replanned: Mapping[ChainLink, ChainLink]) -> NewMemory:
    """``new`` as it continues its block after the memory before it was stored otherwise than planned (an anchor
    whose turns were cut, or a memory chained anew): from that memory as stored
    (:func:`inferscale.chains.next_in_chain`), or as an anchor with the last w texts before it when that block is
    full. ``new`` itself when it is in no chain, is an anchor, or the memory before it is stored as planned."""
    if new.chain_from is None or new.chain_from >= len(new.context):
        return new
    before = replanned.get(ChainLink(new.context[-1], new.context[:-1], new.chain_from))
    if before is None:
        return new
    continued = next_in_chain(before, layout.chain_block)
    if continued is None:
        turns = anchor_context(new.context, layout.context_window)
        continued = (turns, len(turns))
    context, chain_from = continued
    return dataclasses.replace(new, context=context, neighbours=len(context), chain_from=chain_from)


def _fitted(layout: EncodingLayout, new: NewMemory) -> NewMemory:
    """``new`` with its context cut to the turns that fit (:meth:`EncodingLayout.fitting_context`); ``new`` itself
    when all fit. The turns dropped are the first ones, so its count of neighbour turns (which lead the context)
    drops with them; an anchor keeps its chain start at the end of its cut context. A chained memory is stored as
    planned: when its chain does not fit, it is encoded after the last of its turns that fit instead
    (:meth:`EncodingLayout.chain_fallback`), so only a fact too long after the system prefix alone is refused."""
    name = f"the memory {preview(new.text)}" + (f" (id {new.memory_id})" if new.memory_id is not None else "")
    if layout.chained(_link(new)):
        if not layout.fits_new(new):
            layout.fitting_context(name, new.text, ())  # raises: the fact does not fit after no turn
        return new
    context = layout.fitting_context(name, new.text, new.context)
    dropped = len(new.context) - len(context)
    if not dropped:
        return new
    if new.chain_from is not None:  # an anchor
        new = dataclasses.replace(new, chain_from=len(context))
    log.info(
        "the memory %s keeps its last %d context turns (it had %d): more would not fit the model's context once "
        "encoded",
        preview(new.text),
        len(context),
        len(new.context),
    )
    return dataclasses.replace(new, context=context, neighbours=max(0, new.neighbours - dropped))


__all__ = ["PREVIEW_CHARS", "EncodingLayout", "context_turns", "preview", "span_steps"]
