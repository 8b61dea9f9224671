"""The vLLM engine: vLLM's offline ``LLM`` with the InferScale connector, behind the common engine interface.

Where fact K/V come from (route 2 of the design): facts are encoded by :class:`inferscale.kv.FactEncoder` on a
transformers copy of the same weights, in the same dtype, on the engine's device. The system prefix is encoded the
same way (pre-RoPE, positions from 0). A request then names, per segment, a safetensors file with those pre-RoPE
K/V; the connector's workers rotate them to their positions and write them into vLLM's paged cache, so vLLM
prefills only the query (and, under the ``tail:n`` recompute policy, the memory segment's last n tokens, which the
connector leaves to it). ``tests/engines/test_vllm_connector.py`` checks in float32 that this route agrees with
vLLM's own prefill (a single fact encoded after the prefix gives the same first-token log-probabilities as a plain
prefill of the same tokens) and with the transformers engine.

Answers stream: :meth:`VLLMEngine.stream_kv` submits the request to the offline ``LLM``'s ``llm_engine`` and steps it
itself (as ``LLM.generate`` does), routing each step's token deltas to the open streams by request id, so several
streams progress together; the ids become text through :class:`~inferscale.engines.hf.answer_text.AnswerText`, as
in the transformers engine. Sampling maps onto ``vllm.SamplingParams`` (:meth:`VLLMEngine.sampling_params`).

Fact K/V handed in as tensors (:meth:`VLLMEngine.generate_kv`) are staged once per object into a private folder
(the engine core runs in another process); K/V already in the KV store's files are named by path
(:meth:`VLLMEngine.prepare_files`), which is what the OpenAI server does.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Generator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from inferscale.config import EngineConfig
from inferscale.conversation import GREEDY, SamplingSettings
from inferscale.engines.base import Conversation, Engine, Generation, StreamEvent, TextDelta, drain
from inferscale.engines.hf import LayoutTokensMixin, PromptLayout, load_causal_lm, stop_token_ids
from inferscale.engines.hf.answer_text import AnswerText
from inferscale.engines.hf.dtype import loaded_dtype
from inferscale.engines.hf.layout_only import LayoutOnlyCache, load_layout_only, max_positions
from inferscale.engines.vllm.connector import kv_transfer_config
from inferscale.engines.vllm.metadata import SegmentRef
from inferscale.engines.vllm.requests import PreparedRequest, RequestBuilder, vllm_recompute_tail
from inferscale.errors import ContextLengthError, EngineClosedError, InvalidInputError, UnsupportedModelError
from inferscale.kv.encode import EncodeRequest, FactEncoder, check_spans, sliding_window
from inferscale.kv.fact import FactKV
from inferscale.kv.fingerprint import model_fingerprint
from inferscale.kv.rope import RopeTable
from inferscale.kv.serving import ServingSettings

log = logging.getLogger(__name__)

FULL_VOCABULARY = -1
"""``vllm.SamplingParams.logprobs`` (and ``max_logprobs`` of the offline ``LLM``) asking for every token's
log-probability."""
RAW_LOGPROBS = "raw_logprobs"
"""``logprobs_mode`` of the offline ``LLM``: log-softmax of the model's logits, before any sampling processing."""


