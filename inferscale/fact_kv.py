"""Bridges memories (SQL rows) and their K/V (the KV store): look up, encode misses in batches, record entries.

A memory's K/V are keyed by its id, its text hash, the engine's model fingerprint (weights, dtype, whole config,
whole tokenizer) and its encoding key (the system prefix's token ids, its context turns, w, the encoding mode, the
position bucket, the storage format): everything its K/V depend on (:mod:`inferscale.kv.fingerprint`). An edited
text, another model, system prompt, context or setting (the storage format among them) is a miss and the fact is
encoded again; entries of an older key format are pruned when their memory is encoded again.

A memory has one encoding per position bucket, and with ``kv.first_memory_context_free`` (the default) one more, its
context-free encoding (:data:`CONTEXT_FREE`: after the system prefix alone, keyed as w=0), which serves it when a chat
lays it out first; a memory without turns or chain has one encoding, which serves both
(:meth:`FactKVManager.canonical`). A re-worded, deleted or re-contexted memory loses every entry, its context-free one
included, and is encoded again.

With an 8-bit ``kv.storage_format`` a fact is quantised once, right after it is encoded (pre-RoPE keys), and is
stored, cached and returned in 8 bits; the engine dequantises it when it assembles the cache.

With chains on (``kv.chain_block``), a chained memory is encoded on the stored K/V of the memories before it in its
block (:mod:`inferscale.chains`): those are looked up by text in its exact scope, and encoded (and stored) first where
no tier holds them; one with no stored memory of that text and context any more is encoded without being stored.
Either way a chained memory is encoded on its chain's K/V as stored (8-bit ones as their codes give them back), so its
K/V do not depend on which of them were stored before.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from inferscale.chains import ChainLink, chained_on
from inferscale.config import KVConfig
from inferscale.control_tokens import holds_control_token
from inferscale.encoding_layout import EncodingLayout, context_turns, preview
from inferscale.engines.base import Engine, check_prompt_fits
from inferscale.errors import InferScaleError, MemoryNotFoundError
from inferscale.kv.encode import EncodeRequest, chunk_length
from inferscale.kv.fact import FactKV
from inferscale.kv.fingerprint import encoding_key, is_current_encoding, token_ids_digest
from inferscale.kv.serving import bucket_per_fact
from inferscale.kv.store import KVKey, KVStore
from inferscale.kv.tiers import DiskTier, KVFormatError
from inferscale.reconcile import entry_key, filed_here
from inferscale.scope import Scope
from inferscale.storage import MemoryRecord, MemoryStore, hash_text
from inferscale.storage.kv_entries import delete_kv_entry_rows_sized
from inferscale.storage.queries import kv_entries_of

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Encoding:
    """Which of a memory's encodings: at position bucket ``bucket`` (tokens after the system prefix) after its
    context turns (or on its chain), or, with ``context_free``, right after the system prefix with no turns
    (``kv.first_memory_context_free``), always at bucket 0.

    Raises:
        ValueError: for a context-free encoding at a bucket other than 0 (its key and its K/V would disagree).
    """

    bucket: int = 0
    context_free: bool = False

    def __post_init__(self) -> None:
        if self.context_free and self.bucket != 0:
            raise ValueError(
                f"a context-free encoding sits right after the system prefix (bucket 0), not {self.bucket}"
            )


IN_CONTEXT = Encoding()
"""A memory's encoding after its context turns (or on its chain), right after the system prefix: the one the
default position buckets store."""

CONTEXT_FREE = Encoding(0, context_free=True)
"""A memory's context-free encoding: its fact tokens right after the system prefix alone."""

Wanted = tuple[MemoryRecord, Encoding]
"""A memory and which of its encodings a call wants."""

ChainMemo = dict[tuple[Scope, ChainLink], FactKV]
"""The K/V of the chain links one call has encoded or read, per exact scope (a scope's chain never uses another's)."""

FITTING_CACHE_SIZE = 65_536
"""How many memory keys :meth:`FactKVManager.fit` remembers the fit of (then it starts again)."""


@dataclass(frozen=True, slots=True)
class Pruned:
    """What :meth:`FactKVManager.prune` removed, or in a dry run would remove.

    Attributes:
        copies: entry copies removed from the tiers (an entry cached in memory and on disk counts twice).
        rows: ``kv_entries`` rows deleted.
        nbytes: the size of the K/V tensors those rows recorded (bytes; an 8-bit entry's codes and scales).
    """

    copies: int
    rows: int
    nbytes: int


