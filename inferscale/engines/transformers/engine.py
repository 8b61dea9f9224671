"""The Hugging Face transformers engine: KV injection into a ``DynamicCache``, then query-only prefill.

KV mode (paper: KV injection): the system prefix's K/V (prefilled once and reused), then the k facts' stored
pre-RoPE K/V rotated to their serving positions (:func:`inferscale.kv.compose.assemble`), are written into a fresh
cache; the model prefills only the query tokens, with explicit position ids ``P+S .. P+S+Q-1``, and decodes.
Prompt mode (the Mem0-style baseline): the same fact tokens are prefilled after the same cached prefix.

Why one file over 400 lines: it is one class, the request path from assembly to the last decoded token, which reads
top to bottom; the serving remedies live in :mod:`.remedies`, the cache in :mod:`.cache`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from inferscale.config import EngineConfig
from inferscale.conversation import GREEDY, SamplingSettings
from inferscale.engines.base import (
    Conversation,
    Engine,
    Generation,
    StreamEvent,
    TextDelta,
    check_prompt_fits,
    drain,
)
from inferscale.engines.hf import LayoutTokensMixin, PromptLayout, load_causal_lm, stop_token_ids
from inferscale.engines.hf.answer_text import AnswerText
from inferscale.engines.hf.attention import QueryAttentionProbe, routed_through_sdpa_gqa
from inferscale.engines.hf.layout_only import LayoutOnly, LayoutOnlyCache, load_layout_only, max_positions
from inferscale.engines.hf.threads import choose_threads
from inferscale.engines.transformers.cache import PreallocatedCache
from inferscale.engines.transformers.remedies import MemoryBias, bias_mask, check_remedies, recompute_slots
from inferscale.engines.transformers.sampling import TokenChooser
from inferscale.engines.transformers.workspaces import WorkspacePool
from inferscale.errors import EngineClosedError, InvalidInputError
from inferscale.kv.compose import AssembledKV, PrefixKV, SegmentWorkspace, assemble
from inferscale.kv.encode import EncodeRequest, FactEncoder, check_spans, sliding_window
from inferscale.kv.fact import FactKV
from inferscale.kv.fingerprint import model_fingerprint
from inferscale.kv.recompute import planned_slots, top_scored_slots
from inferscale.kv.rope import RopeTable
from inferscale.kv.serving import ServingSettings

log = logging.getLogger(__name__)


def _now_ms(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() * 1000.0


@dataclass(frozen=True, slots=True)
class ServedCache:
    """A request's cache after assembly and the serving remedies (:meth:`TransformersEngine._kv_cache`).

    Attributes:
        assembled: the prefix + facts segment; ``assembled.n_tokens`` is P + S.
        cache: holds the first :attr:`start` slots of ``assembled``.
        added_tokens: extra tokens the remedies prefill (recomputed memory tokens, and ``selective:r``'s probe).
        pending_ids: the memory tokens still to prefill, before the query and in the same forward pass (a folded
            ``tail:n``); empty otherwise.
    """

    assembled: AssembledKV
    cache: PreallocatedCache
    added_tokens: int
    pending_ids: list[int]

    @property
    def start(self) -> int:
        """The position of the first token to prefill: P + S less the pending tail."""
        return self.assembled.n_tokens - len(self.pending_ids)


class TransformersEngine(LayoutTokensMixin):
    """Chat engine over a transformers causal LM, with KV-injected memory.

    Construction does no I/O; the model loads on first use (or :meth:`load`). The token layout
    (:meth:`system_prefix_ids`, :meth:`fact_token_ids`, :meth:`context_token_ids`, ...) and
    :attr:`max_context_tokens` need only the tokenizer and the config: asked before the model is loaded, they load
    those alone (once, kept until the model loads; :mod:`inferscale.engines.hf.layout_only`).

    Args:
        config: model, dtype, device, attention kernel.
        system_prompt: the instruction before the memory segment.
        home: cache directory (for the embedded model's converted folder).
        encode_batch_size: facts per forward pass when encoding.
        model, tokenizer: an already loaded model and tokenizer (tests, or callers that own the model); when
            given, ``config.model``/``dtype``/``device`` are not used to load anything.
        serving: the fidelity remedies applied to the injected memory at request time
            (:class:`inferscale.kv.serving.ServingSettings`: attention scale s, temperature T, recompute policy).
            Pure injection by default. See :meth:`_kv_cache`.
    """

    def __init__(
        self,
        config: EngineConfig,
        system_prompt: str,
        home: Path | None = None,
        encode_batch_size: int = 16,
        model: Any = None,
        tokenizer: Any = None,
        serving: ServingSettings | None = None,
    ) -> None:
        self._config = config
        self._system_prompt = system_prompt
        self._home = home
        self._batch_size = encode_batch_size
        self._model = model
        self._tokenizer = tokenizer
        self._owns_model = model is None  # close() drops only a model this engine loaded itself
        self._lock = threading.RLock()
        self._ready = False
        self._layout_only = LayoutOnlyCache(self._load_layout_only)
        self.serving = serving if serving is not None else ServingSettings()

    # ---------------------------------------------------------------- loading
    def load(self) -> TransformersEngine:
        """Load the model, tokenizer, rope table, system prefix K/V and fingerprint (once). Returns ``self``."""
        if self._ready:  # loaded: return without queueing for the model's lock behind a forward pass
            return self
        with self._lock:
            if self._ready:
                return self
            threads = choose_threads(self._config.num_threads)
            if threads is not None:
                torch.set_num_threads(threads.threads)
                log.info("torch CPU threads: %d (%s)", threads.threads, threads.reason)
            model_id = "custom"
            if self._model is None:
                path, self._model, self._tokenizer = load_causal_lm(self._config, self._home)
                model_id = Path(path).name or path
            self._model.eval()
            self._device = next(self._model.parameters()).device
            self._layout = PromptLayout(self._tokenizer, self._system_prompt)
            self._table = RopeTable.from_model(self._model, self._device)
            pad = self._tokenizer.pad_token_id if self._tokenizer.pad_token_id is not None else 0
            self._encoder = FactEncoder(
                self._model, batch_size=self._batch_size, pad_token_id=pad, rotate_keys=self._table.rotate
            )
            self._encoder.cache_prefix(self._layout.prefix_ids)  # facts encoded after it skip its prefill
            self._stop_ids = stop_token_ids(self._model, self._tokenizer)
            self._prefix = self._prefill_prefix()
            self._workspaces = WorkspacePool(self._prefix)
            self._fingerprint = model_fingerprint(self._model, self._tokenizer, model_id)
            self._ready = True
            self._layout_only.drop()  # the loaded tokenizer answers from now on
            return self

    def load_encoder(self) -> TransformersEngine:
        """:meth:`load`: the model that answers is the one that encodes."""
        return self.load()

    @contextmanager
    def _loaded_and_locked(self) -> Iterator[None]:
        """:meth:`load`, then hold the engine's lock, the engine still loaded: what every call that reads the loaded
        state (the prefix K/V, the workspaces, the encoder, the layout) runs under.

        Raises:
            EngineClosedError: when :meth:`close` ran between this call's load and its turn at the lock (a call in
                flight while its client closes); a call made after the close loads the engine again.
        """
        self.load()
        with self._lock:
            if not self._ready:
                raise EngineClosedError("the engine was closed while this call waited for it; ask again")
            yield

    def _loaded_attribute(self, name: str) -> Any:
        """The loaded engine's attribute ``name``, read without the lock (a property read must not queue behind a
        forward pass).

        Raises:
            EngineClosedError: when :meth:`close` dropped it between this call's load and the read.
        """
        self.load()
        value = getattr(self, name, None)
        if value is None:
            raise EngineClosedError("the engine was closed while this call used it; ask again")
        return value

    def _load_layout_only(self) -> LayoutOnly:
        """The layout and context window before the model is loaded: from the tokenizer and model the caller passed
        in, else from the configured model's tokenizer and config files (no weights)."""
        model, tokenizer = self._model, self._tokenizer  # once: a close() on another thread may drop them meanwhile
        if model is not None and tokenizer is not None:
            config = model.config
            return LayoutOnly(
                PromptLayout(tokenizer, self._system_prompt), max_positions(config), sliding_window(config)
            )
        return load_layout_only(self._config, self._system_prompt, self._home)

    def close(self) -> None:
        """Drop the loaded model (unless the caller passed it in), the system prefix K/V and the rope table, so
        their memory can be freed. Idempotent; the next use loads again."""
        with self._lock:
            if not self._ready:
                return
            del self._prefix, self._workspaces, self._encoder, self._table, self._layout
            if self._owns_model:
                self._model = None
                self._tokenizer = None
            self._ready = False

    def reset_prefix_cache(self) -> None:
        """Nothing to forget: each request builds its own cache on the system prefix (kept for the engine's life,
        and the same for every tenant)."""

    @torch.inference_mode()
    def _prefill_prefix(self) -> PrefixKV:
        ids = torch.tensor([self._layout.prefix_ids], dtype=torch.long, device=self._device)
        positions = torch.arange(ids.shape[1], device=self._device)[None]
        out = self._model(input_ids=ids, position_ids=positions, use_cache=True)
        cache = out.cache
        keys = torch.stack([layer.keys[0] for layer in cache.layers])
        values = torch.stack([layer.values[0] for layer in cache.layers])
        return PrefixKV(keys=keys, values=values, token_ids=ids[0].cpu())

    # ---------------------------------------------------------------- properties
    @property
    def model(self) -> Any:
        """The loaded transformers model (:class:`EngineClosedError` when the engine is closed meanwhile)."""
        return self._loaded_attribute("_model")

    @property
    def model_lock(self) -> threading.RLock:
        """The engine's lock, held around each forward pass of :attr:`model`; see
        :attr:`inferscale.engines.base.Engine.model_lock`."""
        return self._lock

    @property
    def tokenizer(self) -> Any:
        """The loaded tokenizer (:class:`EngineClosedError` when the engine is closed meanwhile)."""
        return self._loaded_attribute("_tokenizer")

    @property
    def stop_token_ids(self) -> list[int]:
        """Token ids that end an answer (end-of-turn and end-of-sequence), sorted: the decode loop stops on them."""
        return sorted(self.load()._stop_ids)

    @property
    def device(self) -> torch.device:
        """Where the model and its KV cache live."""
        return self.load()._device

    @property
    def fingerprint(self) -> str:
        """Model fingerprint (32 hex characters); see :func:`inferscale.kv.fingerprint.model_fingerprint`."""
        return self.load()._fingerprint

    @property
    def rope_table(self) -> RopeTable:
        """The model's cos/sin table (:class:`EngineClosedError` when the engine is closed meanwhile)."""
        table: RopeTable = self._loaded_attribute("_table")
        return table

    @property
    def prefix_kv(self) -> PrefixKV:
        """K/V of the system prefix (post-RoPE), prefilled once at load (:class:`EngineClosedError` when the engine
        is closed meanwhile)."""
        prefix: PrefixKV = self._loaded_attribute("_prefix")
        return prefix

    @property
    def max_context_tokens(self) -> int:
        """The model's context window (tokens): :func:`~inferscale.engines.hf.layout_only.max_positions`
        (``max_position_embeddings``, capped where a ``longrope`` RoPE stops being static). Before the model is
        loaded, read from its config alone (loads no weights)."""
        model = self._model  # read before the flag: a close() meanwhile drops the engine's reference, not the model
        if model is not None and self._ready:
            return max_positions(model.config)
        return self._layout_only.get().max_positions

    @property
    def encodes_chains(self) -> bool:
        """Whether facts can be encoded on stored K/V (``kv.chain_block``): not on a model with sliding-window
        layers. From the loaded model's config, or before the load from its config file alone (loads no weights)."""
        model = self._model
        if model is not None and self._ready:
            return sliding_window(model.config) is None
        return self._layout_only.get().sliding_window is None

    def _check_context(self, memory_tokens: int, rest: int) -> None:
        """Refuse a request whose prefix + memory + query + answer budget passes the context window: it could
        only fail slowly or answer from positions the model never saw."""
        check_prompt_fits(self._prefix.n_tokens, memory_tokens, rest, self.max_context_tokens)

    def _prompt_layout(self) -> PromptLayout:
        """The loaded engine's layout; before the model is loaded (or once it is closed), one over its tokenizer alone
        (same ids)."""
        layout: PromptLayout | None = getattr(self, "_layout", None)  # close() deletes it, from another thread too
        if layout is not None and self._ready:
            return layout
        return self._layout_only.get().layout

    # ---------------------------------------------------------------- encoding
    def encode_facts(self, requests: Sequence[EncodeRequest]) -> list[FactKV]:
        """Pre-RoPE K/V of each fact, ``[n_layers, n_kv_heads, n_tokens, head_dim]`` in the model's dtype.

        Loads the model first when nothing has yet (:meth:`load`), as every other model call does.

        Raises:
            InvalidInputError: when a fact with its context and position gap reaches past the model's context
                window.
            EngineClosedError: when the engine is closed while this call waits for its lock.
        """
        with self._loaded_and_locked():
            check_spans(requests, self.max_context_tokens)
            return self._encoder.encode(requests)

    # ---------------------------------------------------------------- generation
    @staticmethod
    def _cache_from(assembled: AssembledKV) -> PreallocatedCache:
        return PreallocatedCache(assembled.key_buffer, assembled.value_buffer, assembled.n_tokens)

    def assemble(self, facts: Sequence[FactKV]) -> AssembledKV:
        """Prefix K/V followed by the facts' rotated K/V (see :func:`inferscale.kv.compose.assemble`).

        Raises:
            EngineClosedError: when the engine is closed while this call waits for its lock.
        """
        with self._loaded_and_locked():
            return assemble(self._prefix, facts, self._table)

    def generate_kv(
        self,
        conversation: Conversation,
        facts: Sequence[FactKV],
        max_new_tokens: int,
        cache_scope: str = "",
        serving: ServingSettings | None = None,
        sampling: SamplingSettings | None = None,
    ) -> Generation:
        """Answer with the facts' K/V injected; prefill covers only the conversation tokens (and whatever memory
        tokens the recompute policy chooses). :meth:`stream_kv`, drained.

        ``cache_scope`` is unused here: each request builds its own cache, so nothing is shared between tenants.
        ``serving`` overrides :attr:`serving` for this request. ``kv_assembly_ms`` covers the rotation, the cache
        build and the serving remedies (the recompute of chosen memory tokens, the probe prefill of
        ``selective:r``, the key scaling of ``T``); a ``tail:n`` recompute without s or T is prefilled with the
        query instead, in ``prefill_ms``. ``recomputed_tokens`` counts the tokens the remedies prefilled.

        Raises:
            ValueError: when a fact's K/V do not match the model's cache (layers, heads, dtype, device).
            ContextLengthError: when prefix + memories + conversation + ``max_new_tokens`` exceed the model's
                context.
            InvalidInputError: when the chat template refuses the conversation.
            UnsupportedModelError: when a request-time remedy is asked of a model it cannot serve exactly
                (sliding-window attention, attention logit soft-capping).
        """
        return drain(self.stream_kv(conversation, facts, max_new_tokens, cache_scope, serving, sampling))

    def generate_prompt(
        self,
        conversation: Conversation,
        fact_ids: Sequence[Sequence[int]],
        max_new_tokens: int,
        cache_scope: str = "",
        sampling: SamplingSettings | None = None,
    ) -> Generation:
        """Answer with the fact tokens prefilled after the cached system prefix (prompt injection baseline);
        :meth:`stream_prompt`, drained.

        ``cache_scope`` is unused here: each request builds its own cache on the shared system prefix.

        Raises:
            ContextLengthError: when prefix + memories + conversation + ``max_new_tokens`` exceed the model's
                context.
            InvalidInputError: when the chat template refuses the conversation.
        """
        return drain(self.stream_prompt(conversation, fact_ids, max_new_tokens, cache_scope, sampling))

    @torch.inference_mode()
    def stream_kv(
        self,
        conversation: Conversation,
        facts: Sequence[FactKV],
        max_new_tokens: int,
        cache_scope: str = "",
        serving: ServingSettings | None = None,
        sampling: SamplingSettings | None = None,
    ) -> Generator[StreamEvent, None, None]:
        """:meth:`generate_kv`, streamed: a :class:`TextDelta` per decoded token, then the :class:`Generation`.

        This call lays out and checks the request and builds its cache (errors are raised here, before any
        event); the iterator prefills and decodes. The cache lives in a workspace of the request's own and each
        forward pass takes the engine's lock, so several streams may be open and read at once (their steps
        interleave) and the caller may use the engine or the client between two events.

        Raises:
            EngineClosedError: when the engine is closed while this call waits for its lock (before any event), or
                while the stream is read (:meth:`_check_open`).
        """
        settings = serving if serving is not None else self.serving
        with self._loaded_and_locked():
            pool = self._workspaces
            workspace = pool.borrow()
            try:
                t0 = _now_ms(self._device)
                query_ids = self._layout.conversation_ids(conversation)
                self._check_context(sum(f.n_tokens for f in facts), len(query_ids) + max_new_tokens)
                served = self._kv_cache(workspace, facts, len(query_ids) + max_new_tokens, query_ids, settings)
                t1 = _now_ms(self._device)
                bias = self._memory_bias(served.assembled, settings)
            except BaseException:
                pool.give_back(workspace)
                raise
        prompt = served.assembled.token_ids.tolist() + query_ids
        return self._stream(
            pool, workspace, served.cache, served.pending_ids + query_ids, served.start, max_new_tokens, prompt,
            sampling, t0, t1 - t0, bias, memory_tokens=served.assembled.memory_tokens,
            recomputed_tokens=served.added_tokens,
        )  # fmt: skip

    @torch.inference_mode()
    def stream_prompt(
        self,
        conversation: Conversation,
        fact_ids: Sequence[Sequence[int]],
        max_new_tokens: int,
        cache_scope: str = "",
        sampling: SamplingSettings | None = None,
    ) -> Generator[StreamEvent, None, None]:
        """:meth:`generate_prompt`, streamed like :meth:`stream_kv` (same :class:`EngineClosedError`)."""
        with self._loaded_and_locked():
            pool = self._workspaces
            workspace = pool.borrow()
            try:
                t0 = _now_ms(self._device)
                memory_ids = [t for ids in fact_ids for t in ids]
                query_ids = self._layout.conversation_ids(conversation)
                self._check_context(len(memory_ids), len(query_ids) + max_new_tokens)
                capacity = len(memory_ids) + len(query_ids) + max_new_tokens
                cache = self._cache_from(workspace.assemble([], self._table, extra_capacity=capacity))
                prompt = list(self._layout.prefix_ids) + memory_ids + query_ids
                start = self._prefix.n_tokens
            except BaseException:
                pool.give_back(workspace)
                raise
        return self._stream(
            pool, workspace, cache, memory_ids + query_ids, start, max_new_tokens, prompt, sampling, t0, 0.0,
            memory_tokens=len(memory_ids),
        )  # fmt: skip

    @torch.inference_mode()
    def first_token_logits(
        self,
        conversation: Conversation,
        facts: Sequence[FactKV] | None,
        fact_ids: Sequence[Sequence[int]] | None = None,
        serving: ServingSettings | None = None,
    ) -> torch.Tensor:
        """Next-token logits ``[vocab]`` float32 after the prompt: KV mode when ``facts`` is given (served with
        ``serving``, default :attr:`serving`, as :meth:`generate_kv` serves them), else prompt mode over
        ``fact_ids``. Used by exactness tests and the fidelity metrics.

        Raises:
            the errors of :meth:`generate_kv`, and :class:`EngineClosedError` as :meth:`stream_kv`.
        """
        settings = serving if serving is not None else self.serving
        with self._loaded_and_locked():
            pool = self._workspaces
            workspace = pool.borrow()
            try:
                query_ids = self._layout.conversation_ids(conversation)
                bias = None
                if facts is not None:
                    served = self._kv_cache(workspace, facts, len(query_ids), query_ids, settings)
                    cache, ids, start = served.cache, served.pending_ids, served.start
                    bias = self._memory_bias(served.assembled, settings)
                else:
                    ids = [t for f in fact_ids or [] for t in f]
                    assembled = workspace.assemble([], self._table, extra_capacity=len(ids) + len(query_ids))
                    cache, start = self._cache_from(assembled), assembled.n_tokens
                return self._forward(cache, ids + query_ids, start, bias)[0, -1].float()
            finally:
                pool.give_back(workspace)

    def _memory_bias(self, assembled: AssembledKV, settings: ServingSettings) -> MemoryBias | None:
        """The attention bias on the memory slots ``[P, P + S)`` of ``assembled``, or ``None`` when s is 1."""
        if settings.attention_scale == 1.0 or assembled.memory_tokens == 0:
            return None
        return MemoryBias(self._prefix.n_tokens, assembled.n_tokens, settings.memory_logit_bias)

    def _kv_cache(
        self,
        workspace: SegmentWorkspace,
        facts: Sequence[FactKV],
        extra_capacity: int,
        query_ids: Sequence[int] = (),
        serving: ServingSettings | None = None,
    ) -> ServedCache:
        """Assemble prefix + facts into a preallocated cache in ``workspace``, then apply the request-time
        remedies of ``serving`` (default :attr:`serving`): recompute the slots its policy chooses
        (:func:`.remedies.recompute_slots`), and scale the memory keys by ``1/T`` (the temperature).

        A ``tail:n`` recompute with no attention scale or temperature is not run here: the cache is cut back
        before the tail and the tail's tokens are returned as :attr:`ServedCache.pending_ids`, for the caller to
        prefill together with the query in one forward pass. Causal attention gives each tail token exactly what
        :func:`.remedies.recompute_slots` would (everything before it), so the logits are the same; the request
        saves a forward pass and the tail's masked attention (as vLLM serves the tail: the connector claims the
        slots before it and the engine prefills the rest).

        ``query_ids`` are needed only by ``selective:r``, which probes the query's attention to choose slots.

        Raises:
            InvalidInputError: for ``selective:r`` without ``query_ids``.
            UnsupportedModelError: see :func:`~inferscale.engines.transformers.remedies.check_remedies`.
        """
        settings = serving if serving is not None else self.serving
        check_remedies(self._model.config, settings)
        policy = settings.recompute
        lengths = [f.n_tokens for f in facts]
        memory = sum(lengths)
        p = self._prefix.n_tokens
        layouts = (
            [self._layout.line_layout_of(f.token_ids.tolist()) for f in facts] if policy.kind == "structure" else []
        )
        slots = planned_slots(policy, lengths, p, layouts)  # None: chosen after a probe of the query
        if slots is None and not query_ids:
            raise InvalidInputError("selective recompute ranks memory tokens by the query's attention: pass query_ids")
        reserve = memory if slots is None else len(slots)
        assembled = workspace.assemble(facts, self._table, extra_capacity=extra_capacity + max(reserve, len(query_ids)))
        cache = self._cache_from(assembled)
        added = 0
        if slots is None:
            scores = self._query_attention_on_memory(cache, list(query_ids), assembled.n_tokens, p)
            slots = top_scored_slots(scores, p, policy.amount)
            added += len(query_ids)
        added += len(slots)
        if slots and policy.kind == "tail" and settings.attention_scale == 1.0 and settings.temperature == 1.0:
            start = slots[0]
            cache.crop(start)
            return ServedCache(assembled, cache, added, assembled.token_ids[start:].tolist())
        if slots:
            recompute_slots(self._model, cache, assembled.token_ids, slots, assembled.n_tokens)
        if settings.temperature != 1.0 and memory:
            cache.divide_keys(p, p + memory, settings.temperature)
        return ServedCache(assembled, cache, added, [])

    def _query_attention_on_memory(
        self, cache: PreallocatedCache, query_ids: list[int], length: int, start: int
    ) -> torch.Tensor:
        """``[S]`` float32: the attention mass the query tokens put on each memory slot, summed over layers, heads
        and query tokens, from one probe prefill of the query on the injected cache (then discarded)."""
        with QueryAttentionProbe(start, length) as probe, routed_through_sdpa_gqa(self._model):
            self._forward(cache, query_ids, length)
        cache.crop(length)
        return probe.scores()

    def _forward(self, cache: Any, ids: list[int], start: int, bias: MemoryBias | None = None) -> torch.Tensor:
        """Prefill ``ids`` at positions ``start ..`` on ``cache`` (length ``start``); ``[1, 1, vocab]`` logits of the
        last position. With ``bias`` the memory block's attention bias (log s) is added for these tokens."""
        input_ids = torch.tensor([ids], dtype=torch.long, device=self._device)
        positions = torch.arange(start, start + len(ids), device=self._device)[None]
        mask = bias_mask(start, len(ids), bias, next(self._model.parameters()).dtype, self._device)
        # Only the last position's logits are used: projecting every prompt token onto the vocabulary would add
        # T x hidden x vocab multiply-adds to each prefill (at k=50, more than the query's whole prefill).
        out = self._model(
            input_ids=input_ids,
            position_ids=positions,
            attention_mask=mask,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits

    def _stream(
        self,
        pool: WorkspacePool,
        workspace: SegmentWorkspace,
        cache: Any,
        ids: list[int],
        start: int,
        max_new_tokens: int,
        prompt_ids: list[int],
        sampling: SamplingSettings | None,
        t0: float,
        assembly_ms: float,
        bias: MemoryBias | None = None,
        *,
        memory_tokens: int,
        recomputed_tokens: int = 0,
    ) -> Generator[StreamEvent, None, None]:
        """Prefill ``ids`` at positions ``start..`` on top of ``cache`` (built in ``workspace``, given back to the
        pool when the stream ends), then decode, choosing tokens with ``sampling`` (default greedy) until an
        end-of-turn token, a stop string or the budget (``bias`` applies to the prefill and every decoded token).
        Yields a :class:`TextDelta` per token, then the :class:`Generation` (``t0`` is when the request started, in
        ms; ``prompt_ids`` the whole prompt, for the repetition penalty).

        Each forward pass holds the engine's lock; nothing is held between two events, and inference mode is not
        either, so the caller's code between events runs in its own autograd mode. ``pool`` lent ``workspace`` and
        stands for the load the stream was opened on: once the engine is closed (and maybe loaded again), the next
        read raises :class:`~inferscale.errors.EngineClosedError`, the first one included.
        """
        try:
            with self._lock:
                self._check_open(pool)
                chooser = TokenChooser(sampling or GREEDY, prompt_ids, self._device)
                answer = AnswerText(self._tokenizer, (sampling or GREEDY).stop)
            t_prefill = _now_ms(self._device)
            token = self._next_token(pool, chooser, cache, ids, start, bias)
            prefill_ms = _now_ms(self._device) - t_prefill
            generated: list[int] = []
            position = start + len(ids)
            while token not in self._stop_ids and len(generated) < max_new_tokens:
                generated.append(token)
                yield TextDelta(answer.push(token), [token])
                if answer.stopped or len(generated) == max_new_tokens:
                    break  # no forward pass for a token that would not be kept
                token = self._next_token(pool, chooser, cache, [token], position, bias)
                position += 1
            # The budget ended the answer unless a stop string or an end-of-turn token did.
            reason: Literal["stop", "length"] = "stop" if answer.stopped or token in self._stop_ids else "length"
            rest = answer.finish()
            if rest:
                yield TextDelta(rest, [])
            yield Generation(
                text=answer.text,
                token_ids=generated,
                kv_assembly_ms=assembly_ms,
                prefill_ms=prefill_ms,
                total_ms=_now_ms(self._device) - t0,
                prompt_tokens=start + len(ids),
                memory_tokens=memory_tokens,
                recomputed_tokens=recomputed_tokens,
                finish_reason=reason,
            )
        finally:
            pool.give_back(workspace)

    def _next_token(
        self,
        pool: WorkspacePool,
        chooser: TokenChooser,
        cache: Any,
        ids: list[int],
        start: int,
        bias: MemoryBias | None,
    ) -> int:
        """One forward pass of ``ids`` at ``start..`` on ``cache`` under the engine's lock, and the token chosen
        from its last position.

        Raises:
            EngineClosedError: when the engine was closed since ``pool``'s load (:meth:`_check_open`).
        """
        with self._lock, torch.inference_mode():
            self._check_open(pool)
            return chooser.choose(self._forward(cache, ids, start, bias)[0, -1])

    def _check_open(self, pool: WorkspacePool) -> None:
        """Hold the engine's lock when calling.

        Raises:
            EngineClosedError: when the engine is closed, or was closed and loaded again, since ``pool`` (the load's
                workspace pool) lent a stream its workspace: a closed client's stream never goes on, read or not.
        """
        if not self._ready or self._workspaces is not pool:
            raise EngineClosedError("the engine was closed while this answer was streaming; ask again")


def _conforms_to_engine(engine: TransformersEngine) -> Engine:
    """Never called: mypy checks here that :class:`TransformersEngine` implements the whole :class:`Engine`."""
    return engine