class VLLMEngine(LayoutTokensMixin):
    """Chat engine on vLLM with KV-injected memory (the same interface as the transformers engine).

    Construction does no I/O; :meth:`load` (or first use) loads the transformers encoder, computes the
    fingerprint, encodes the system prefix and starts vLLM (about 40 s on 2 CPU cores in eager mode). The token
    layout and :attr:`max_context_tokens`, asked before the encoder is loaded, load the tokenizer and config alone
    (once, kept until the encoder loads; :mod:`inferscale.engines.hf.layout_only`).

    Args:
        config: model, dtype, device. ``device`` places the fact encoder; vLLM runs on its own platform.
        system_prompt: the instruction before the memory segment.
        home: cache directory (for the embedded model's converted folder).
        encode_batch_size: facts per forward pass when encoding.
        staging_dir: where K/V handed in as tensors are written for the engine core; ``None`` makes a temporary
            folder that :meth:`close` removes.
        kv_cache_bytes: vLLM's paged KV cache size (bytes).
        max_model_len: vLLM's context limit (tokens); ``None`` keeps the model's.
        enforce_eager: run vLLM without torch.compile / graphs (required for fast start on CPU).
        llm_kwargs: further keyword arguments for ``vllm.LLM`` (override the ones above).
        serving: the request-time remedies: pure injection (the default) or the ``tail:n`` recompute (the memory
            segment's last n tokens prefilled by vLLM instead of injected).

    Raises:
        ConfigError: when ``serving`` asks for a memory attention scale, a temperature or a recompute policy
            other than ``tail:n``, which vLLM cannot apply without a fork
            (:func:`~inferscale.engines.vllm.vllm_recompute_tail` says why).
    """

    def __init__(
        self,
        config: EngineConfig,
        system_prompt: str,
        home: Path | None = None,
        encode_batch_size: int = 16,
        staging_dir: Path | None = None,
        kv_cache_bytes: int = 2 << 30,
        max_model_len: int | None = 4096,
        enforce_eager: bool = True,
        llm_kwargs: Mapping[str, Any] | None = None,
        serving: ServingSettings | None = None,
    ) -> None:
        self.serving = serving if serving is not None else ServingSettings()
        vllm_recompute_tail(self.serving)  # refuse what vLLM cannot apply before anything loads
        self._config = config
        self._system_prompt = system_prompt
        self._home = home
        self._batch_size = encode_batch_size
        self._staging_dir = staging_dir
        self._own_staging = staging_dir is None
        self._kv_cache_bytes = kv_cache_bytes
        self._max_model_len = max_model_len
        self._enforce_eager = enforce_eager
        self._llm_kwargs = dict(llm_kwargs or {})
        self._lock = threading.RLock()
        self._encoder_ready = False
        self._rope_table: RopeTable | None = None
        self._layout_only = LayoutOnlyCache(lambda: load_layout_only(config, system_prompt, home))
        self._ready = False
        self._async_started = False
        self._async_llm: weakref.ref[Any] | None = None
        self._streams: dict[str, deque[Any]] = {}
        """Open streams: vLLM request id -> its step outputs not yet read (routed by :meth:`_next_output`)."""

    # ---------------------------------------------------------------- loading
    def load_encoder(self) -> VLLMEngine:
        """Load the transformers copy of the weights, fingerprint it and encode the system prefix, without starting
        vLLM (once). Returns self. :meth:`load` calls it; a caller that drives vLLM's async engine itself
        (:meth:`start_async_llm`) calls only this."""
        with self._lock:
            if self._encoder_ready:
                return self
            path, self._model, self._tokenizer = load_causal_lm(self._config, self._home)
            self._path = path
            self._layout = PromptLayout(self._tokenizer, self._system_prompt)
            pad = self._tokenizer.pad_token_id if self._tokenizer.pad_token_id is not None else 0
            self._encoder = FactEncoder(
                self._model, batch_size=self._batch_size, pad_token_id=pad, rotate_keys=self._rotate_keys
            )
            self._encoder.cache_prefix(self._layout.prefix_ids)  # facts encoded after it skip its prefill
            self._fingerprint = model_fingerprint(self._model, self._tokenizer, Path(path).name or path)
            self._stop_ids = sorted(stop_token_ids(self._model, self._tokenizer))
            directory = self._staging_dir or Path(tempfile.mkdtemp(prefix="inferscale-vllm-"))
            self._staging_dir = directory
            prefix = self._encoder.encode([EncodeRequest(self._layout.prefix_ids)])[0]
            self._builder = RequestBuilder(self._layout, self._fingerprint, prefix, directory)
            self._encoder_ready = True
            self._layout_only.drop()  # the loaded tokenizer answers from now on
            return self

    def _loaded_attribute(self, name: str, load: Callable[[], object] | None = None) -> Any:
        """The attribute ``name`` once ``load`` ran (default :meth:`load_encoder`; :meth:`load` for vLLM's own).

        Raises:
            EngineClosedError: when :meth:`close` dropped it between this call's load and the read (a call in flight
                while its client closes).
        """
        (load or self.load_encoder)()
        value = getattr(self, name, None)
        if value is None:
            raise EngineClosedError("the engine was closed while this call used it; ask again")
        return value

    def engine_args(self) -> dict[str, Any]:
        """Keyword arguments for ``vllm.LLM`` / ``vllm.AsyncEngineArgs``: the model folder, dtype, eager mode, prefix
        caching, KV cache size (bytes), context limit (tokens), the InferScale connector bound to this model's
        fingerprint, and ``llm_kwargs`` on top. Loads the encoder (for the path and fingerprint)."""
        model = self.model  # loads the encoder
        kwargs: dict[str, Any] = {
            "model": self._path,
            "dtype": loaded_dtype(model),  # what "auto" chose for the encoder: both must agree
            "enforce_eager": self._enforce_eager,
            "enable_prefix_caching": True,
            "kv_cache_memory_bytes": self._kv_cache_bytes,
            "kv_transfer_config": kv_transfer_config(self._fingerprint),
            "seed": 0,
        }
        if self._max_model_len is not None:
            kwargs["max_model_len"] = self._max_model_len
        kwargs.update(self._llm_kwargs)
        return kwargs

    def load(self) -> VLLMEngine:
        """Load the encoder model, fingerprint it, encode the system prefix and start vLLM's offline ``LLM``
        (once). Returns self."""
        if self._ready:  # loaded: return without queueing for the model's lock behind a forward pass
            return self
        with self._lock:
            if self._ready:
                return self
            if self._async_started:
                raise RuntimeError(
                    "this engine started vLLM's async engine (start_async_llm); the offline engine would be a second "
                    "vLLM on the same machine"
                )
            from vllm import LLM

            # full-vocabulary log-probabilities for first_token_logits: this process is the only client
            self._llm = LLM(**{"max_logprobs": FULL_VOCABULARY, "logprobs_mode": RAW_LOGPROBS, **self.engine_args()})
            self._ready = True
            return self

    def start_async_llm(self) -> Any:
        """Start a ``vllm.v1.engine.async_llm.AsyncLLM`` with :meth:`engine_args` (the connector included) and return
        it; the caller owns it and shuts it down (:meth:`close` also shuts it down if it is still alive). For
        concurrent clients (``inferscale bench throughput``); do not also start the offline engine (:meth:`load`)
        in the same process, or two engines share the machine.

        Raises:
            RuntimeError: when the offline engine or an async engine was already started from this object.
        """
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        with self._lock:
            if self._ready or self._async_started:
                raise RuntimeError("a vLLM engine was already started from this object; use a fresh VLLMEngine")
            llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**self.engine_args()))
            self._async_started = True
            self._async_llm = weakref.ref(llm)  # not a strong reference: the caller decides when it is collected
            return llm

    def reset_prefix_cache(self) -> None:
        """Empty vLLM's prefix cache (cold-cache measurements).

        Raises:
            RuntimeError: when vLLM refuses (requests are running), so a "cold" measurement would run warm.
        """
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM did not reset its prefix cache (requests are still running)")

    def close(self) -> None:
        """Shut down the vLLM engine this object started (the offline ``LLM``'s engine core processes, or a live
        ``AsyncLLM`` from :meth:`start_async_llm`), drop the encoder model and remove a temporary staging folder.
        Idempotent. Using the engine afterwards loads and starts everything again (in a new staging folder)."""
        with self._lock:
            if self._ready:
                # The offline LLM's engine core client owns the engine core process and its IPC sockets;
                # EngineCoreClient.shutdown() stops and closes them (the route tests/engines/test_vllm_connector.py
                # uses).
                self._llm.llm_engine.engine_core.shutdown()
                self._streams.clear()  # their requests died with the engine core; their finally has nothing to abort
                del self._llm
                self._ready = False
            async_llm = self._async_llm() if self._async_llm is not None else None
            if async_llm is not None:
                # AsyncLLM.shutdown(): its engine core process and IPC. The caller may have run it already; it is
                # safe to repeat (AsyncLLM.__del__ runs it again too).
                async_llm.shutdown()
            self._async_llm = None
            self._async_started = False
            if self._encoder_ready:
                del self._model, self._tokenizer, self._encoder, self._builder, self._layout
                self._rope_table = None
                self._encoder_ready = False
            if self._own_staging and self._staging_dir is not None:
                shutil.rmtree(self._staging_dir, ignore_errors=True)
                self._staging_dir = None

    # ---------------------------------------------------------------- properties
    @property
    def llm(self) -> Any:
        """The ``vllm.LLM`` instance (:class:`EngineClosedError` when the engine is closed meanwhile)."""
        return self._loaded_attribute("_llm", self.load)

    @property
    def model(self) -> Any:
        """The transformers copy of the weights (the fact encoder's model; :class:`EngineClosedError` when the engine
        is closed meanwhile)."""
        return self._loaded_attribute("_model")

    @property
    def model_lock(self) -> threading.RLock:
        """The engine's lock, held around each forward pass of :attr:`model`; see
        :attr:`inferscale.engines.base.Engine.model_lock`."""
        return self._lock

    @property
    def tokenizer(self) -> Any:
        """The tokenizer (:class:`EngineClosedError` when the engine is closed meanwhile)."""
        return self._loaded_attribute("_tokenizer")

    @property
    def device(self) -> torch.device:
        """Where encoded fact K/V live (the encoder's device)."""
        return next(self.model.parameters()).device

    @property
    def fingerprint(self) -> str:
        """Model fingerprint (32 hex characters) of the transformers copy, which is also vLLM's weights."""
        return self.load_encoder()._fingerprint

    @property
    def max_context_tokens(self) -> int:
        """vLLM's context limit (tokens): ``max_model_len``, or the model's window
        (:func:`~inferscale.engines.hf.layout_only.max_positions`) when none is set (or it is lower). Before the
        encoder is loaded, the model's config is read alone (loads no weights)."""
        model = getattr(self, "_model", None)  # close() deletes it, from another thread too
        if model is not None and self._encoder_ready:
            model_limit = max_positions(model.config)
        else:
            model_limit = self._layout_only.get().max_positions
        return min(self._max_model_len, model_limit) if self._max_model_len is not None else model_limit

    @property
    def encodes_chains(self) -> bool:
        """Whether facts can be encoded on stored K/V (``kv.chain_block``): not on a model with sliding-window
        layers. From the encoder's config, or before it is loaded from the config file alone (loads no weights)."""
        model = getattr(self, "_model", None)  # close() deletes it, from another thread too
        if model is not None and self._encoder_ready:
            return sliding_window(model.config) is None
        return self._layout_only.get().sliding_window is None

    @property
    def stop_token_ids(self) -> list[int]:
        """Token ids that end an answer."""
        return list(self.load_encoder()._stop_ids)

    @property
    def prefix_segment(self) -> SegmentRef:
        """The system prefix's segment file."""
        return self.builder.prefix_ref

    def _prompt_layout(self) -> PromptLayout:
        """The loaded encoder's layout; before it is loaded (or once it is closed), one over the tokenizer alone (same
        ids)."""
        layout: PromptLayout | None = getattr(self, "_layout", None)  # close() deletes it, from another thread too
        if layout is not None and self._encoder_ready:
            return layout
        return self._layout_only.get().layout

    # ---------------------------------------------------------------- encoding
    def _rotate_keys(self, keys: torch.Tensor, start: int) -> torch.Tensor:
        """Pre-RoPE ``keys`` ``[n_layers, n_kv_heads, T, head_dim]`` rotated to positions ``start ..`` by the
        transformers copy's own table, built (and checked, :meth:`RopeTable.from_model`) on the first chained
        encode only: vLLM serves models whose rotation this check would refuse, and only a chained encode needs it.

        Raises:
            UnsupportedModelError: when the model's rotation cannot be reproduced (see :class:`RopeTable`).
        """
        if self._rope_table is None:
            self._rope_table = RopeTable.from_model(self._model)
        return self._rope_table.rotate(keys, start)

    def encode_facts(self, requests: Sequence[EncodeRequest]) -> list[FactKV]:
        """Pre-RoPE K/V ``[n_layers, n_kv_heads, n_tokens, head_dim]`` per fact, by the transformers encoder.

        Raises:
            InvalidInputError: when a fact with its context and position gap reaches past vLLM's context limit
                (``max_model_len``, or the model's window when it is lower).
            EngineClosedError: when the engine is closed between this call's load and its turn at the lock.
        """
        self.load_encoder()
        with self._lock:
            if not self._encoder_ready:
                raise EngineClosedError("the engine was closed while this call waited for it; ask again")
            check_spans(requests, self.max_context_tokens)
            return self._encoder.encode(requests)

    # ---------------------------------------------------------------- requests
    @property
    def builder(self) -> RequestBuilder:
        """Builds prepared requests (prompt ids, payload, salt) for :meth:`run` (:class:`EngineClosedError` when the
        engine is closed meanwhile)."""
        builder: RequestBuilder = self._loaded_attribute("_builder")
        return builder

    def _recompute_tail(self, serving: ServingSettings | None) -> int:
        """n of ``serving``'s ``tail:n`` (default :attr:`serving`), 0 for pure injection (tokens).

        Raises:
            ConfigError: when ``serving`` is a setting vLLM cannot apply (:func:`vllm_recompute_tail`).
        """
        return vllm_recompute_tail(serving if serving is not None else self.serving)

    def prepare_kv(
        self,
        conversation: Conversation,
        facts: Sequence[FactKV],
        cache_scope: str = "",
        serving: ServingSettings | None = None,
    ) -> PreparedRequest:
        """See :meth:`RequestBuilder.prepare_kv`; the recomputed tail is that of ``serving`` (default
        :attr:`serving`).

        Raises:
            ConfigError: when ``serving`` is a setting vLLM cannot apply (see the class).
        """
        return self.builder.prepare_kv(conversation, facts, cache_scope, recompute_tail=self._recompute_tail(serving))

    def prepare_files(
        self,
        conversation: Conversation,
        refs: Sequence[SegmentRef],
        cache_scope: str = "",
        serving: ServingSettings | None = None,
    ) -> PreparedRequest:
        """See :meth:`RequestBuilder.prepare_files`; ``serving`` as in :meth:`prepare_kv`."""
        return self.builder.prepare_files(conversation, refs, cache_scope, recompute_tail=self._recompute_tail(serving))

    def prepare_prompt(
        self, conversation: Conversation, fact_ids: Sequence[Sequence[int]], cache_scope: str = ""
    ) -> PreparedRequest:
        """See :meth:`RequestBuilder.prepare_prompt`."""
        return self.builder.prepare_prompt(conversation, fact_ids, cache_scope)

    def sampling_params(self, sampling: SamplingSettings, max_new_tokens: int) -> Any:
        """``vllm.SamplingParams`` for ``sampling``: temperature (0 is greedy), top-p, top-k (``None`` is vLLM's 0,
        all tokens), seed, repetition penalty, the stop strings (vLLM ends the request on them), the engine's stop
        token ids, ``max_tokens = max(1, max_new_tokens)`` (vLLM decodes at least one token; a budget of 0 drops
        it), and per-step deltas (``RequestOutputKind.DELTA``) for streaming."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            n=1,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=0 if sampling.top_k is None else sampling.top_k,
            seed=sampling.seed,
            repetition_penalty=sampling.repetition_penalty,
            stop=list(sampling.stop),
            stop_token_ids=list(self._stop_ids),
            max_tokens=max(1, max_new_tokens),
            output_kind=RequestOutputKind.DELTA,
        )

    def run(self, requests: Sequence[PreparedRequest], max_new_tokens: int, logprobs: int | None = None) -> list[Any]:
        """Greedy-generate every request in one ``LLM.generate`` call; returns vLLM ``RequestOutput`` objects in
        order (``kv_transfer_params["inferscale"]`` in each reports local hits, injected and recomputed tokens). The
        batched path of the benchmarks and tests.

        Raises:
            RuntimeError: while a stream (:meth:`stream_kv`, :meth:`stream_prompt`) is open: ``LLM.generate``
                steps the engine until it is idle and would swallow the stream's outputs.
            EngineClosedError: when another thread closes the engine between this call's load and its lock.
        """
        from vllm import SamplingParams

        self.load()
        sampling = SamplingParams(
            temperature=0.0, max_tokens=max_new_tokens, stop_token_ids=self._stop_ids, logprobs=logprobs
        )
        pairs = [r.vllm_inputs(sampling) for r in requests]
        prompts: list[Any] = [p for p, _ in pairs]  # token prompts (vLLM's TokensPrompt dicts)
        with self._lock:
            if not self._ready:  # closed by another thread since this call's load
                raise EngineClosedError("the vLLM engine was closed while this call waited for it; ask again")
            if self._streams:
                raise RuntimeError(
                    f"{len(self._streams)} stream(s) of this engine are open; exhaust or close them before run()"
                )
            return list(self._llm.generate(prompts, [s for _, s in pairs], use_tqdm=False))

    # ---------------------------------------------------------------- generation
    def generate_kv(
        self,
        conversation: Conversation,
        facts: Sequence[FactKV],
        max_new_tokens: int,
        cache_scope: str = "",
        serving: ServingSettings | None = None,
        sampling: SamplingSettings | None = None,
    ) -> Generation:
        """Answer with the facts' K/V injected by the connector; vLLM prefills only the conversation (and any part
        of the system prefix not already in its prefix cache is injected too), plus the memory's last n tokens
        under ``tail:n`` (``serving``, default :attr:`serving`; ``recomputed_tokens`` counts them). ``cache_scope``
        salts the prefix cache. :meth:`stream_kv`, drained.

        Raises:
            ConfigError: when ``serving`` is a setting vLLM cannot apply (see the class).
            ContextLengthError: when prefix + memories + conversation + ``max_new_tokens`` exceed vLLM's context
                limit.
            InvalidInputError: when the chat template refuses the conversation.
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
        """Answer with the same fact tokens prefilled by vLLM (the prompt-injection baseline); ``cache_scope``
        salts the prefix cache, so tenants never share blocks. :meth:`stream_prompt`, drained.

        Raises:
            ContextLengthError, InvalidInputError: see :meth:`generate_kv`.
        """
        return drain(self.stream_prompt(conversation, fact_ids, max_new_tokens, cache_scope, sampling))

    def stream_kv(
        self,
        conversation: Conversation,
        facts: Sequence[FactKV],
        max_new_tokens: int,
        cache_scope: str = "",
        serving: ServingSettings | None = None,
        sampling: SamplingSettings | None = None,
    ) -> Generator[StreamEvent, None, None]:
        """:meth:`generate_kv`, streamed: a :class:`TextDelta` per generated token as vLLM produces it, then the
        :class:`Generation`. The request is laid out and checked here (errors raise at the call); it is submitted
        to vLLM on the first ``next()``. Several streams may be open at once (vLLM batches them); closing one
        early aborts its vLLM request.

        Raises:
            the errors of :meth:`generate_kv`.
        """
        t0 = time.perf_counter()
        request = self.prepare_kv(conversation, facts, cache_scope, serving)
        assembly_ms = (time.perf_counter() - t0) * 1000.0
        return self._stream(request, max_new_tokens, sampling or GREEDY, t0, assembly_ms)

    def stream_prompt(
        self,
        conversation: Conversation,
        fact_ids: Sequence[Sequence[int]],
        max_new_tokens: int,
        cache_scope: str = "",
        sampling: SamplingSettings | None = None,
    ) -> Generator[StreamEvent, None, None]:
        """:meth:`generate_prompt`, streamed like :meth:`stream_kv`."""
        t0 = time.perf_counter()
        request = self.prepare_prompt(conversation, fact_ids, cache_scope)
        return self._stream(request, max_new_tokens, sampling or GREEDY, t0, 0.0)

    def _stream(
        self, request: PreparedRequest, max_new_tokens: int, sampling: SamplingSettings, t0: float, assembly_ms: float
    ) -> Generator[StreamEvent, None, None]:
        """Check the request against vLLM's context limit, then return the generator that submits and drains it
        (:meth:`_events`). ``t0`` is when the request started (``time.perf_counter()`` seconds)."""
        self._check_fits(request, max_new_tokens)
        # None once another thread closed the engine: the first read then raises EngineClosedError (_check_open)
        return self._events(getattr(self, "_llm", None), request, max_new_tokens, sampling, t0, assembly_ms)

    def _check_fits(self, request: PreparedRequest, max_new_tokens: int) -> None:
        """Load vLLM, then refuse ``request`` when its prompt and ``max_new_tokens`` exceed vLLM's context limit.

        Raises:
            InvalidInputError: when ``max_new_tokens`` is negative.
            ContextLengthError: when the request does not fit.
        """
        if max_new_tokens < 0:
            raise InvalidInputError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        self.load()
        limit = self.max_context_tokens
        if len(request.prompt_ids) + max_new_tokens > limit:
            raise ContextLengthError.of(
                f"the prompt needs {len(request.prompt_ids) + max_new_tokens} tokens (prompt "
                f"{len(request.prompt_ids)}, of which memories {request.memory_tokens}, answer budget "
                f"{max_new_tokens}) but vLLM's maximum context length is {limit} tokens",
                request.memory_tokens,
            )

    def _events(
        self,
        llm: Any,
        request: PreparedRequest,
        max_new_tokens: int,
        sampling: SamplingSettings,
        t0: float,
        assembly_ms: float,
    ) -> Generator[StreamEvent, None, None]:
        """Submit ``request`` to the offline engine's ``llm_engine`` and yield its tokens as they arrive.

        Generated ids go through :class:`AnswerText` exactly as in the transformers engine: stop token ids end the
        answer and are not part of it, a stop string ends it (vLLM stops on it too; if the text sees it first the
        vLLM request is aborted), a budget of 0 keeps none of vLLM's one token. ``finish_reason`` is ``"stop"``
        for a stop token or string, ``"length"`` when the budget ran out. The ``finally`` aborts the vLLM request
        when the stream is closed before vLLM finished it. ``llm`` is the ``vllm.LLM`` the stream was opened on: when
        the engine was closed (and maybe started again) before the stream is first read, the read raises
        :class:`~inferscale.errors.EngineClosedError` and submits nothing.
        """
        with self._lock:
            self._check_open(llm)  # before anything of the engine's is used: a closed one has none
            tokenizer = self._tokenizer
        prompt, params = request.vllm_inputs(self.sampling_params(sampling, max_new_tokens))
        request_id = f"inferscale-{uuid.uuid4().hex}"
        answer = AnswerText(tokenizer, sampling.stop)
        generated: list[int] = []
        prefill_ms: float | None = None
        vllm_reason: str | None = None
        stop_token = False
        finished = False
        with self._lock:
            self._check_open(llm)
            submitted = time.perf_counter()
            self._llm.llm_engine.add_request(request_id, prompt, params)
            self._streams[request_id] = deque()
        try:
            while not (finished or answer.stopped or stop_token or len(generated) >= max(1, max_new_tokens)):
                output = self._next_output(request_id)
                completion = output.outputs[0]
                if prefill_ms is None and completion.token_ids:
                    prefill_ms = (time.perf_counter() - submitted) * 1000.0
                for token in completion.token_ids:
                    if token in self._stop_ids:
                        stop_token = True
                    if stop_token or answer.stopped or len(generated) >= max_new_tokens:
                        break
                    generated.append(int(token))
                    yield TextDelta(answer.push(token), [int(token)])
                if output.finished:
                    finished, vllm_reason = True, completion.finish_reason
                if max_new_tokens == 0 and completion.token_ids:
                    break
            rest = answer.finish()
            if rest:
                yield TextDelta(rest, [])
            if answer.stopped or stop_token:
                reason: Literal["stop", "length"] = "stop"
            elif len(generated) >= max_new_tokens or vllm_reason == "length":
                reason = "length"
            else:
                reason = "stop"
            end = time.perf_counter()
            yield Generation(
                text=answer.text,
                token_ids=generated,
                kv_assembly_ms=assembly_ms,
                prefill_ms=prefill_ms if prefill_ms is not None else (end - submitted) * 1000.0,
                total_ms=(end - t0) * 1000.0,
                prompt_tokens=len(request.prompt_ids),
                memory_tokens=request.memory_tokens,
                recomputed_tokens=request.recomputed_tokens,
                finish_reason=reason,
            )
        finally:
            with self._lock:
                self._streams.pop(request_id, None)
                if not finished and self._ready:
                    self._llm.llm_engine.abort_request([request_id])

    def _check_open(self, llm: Any) -> None:
        """Hold the engine's lock when calling.

        Raises:
            EngineClosedError: when the engine is closed, or was closed and started again, since the stream that
                was opened on ``llm`` (a ``vllm.LLM``) was built: a closed client's stream never goes on, read or not.
        """
        if not self._ready or getattr(self, "_llm", None) is not llm:
            raise EngineClosedError("the vLLM engine was closed before this stream was read; ask again")

    def _next_output(self, request_id: str) -> Any:
        """The next vLLM ``RequestOutput`` (a delta) of the open stream ``request_id``. Under the engine lock,
        steps the engine until that stream's queue has one, routing every step's outputs to their own streams'
        queues by request id, so streams read from several threads (or interleaved in one) all progress; outputs
        of requests no stream waits for (aborted ones) are dropped.

        Raises:
            EngineClosedError: when the engine was closed while the stream was open.
            RuntimeError: when vLLM no longer has the request and never finished it (it would otherwise be waited
                for forever).
        """
        while True:
            with self._lock:
                queue = self._streams.get(request_id)
                if queue is None or not self._ready:
                    raise EngineClosedError("the vLLM engine was closed while this stream was open")
                if queue:
                    return queue.popleft()
                if not self._llm.llm_engine.has_unfinished_requests():
                    raise RuntimeError(f"vLLM has no request {request_id} left and gave it no final output")
                for output in self._llm.llm_engine.step():
                    target = self._streams.get(output.request_id)
                    if target is not None:
                        target.append(output)

    def first_token_logits(
        self,
        conversation: Conversation,
        facts: Sequence[FactKV] | None,
        fact_ids: Sequence[Sequence[int]] | None = None,
        serving: ServingSettings | None = None,
    ) -> torch.Tensor:
        """Next-token log-probabilities ``[vocab]`` float32 after the prompt, as vLLM computes them: KV mode when
        ``facts`` is given (injected by the connector, served with ``serving``, default :attr:`serving`, as
        :meth:`generate_kv` serves them), else prompt mode over ``fact_ids`` (prefilled by vLLM). Used by the
        fidelity metrics, as the transformers engine's method of the same name.

        vLLM reports every token's log-probability from one greedy step (``logprobs=-1``; the offline ``LLM`` is
        started with ``max_logprobs=-1`` and ``logprobs_mode="raw_logprobs"``): the log-softmax of its raw logits,
        i.e. the logits shifted by one constant, which softmax, KL and argmax ignore. The request is salted with
        an empty cache scope, as :meth:`run`'s callers salt theirs.

        Raises:
            ConfigError: when ``serving`` is a setting vLLM cannot apply (see the class).
            ContextLengthError: when prefix + memories + conversation + 1 token exceed vLLM's context limit.
            InvalidInputError: when the chat template refuses the conversation.
            UnsupportedModelError: when ``llm_kwargs`` capped ``max_logprobs`` or changed ``logprobs_mode``, or
                vLLM returned fewer log-probabilities than the vocabulary holds.
            RuntimeError: while a stream is open (see :meth:`run`).
        """
        cap = self._llm_kwargs.get("max_logprobs", FULL_VOCABULARY)
        mode = self._llm_kwargs.get("logprobs_mode", RAW_LOGPROBS)
        if cap != FULL_VOCABULARY or mode != RAW_LOGPROBS:
            raise UnsupportedModelError(
                f"this engine's llm_kwargs set vLLM's max_logprobs={cap}, logprobs_mode={mode!r}; first-token "
                f"log-probabilities over the whole vocabulary need max_logprobs={FULL_VOCABULARY} and "
                f"logprobs_mode={RAW_LOGPROBS!r} (leave both unset)"
            )
        if facts is not None:
            request = self.prepare_kv(conversation, facts, serving=serving)
        else:
            request = self.prepare_prompt(conversation, fact_ids or [])
        self._check_fits(request, 1)
        step = self.run([request], 1, logprobs=FULL_VOCABULARY)[0].outputs[0].logprobs[0]
        vocab = self.model.config.vocab_size
        if len(step) < vocab:
            raise UnsupportedModelError(f"vLLM returned {len(step)} log-probabilities for a vocabulary of {vocab}")
        out = torch.full((vocab,), float("-inf"), dtype=torch.float32)
        ids = torch.tensor(list(step.keys()), dtype=torch.long)
        out[ids] = torch.tensor([entry.logprob for entry in step.values()], dtype=torch.float32)
        return out


def _conforms_to_engine(engine: VLLMEngine) -> Engine:
    """Never called: mypy checks here that :class:`VLLMEngine` implements the whole :class:`Engine`."""
    return engine
