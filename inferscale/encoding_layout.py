"""What a memory's K/V encoding lays out, and whether it fits the model's context window.

A memory is encoded after (system prefix) + (its last w context turns), at each position bucket
(:attr:`~inferscale.config.KVConfig.position_buckets`). :class:`EncodingLayout` is the one place that turns a memory's
text and context into the engine's :class:`~inferscale.kv.encode.EncodeRequest`: the K/V manager encodes what it
builds (:class:`~inferscale.fact_kv.FactKVManager`), and ``add``, ``update`` and ``chat`` measure it. Measuring needs
the engine's tokenizer alone (the token-layout methods of :class:`~inferscale.engines.base.Engine` load no weights),
so :func:`span_steps` refuses a memory too long for the model's context before anything is stored, in every
``kv.encode_on_add`` mode, without a model load.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from inferscale.config import KVConfig
from inferscale.engines.base import Engine
from inferscale.kv.encode import EncodeRequest, check_spans
from inferscale.kv.serving import gap_for_bucket
from inferscale.steps import MemoryById, Steps
from inferscale.storage import MemoryRecord
from inferscale.storage.change_sets import ChangeSet

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

    def check(self, memories: Sequence[tuple[str, str, Sequence[str]]]) -> None:
        """Refuse memories whose encoding reaches past the model's context window at some position bucket.

        Args:
            memories: ``(name, text, context)`` of each, ``name`` saying what it is in the message
                (``"the memory 'My dog…'"``).

        Raises:
            InvalidInputError: naming the first memory that does not fit, the positions it needs and the context
                (:func:`inferscale.kv.encode.check_spans`, the message the engine's own check gives).
        """
        if not memories:
            return
        limit = self._engine.max_context_tokens
        buckets = self._config.position_buckets
        for name, text, context in memories:
            check_spans(self.requests(text, context, buckets), limit, names=[name] * len(buckets))

    def fits(self, record: MemoryRecord) -> bool:
        """Whether ``record``'s encoding fits the model's context window at every position bucket."""
        limit = self._engine.max_context_tokens
        return all(r.span <= limit for r in self.requests(record.text, record.context, self._config.position_buckets))


def span_steps(layout: Callable[[], EncodingLayout], changes: ChangeSet) -> Steps[None]:
    """Refuse ``changes`` before they are written when a memory it adds, or a new text it gives a stored memory (in
    that memory's stored context), would not fit the model's context window once encoded: what the encoder would
    refuse later. Reads each re-worded memory's context (one read per update with a text); an id that names no
    memory is left to the write to report.

    Args:
        layout: builds the :class:`EncodingLayout`; called only when ``changes`` adds or re-words a memory.

    Raises:
        InvalidInputError: naming the first memory that does not fit (see :meth:`EncodingLayout.check`); nothing
            has been written.
    """
    memories: list[tuple[str, str, Sequence[str]]] = [
        (f"the memory {preview(new.text)}", new.text, new.context) for new in changes.adds
    ]
    for update in changes.updates:
        if update.text is not None:
            record: MemoryRecord | None = yield MemoryById(update.memory_id)
            if record is not None:
                name = f"the new text {preview(update.text)} of memory {update.memory_id!r}"
                memories.append((name, update.text, record.context))
    if memories:
        layout().check(memories)


__all__ = ["PREVIEW_CHARS", "EncodingLayout", "context_turns", "preview", "span_steps"]