def _current_format(key: KVKey) -> bool:
    """Whether ``key`` is in a key format this version reads (:func:`inferscale.kv.fingerprint.is_current_encoding`)."""
    return is_current_encoding(key.encoding_key)


Fit = Literal["context", "alone", "none"]
"""How a memory's encoding fits the model's context window (:meth:`FactKVManager.fit`): after its context turns (or on
its chain) at every position bucket; only after the system prefix alone; not at all."""


class FactKVManager:
    """K/V for memories, encoded on demand and stored in a :class:`KVStore` with a row per entry in SQL.

    Args:
        engine: the chat engine (encodes facts; its fingerprint keys the entries).
        kv_store: the tiered tensor store.
        db: the SQL store (``kv_entries`` rows).
        config: context window and prefix settings.
    """

    def __init__(self, engine: Engine, kv_store: KVStore, db: MemoryStore, config: KVConfig) -> None:
        self._engine = engine
        self._store = kv_store
        self._db = db
        self._config = config
        self._layout = EncodingLayout(engine, config)
        self._prefix: str | None = None
        self._controls: frozenset[str] | None = None
        self._fits: dict[KVKey, Fit] = {}
        self._token_counts: dict[str, int] = {}

    @property
    def store(self) -> KVStore:
        """The tiered K/V store the entries live in."""
        return self._store

    def _prefix_digest(self) -> str | None:
        """:func:`token_ids_digest` of the engine's system prefix when facts are encoded after it, else ``None``
        (hashed once: the prefix is fixed for the engine's life)."""
        if not self._config.encode_after_system_prefix:
            return None
        if self._prefix is None:
            self._prefix = token_ids_digest(self._engine.system_prefix_ids())
        return self._prefix

    def encoding_key(self, record: MemoryRecord, encoding: Encoding = IN_CONTEXT) -> str:
        """The encoding part of ``record``'s key, e.g. ``"v3;w=5;prefix=system;gap=0;<32 hex>"``: the settings (an
        8-bit storage format among them) and a digest over them, the system prefix's token ids and ``record``'s
        context turns (:func:`inferscale.kv.fingerprint.encoding_key`); for a chained memory, its whole context and
        its chain (``...;chain=3@5;<32 hex>``), which its K/V are a function of (:mod:`inferscale.chains`); for its
        context-free encoding, ``"v3;w=0;prefix=system;gap=0;<32 hex>"`` (see :meth:`canonical`). No tokenising:
        cheap at request time."""
        encoding = self.canonical(record, encoding)
        if encoding.context_free:
            controls = self._holds_control_text([record.text])
            return encoding_key(self._prefix_digest(), (), 0, 0, self._config.storage_format, control_text=controls)
        return self._link_encoding_key(ChainLink.of(record), encoding.bucket)

    def _holds_control_text(self, texts: Sequence[str]) -> bool:
        """Whether one of ``texts`` holds the text of one of the engine's control tokens (read once per engine)."""
        if self._controls is None:
            self._controls = self._engine.control_token_texts()
        return any(holds_control_token(text, self._controls) for text in texts)

    def canonical(self, record: MemoryRecord, encoding: Encoding) -> Encoding:
        """``encoding``, or the one that gives the same K/V and is stored in its place: a memory that is not chained
        and has no context turns is encoded right after the system prefix either way, so its context-free encoding
        is its bucket-0 one (one encoding, one entry)."""
        no_turns = not self.chained(record) and not context_turns(record.context, self._config.context_window)
        return IN_CONTEXT if encoding.context_free and no_turns else encoding

    def _link_encoding_key(self, link: ChainLink, bucket: int = 0) -> str:
        config = self._config
        if self._layout.chained(link) and link.chain_from is not None:
            chain = (config.chain_window, link.chain_from)
            controls = self._holds_control_text([link.text, *link.context])
            return encoding_key(
                self._prefix_digest(),
                link.context,
                config.context_window,
                0,
                config.storage_format,
                chain,
                control_text=controls,
            )
        turns = context_turns(link.context, config.context_window)
        controls = self._holds_control_text([link.text, *turns])
        return encoding_key(
            self._prefix_digest(), turns, config.context_window, bucket, config.storage_format, control_text=controls
        )

    def chained(self, record: MemoryRecord) -> bool:
        """Whether ``record`` is encoded on the stored K/V of earlier memories of its block under these settings."""
        return self._layout.chained(ChainLink.of(record))

    def key(self, record: MemoryRecord, encoding: Encoding = IN_CONTEXT) -> KVKey:
        """The store key of ``record``'s ``encoding`` (by default: after its context turns, right after the
        prefix), under the current engine and settings."""
        return KVKey(record.id, record.hash, self._engine.fingerprint, self.encoding_key(record, encoding))

    def encode_request(self, record: MemoryRecord, encoding: Encoding = IN_CONTEXT) -> EncodeRequest:
        """What to encode for ``record``'s ``encoding`` when it is not chained: its fact tokens after (system prefix)
        + (its last w context turns), ``encoding.bucket`` tokens from the prefix; after the prefix alone for the
        context-free encoding (:meth:`inferscale.encoding_layout.EncodingLayout.requests`)."""
        context = () if encoding.context_free else record.context
        return self._layout.requests(record.text, context, (encoding.bucket,))[0]

    def is_chained_encoding(self, wanted: Wanted) -> bool:
        """Whether ``wanted`` is encoded on the stored K/V of earlier memories: a chained memory's encoding other
        than its context-free one."""
        record, encoding = wanted
        return self.chained(record) and not self.canonical(record, encoding).context_free

    def fit(self, record: MemoryRecord) -> Fit:
        """How ``record``'s encoding fits the model's context window (:data:`Fit`). ``add`` and ``update`` store a
        memory only with the context turns after which it fits, but one stored before can stop fitting after them:
        under a model or engine with a shorter context (vLLM's ``max_model_len``), a larger w or a farther position
        bucket; so can a chained memory's chain, when its block's anchor no longer fits after the anchor's turns.
        Such a memory is served from its context-free encoding (logged once, when first found), which depends on
        none of those. Tokenises a memory the first time it is asked about (its key: id, text hash,
        model, settings and context turns) and remembers the answer (the last :data:`FITTING_CACHE_SIZE`), so a
        chat's hot path tokenises only memories new to it; runs no model."""
        key = self.key(record)
        known = self._fits.get(key)
        if known is not None:
            return known
        in_context = self._layout.fits(record) and self._anchor_fits(record)
        fit: Fit = "context" if in_context else "alone" if self._layout.fits_alone(record.text) else "none"
        if fit == "alone":
            log.warning(
                "memory %s (%s) does not fit the model's context after its context turns; chats serve it from its "
                "encoding after the system prefix alone",
                record.id,
                preview(record.text),
            )
        if len(self._fits) >= FITTING_CACHE_SIZE:
            self._fits.clear()
        self._fits[key] = fit
        return fit

    def _anchor_fits(self, record: MemoryRecord) -> bool:
        """Whether a chained memory's chain can be built: its block's anchor, encoded after the anchor's own turns
        when no tier holds its K/V, fits the model's context window. ``True`` for a memory that is not chained, or
        whose chain does not fit anyway (it is encoded as an anchor then: :meth:`EncodingLayout.chain_fallback`)."""
        link = ChainLink.of(record)
        if not self._layout.chained(link) or link.chain_from is None or self._layout.chain_fallback(link) is not None:
            return True
        anchor = link.context[link.chain_from]
        return self._layout.fits_after(anchor, link.context[: link.chain_from])

    def fact_tokens(self, record: MemoryRecord) -> int:
        """How many tokens ``record``'s line takes in the memory segment (its fact token ids), remembered by text
        hash (the last :data:`FITTING_CACHE_SIZE`) so that a chat tokenises only memories new to it; runs no model."""
        known = self._token_counts.get(record.hash)
        if known is None:
            if len(self._token_counts) >= FITTING_CACHE_SIZE:
                self._token_counts.clear()
            known = self._token_counts[record.hash] = len(self._engine.fact_token_ids(record.text))
        return known

    def servable(self, records: Sequence[MemoryRecord]) -> list[MemoryRecord]:
        """Those of ``records`` whose encoding fits the model's context window, after their context turns or after
        the system prefix alone (:meth:`fit`), in order. Each other one is left out with a warning naming it: a text
        stored under a model with a longer context can never be encoded here, and must not fail every chat that
        retrieves it."""
        kept = []
        for record in records:
            if self.fit(record) != "none":
                kept.append(record)
            else:
                log.warning(
                    "memory %s (%s) does not fit the model's context even without its context turns; it is left out "
                    "of chats: shorten it (update) or delete it",
                    record.id,
                    preview(record.text),
                )
        return kept

    def fitting(
        self,
        records: Sequence[MemoryRecord],
        *,
        prefix_tokens: int,
        rest_tokens: int,
        context_tokens: int,
        chosen: bool = False,
    ) -> list[MemoryRecord]:
        """Those of ``records`` that fit a context window of ``context_tokens`` together with the system prefix, the
        conversation and the answer budget, in order: each memory is kept when the prompt with it and the memories
        kept before it fits, so a memory ranked lower gives way to those ranked above it (a shorter one ranked below
        a memory left out may still be kept). Checked from token counts
        (:meth:`fact_tokens`), so a request bound to fail costs no forward pass. Each memory left out is logged: one
        long memory, or many, must not fail every chat of their scope. Memories the caller ``chosen`` by id are all
        kept, and the prompt they make must fit.

        Args:
            records: the memories, best first (retrieval rank), or in the caller's order when ``chosen``.
            prefix_tokens: the system prefix's length (tokens).
            rest_tokens: the conversation's tokens plus the answer budget (tokens).
            context_tokens: the serving engine's context window (tokens): the model's, or vLLM's ``max_model_len``.
            chosen: ``True`` when the caller named ``records`` (``memory_ids``): none is left out.

        Raises:
            ContextLengthError: when the prompt of the memories kept does not fit: the conversation and the answer
                budget alone do not (raised before any memory is looked at, so none is logged as left out), or the
                memories ``chosen`` do not with them
                (:func:`~inferscale.engines.base.check_prompt_fits`).
        """
        check_prompt_fits(prefix_tokens, 0, rest_tokens, context_tokens)  # before any memory's warning
        kept: list[MemoryRecord] = []
        total = prefix_tokens + rest_tokens
        for record in records:
            tokens = self.fact_tokens(record)
            if chosen or total + tokens <= context_tokens:
                kept.append(record)
                total += tokens
            else:
                log.warning(
                    "memory %s (%s) is left out of this chat: with the conversation, the answer budget and the "
                    "memories ranked above it that fit (%d), it would not fit the context of %d tokens",
                    record.id,
                    preview(record.text),
                    len(kept),
                    context_tokens,
                )
        memory_tokens = total - prefix_tokens - rest_tokens
        check_prompt_fits(prefix_tokens, memory_tokens, rest_tokens, context_tokens)
        return kept

    def check(self, records: Sequence[MemoryRecord]) -> None:
        """Refuse ``records`` when one's encoding does not fit the model's context window even after the system
        prefix alone (``chat`` with explicit ``memory_ids``; one that fits only so is served from its context-free
        encoding, :meth:`fit`).

        Raises:
            InvalidInputError: naming the first memory that does not fit by its id.
        """
        unfit = [(f"memory {r.id!r}", r.text, (), None) for r in records if self.fit(r) == "none"]
        self._layout.check(unfit)

    def ensure(self, records: Sequence[MemoryRecord]) -> list[FactKV]:
        """K/V of every record as served in this order: each fact encoded at the position bucket nearest to its
        offset in the memory segment (:func:`inferscale.kv.serving.bucket_per_fact`), the first one from its
        context-free encoding with ``kv.first_memory_context_free``; store hits as they are, misses encoded in
        batches, quantised to ``kv.storage_format`` and stored (returned as stored: 8-bit ones as codes and scales).

        Raises:
            KVFingerprintMismatchError: when a stored file was written under another key (never injected).
        """
        buckets = self._config.position_buckets
        if len(buckets) == 1:
            chosen = [Encoding(buckets[0])] * len(records)
        else:
            lengths = [len(self._engine.fact_token_ids(r.text)) for r in records]
            chosen = [Encoding(b) for b in bucket_per_fact(lengths, buckets)]
        if self._config.first_memory_context_free and records:
            chosen[0] = CONTEXT_FREE
        chosen = [CONTEXT_FREE if self.fit(r) == "alone" else e for r, e in zip(records, chosen, strict=True)]
        return self._ensure(list(zip(records, chosen, strict=True)))

    def prepare(self, records: Sequence[MemoryRecord]) -> None:
        """Encode and store every encoding of every record (the eager encoding of ``add``), so no later request
        encodes on its path.

        Raises:
            KVFingerprintMismatchError: when a stored file was written under another key.
        """
        self._ensure(self.every_encoding(records))

    def every_encoding(self, records: Sequence[MemoryRecord]) -> list[Wanted]:
        """``(record, encoding)`` for each record and each of its encodings: one per position bucket, record by
        record, then with ``kv.first_memory_context_free`` each record's context-free one unless it is its bucket-0
        one (:meth:`canonical`); a record that fits only without its turns (:meth:`fit`) has its context-free one
        alone. The context-free ones come last, so memories that share their context turns stay next to each other
        and a chunk prefills those turns once (:meth:`next_chunk`). What :meth:`prepare` encodes."""
        buckets = [Encoding(bucket) for bucket in self._config.position_buckets]
        alone = [self.fit(record) == "alone" for record in records]
        wanted = [(r, encoding) for r, a in zip(records, alone, strict=True) if not a for encoding in buckets]
        free = self._config.first_memory_context_free
        return wanted + [
            (r, CONTEXT_FREE)
            for r, a in zip(records, alone, strict=True)
            if a or (free and self.canonical(r, CONTEXT_FREE) not in buckets)
        ]

    def missing(self, wanted: Sequence[Wanted]) -> list[Wanted]:
        """Those ``(record, encoding)`` of ``wanted`` whose K/V no tier holds, in order. Counts no store hit or miss
        and loads nothing."""
        return [(r, e) for r, e in wanted if not self._store.contains(self.key(r, e))]

    def chain_first(self, wanted: Sequence[Wanted]) -> list[Wanted]:
        """``wanted`` with, ahead of its first item when that is a chained encoding (:meth:`is_chained_encoding`),
        the stored memories of its chain whose K/V no tier holds (each after those of its own chain), so that they
        are encoded and stored first and its request (:meth:`requests`) finds its whole chain stored. Reads SQL and
        the store's index; encodes nothing.
        """
        if (
            not wanted
            or not self.is_chained_encoding(wanted[0])
            or self._layout.chain_fallback(ChainLink.of(wanted[0][0])) is not None
        ):
            return list(wanted)
        ahead: list[Wanted] = []
        self._missing_chain(ChainLink.of(wanted[0][0]), wanted[0][0].scope(), ahead, set())
        return [*ahead, *wanted]

    def _missing_chain(self, link: ChainLink, scope: Scope, ahead: list[Wanted], seen: set[str]) -> None:
        for member in chained_on(link, self._config.chain_window):
            holder = self._holder(member, scope)
            if holder is None or holder.id in seen or self._store.contains(self.key(holder)):
                continue
            seen.add(holder.id)
            if self.chained(holder) and self._layout.chain_fallback(member) is None:
                self._missing_chain(member, scope, ahead, seen)
            ahead.append((holder, IN_CONTEXT))

    def _holder(self, link: ChainLink, scope: Scope) -> MemoryRecord | None:
        """The oldest memory of exactly ``scope`` whose text, context and chain start are ``link``'s, or ``None``."""
        return next(
            (r for r in self._db.memories_with_hash(hash_text(link.text), scope) if ChainLink.of(r) == link), None
        )

    def next_chunk(self, wanted: Sequence[Wanted], size: int) -> int:
        """How many of the first ``(record, encoding)`` of ``wanted`` to encode in one call of at most ``size``: the
        call does not end among memories that share their context turns, which it would then prefill once more
        (:func:`inferscale.kv.encode.chunk_length`; the facts of one ``add(infer=True)`` call share them; a
        context-free encoding shares none). A chained encoding goes alone, after the calls that store its chain
        (:meth:`chain_first`).

        Raises:
            ValueError: when ``size`` is under 1.
        """
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        if wanted and self.is_chained_encoding(wanted[0]):
            return 1
        window = self._config.context_window
        contexts = [
            None if e.context_free else tuple(context_turns(r.context, window)) or None
            for r, e in wanted[: 2 * size + 1]
        ]
        n = chunk_length(contexts, size)
        return next((i for i in range(1, n) if self.is_chained_encoding(wanted[i])), n)

    def requests(self, wanted: Sequence[Wanted]) -> list[EncodeRequest]:
        """The encode request of each ``(record, encoding)`` (:meth:`encode_request`; tokenises). A chained
        encoding's holds the stored K/V of the memories it is encoded on; it runs the model only when one of them is
        not stored (:meth:`chain_kv` encodes it first: one that no stored memory holds any more, or one
        :meth:`chain_first` did not put ahead).

        Raises:
            KVFingerprintMismatchError: when a stored file was written under another key.
        """
        memo: ChainMemo = {}
        return [
            self._chained_request(record, memo)
            if self.is_chained_encoding((record, encoding))
            else self.encode_request(record, encoding)
            for record, encoding in wanted
        ]

    def _chained_request(self, record: MemoryRecord, memo: ChainMemo) -> EncodeRequest:
        """``record``'s chained encode request: its fact tokens on the prefix and its chain's stored K/V."""
        return self._chained_encode_request(ChainLink.of(record), record.scope(), memo)

    def _chained_encode_request(self, link: ChainLink, scope: Scope, memo: ChainMemo) -> EncodeRequest:
        """A chained memory's encode request: its fact tokens on the prefix and its chain's K/V (:meth:`chain_kv`);
        when its chain does not fit the model's context, the anchor-like request it is encoded by instead
        (:meth:`inferscale.encoding_layout.EncodingLayout.chain_fallback`)."""
        fallback = self._layout.chain_fallback(link)
        if fallback is not None:
            return fallback
        members = self.chain_kv(link, scope, memo)
        return EncodeRequest(
            self._engine.fact_token_ids(link.text), self._engine.system_prefix_ids(), chained_on=members
        )

    def chain_kv(self, link: ChainLink, scope: Scope, memo: ChainMemo | None = None) -> list[FactKV]:
        """The K/V a chained memory is encoded on, oldest first (:func:`inferscale.chains.chained_on`), each as
        stored: read from the store when a memory of exactly ``scope`` with that text, context and chain start is
        stored with it; else encoded first (on its own chain, recursively), then stored under that memory, or, when
        no memory of the scope is that link any more, kept in ``memo`` for this call alone.

        Raises:
            KVFingerprintMismatchError: when a stored file was written under another key.
        """
        memo = {} if memo is None else memo
        return [self._link_kv(member, scope, memo) for member in chained_on(link, self._config.chain_window)]

    def _link_kv(self, link: ChainLink, scope: Scope, memo: ChainMemo) -> FactKV:
        known = memo.get((scope, link))
        if known is not None:
            return known
        record = self._holder(link, scope)
        fact = self._store.get(self.key(record)) if record is not None else None
        if fact is None:
            if self._layout.chained(link):
                request = self._chained_encode_request(link, scope, memo)
            else:
                request = self._layout.requests(link.text, link.context, (0,))[0]
            (fresh,) = self.encode([request])
            fact = fresh.quantized(self._config.storage_format)  # as it is stored
            if record is not None:
                try:
                    (fact,) = self.put([(record, IN_CONTEXT)], [fresh])
                except MemoryNotFoundError:  # deleted meanwhile (another client): its K/V still serve this call
                    log.debug("memory %s was deleted while its K/V were encoded for a chain", record.id)
        memo[(scope, link)] = fact
        return fact

    def encode(self, requests: Sequence[EncodeRequest]) -> list[FactKV]:
        """The engine's K/V of each request, in order (forward passes under the engine's own lock; stores
        nothing): keys and values ``[n_layers, n_kv_heads, n_tokens, head_dim]`` before RoPE, in its dtype.

        Raises:
            InvalidInputError: when a fact with its context reaches past the model's context window.
        """
        return self._engine.encode_facts(requests)

    def _put_serving(self, wanted: Sequence[Wanted], encoded: Sequence[FactKV]) -> list[FactKV]:
        """:meth:`put` for a call that serves the K/V (a chat, the eager encoding of ``add``), where storing them is
        not the point: K/V that cannot be stored, quantised as they would be stored, still serve this call.

        - A memory deleted meanwhile by another client (its row gone between retrieval and storing), or whose text
          or context it changed, is not stored: this call retrieved it in the state it encoded.
        - K/V whose file cannot be written (a full or read-only disk: ``OSError``; a K/V folder whose ``store-id``
          file holds no id: ``KVFormatError``) are logged: the memory is encoded again when next needed. The call
          that encoded them neither fails nor is retried after its change was committed (a retried add is skipped
          as a duplicate and never learns the id).
        """
        served = []
        for item, fresh in zip(wanted, encoded, strict=True):
            try:
                (fact,) = self.put([item], [fresh])
            except MemoryNotFoundError:
                log.debug("memory %s was deleted while its K/V were encoded; they serve this call unstored", item[0].id)
                fact = fresh.quantized(self._config.storage_format)
            except (OSError, KVFormatError) as exc:  # a full or read-only disk; a K/V folder id file not holding one
                log.warning(
                    "the K/V of memory %s could not be stored (%s); they serve this call unstored, and the memory is "
                    "encoded again when next needed",
                    item[0].id,
                    exc,
                )
                fact = fresh.quantized(self._config.storage_format)
            served.append(fact)
        return served

    def put(self, wanted: Sequence[Wanted], encoded: Sequence[FactKV]) -> list[FactKV]:
        """Store ``encoded[i]`` as the K/V of ``wanted[i]`` (a ``(record, encoding)``), quantised once to
        ``kv.storage_format``: its ``kv_entries`` row, then its tensors in every tier; entries of an older key
        format of those memories are pruned.

        Returns:
            The facts as stored (8-bit ones as codes and scales): with a disk tier, each names its file (engines in
            another process read it).

        Raises:
            MemoryNotFoundError: when a record's memory was deleted meanwhile, or its text or context changed
                (:class:`~inferscale.storage.kv_entries.MemoryChangedError`; the facts before it are stored).
            OSError: when the K/V folder, its id or a file cannot be written (the facts before it are stored; a row
                committed before the failed write is a row without a file, which reconciliation removes).
            KVFormatError: when the K/V folder's ``store-id`` file holds anything but an id (nothing is written).
        """
        stored = []
        for (record, encoding), fresh in zip(wanted, encoded, strict=True):
            fact = fresh.quantized(self._config.storage_format)  # once, before it is stored
            stored.append(self._put_one(record, self.key(record, encoding), fact))
        self._prune_older_formats({record.id for record, _ in wanted})
        return stored

    def put_unless_changed(self, wanted: Sequence[Wanted], encoded: Sequence[FactKV]) -> int:
        """:meth:`put`, skipping (logged at DEBUG) each memory deleted, or whose text or context changed, since its
        record was read, instead of stopping there: it is encoded again when next used. Returns how many were stored.

        Raises:
            OSError, KVFormatError: as :meth:`put`.
        """
        stored: list[str] = []
        for (record, encoding), fresh in zip(wanted, encoded, strict=True):
            try:
                self._put_one(record, self.key(record, encoding), fresh.quantized(self._config.storage_format))
            except MemoryNotFoundError:  # changed or deleted by another process since the record was read
                log.debug("memory %s changed while its K/V were stored; left to its next use", record.id)
                continue
            stored.append(record.id)
        self._prune_older_formats(set(stored))
        return len(stored)

    def _prune_older_formats(self, memory_ids: set[str]) -> None:
        """Drop the entries of an older key format of ``memory_ids``, which can never hit again, as their memories
        are encoded anew. What was just stored stays stored whatever this cleanup meets: a leftover is never read,
        and prune_kv or reconciliation removes it later."""
        if not memory_ids:
            return
        try:
            if self._store.prune(memory_ids, _current_format):  # rows only where a copy went: most stores read no SQL
                self._prune_rows(memory_ids, _current_format, self._disk_tier())
        except (OSError, InferScaleError) as exc:
            log.warning("K/V entries of an older format could not be removed (%s); they are never read", exc)

    def served_keys(self, records: Sequence[MemoryRecord]) -> set[KVKey]:
        """The keys under which a chat of this client looks up the K/V of ``records``: each one's encodings
        (:meth:`every_encoding`, for those :meth:`servable`) and its encoding after its context turns at bucket 0,
        the one a chained memory's chain reads (:meth:`chain_kv`). Tokenises each record the first time it is asked
        about (:meth:`fit`); runs no model."""
        kept = self.servable(records)
        return {self.key(r, e) for r, e in self.every_encoding(kept)} | {self.key(r) for r in kept}

    def prune(self, memory_ids: Collection[str], keep: Callable[[KVKey], bool], *, dry_run: bool = False) -> Pruned:
        """Remove every entry of ``memory_ids`` that ``keep`` refuses: its copies in every tier (on disk, the files'
        headers are read), then its ``kv_entries`` row. ``dry_run`` counts the same copies and rows, and removes
        nothing. Only the rows of this client's K/V store go: a row whose file
        another host's K/V folder holds is left to that folder's clients (:func:`inferscale.reconcile.filed_here`),
        and a row whose fields make no key to reconciliation. A row that hosts share (one row per key, naming the
        host that wrote it last) goes with this host's file: another host's file under that key is then removed by
        its own reconciliation, and encoded again there when used.

        Raises:
            KVFormatError: when the K/V folder's ``store-id`` file holds anything but an id (read before anything is
                removed).
            OSError: when a file cannot be removed (no row is deleted then).
            InvalidInputError: when a memory id is not a plain id.
            DatabaseUnavailableError: when the database cannot be connected to (the files are removed; their rows
                are then rows without a file, which reconciliation deletes).
        """
        disk = self._disk_tier()
        if disk is not None:
            disk.existing_store_id()  # a damaged id file is refused before a file goes, not between files and rows
        copies = self._store.prune(memory_ids, keep, dry_run=dry_run)
        sizes = self._prune_rows(memory_ids, keep, disk, dry_run=dry_run)
        return Pruned(copies=copies, rows=len(sizes), nbytes=sum(sizes))

    def _disk_tier(self) -> DiskTier | None:
        """The K/V store's folder as a :class:`DiskTier` (what :func:`~inferscale.reconcile.filed_here` reads), or
        ``None`` without a disk tier."""
        directory = self._store.directory
        return DiskTier(directory) if directory is not None else None

    def _prune_rows(
        self,
        memory_ids: Collection[str],
        keep: Callable[[KVKey], bool],
        disk: DiskTier | None,
        *,
        dry_run: bool = False,
    ) -> list[int]:
        """Delete the ``kv_entries`` rows of ``memory_ids`` that ``keep`` refuses and this client's K/V store wrote
        (see :meth:`prune`); returns the ``nbytes`` of each row deleted (``dry_run``: of each row that would be, none
        deleted)."""
        doomed = []
        rows = self._db.run_read(kv_entries_of, sorted(memory_ids))
        ids_kept = disk is not None and any(row.store_id is not None for row in rows)
        folder_id = disk.existing_store_id() if disk is not None and ids_kept else None
        for row in rows:
            key = entry_key(row)
            ours = filed_here(disk, row, folder_id) if disk is not None else not os.path.isabs(row.location)
            if key is not None and ours and not keep(key):
                doomed.append(row)
        if dry_run:
            return [row.nbytes for row in doomed]
        return self._db.run_write(delete_kv_entry_rows_sized, [row.id for row in doomed]) if doomed else []

    def _put_one(self, record: MemoryRecord, key: KVKey, fact: FactKV) -> FactKV:
        """Store ``fact`` under ``key``: the row, then the tensors; returns the fact as stored (naming its file
        when there is a disk tier).

        Raises:
            MemoryNotFoundError: when the record's memory was deleted meanwhile, or its text or context changed
                (another client's change, committed after the record was read: nothing is written).
            OSError: when the K/V folder, its id or the file cannot be written.
            KVFormatError: when the K/V folder's ``store-id`` file holds anything but an id (nothing is written).
        """
        # The row is committed before the file is renamed into place, so a file on disk always has its row unless
        # the memory was deleted or re-worded since: reconciliation may remove a file without a row (a crash between
        # the two leaves a row without a file, which it removes instead).
        location = self._store.location(key)
        self._db.put_kv_entry(
            memory_id=record.id,
            text_hash=record.hash,
            fingerprint=key.fingerprint,
            encoding_key=key.encoding_key,
            n_tokens=fact.n_tokens,
            nbytes=fact.nbytes,
            location=location,
            store_id=self._store.store_id(),
            encoded_from=record,
        )
        self._store.put(key, fact)
        # With a disk tier, return the entry as the store now holds it, naming its file; without one, ``location``
        # is a tier name, not a file.
        return fact.with_source(location) if self._store.directory is not None else fact

    def _ensure(self, wanted: Sequence[Wanted]) -> list[FactKV]:
        found: list[FactKV | None] = [self._store.get(self.key(r, e)) for r, e in wanted]
        missing = [i for i, fact in enumerate(found) if fact is None]
        plain = [i for i in missing if not self.is_chained_encoding(wanted[i])]
        if plain:  # in batches
            misses = [wanted[i] for i in plain]
            stored = self._put_serving(misses, self.encode(self.requests(misses)))
            for i, fact in zip(plain, stored, strict=True):
                found[i] = fact
        memo: ChainMemo = {}
        for i in missing:  # one at a time, in order, each after the memories of its chain
            if found[i] is None:
                record = wanted[i][0]
                found[i] = self._link_kv(ChainLink.of(record), record.scope(), memo)
        if missing:
            log.debug("encoded %d of %d facts", len(missing), len(wanted))
        complete = [fact for fact in found if fact is not None]
        if len(complete) != len(found):
            raise AssertionError("every K/V lookup miss is encoded above")
        return complete

    def forget(self, memory_id: str) -> None:
        """Remove a memory's K/V from every tier and its ``kv_entries`` rows (after a delete or a new text, the
        transaction that made the change has already deleted the rows)."""
        self._store.delete_memory(memory_id)
        self._db.delete_kv_entries(memory_id)
