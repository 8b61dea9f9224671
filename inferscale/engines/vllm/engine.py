"""The vLLM engine: vLLM's offline ``LLM`` with the InferScale connector, behind the common engine interface.

Where fact K/V come from (route 2 of the design): facts are encoded by :class:`inferscale.kv.FactEncoder` on a
transformers copy of the same weights, in the same dtype, on the engine's device. The system prefix is encoded the
same way (pre-RoPE, positions from 0). A request then names, per segment, a safetensors file with those pre-RoPE
K/V; the connector's workers rotate them to their positions and write them into vLLM's paged cache, so vLLM
prefills only the query. ``tests/engines/test_vllm_connector.py`` checks in float32 that this route agrees with
vLLM's own prefill (a single fact encoded after the prefix gives the same first-token log-probabilities as a plain
prefill of the same tokens) and with the transformers engine.

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
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from inferscale.config import EngineConfig
from inferscale.engines.base import Engine, Generation
from inferscale.engines.hf import LayoutTokensMixin, PromptLayout, load_causal_lm, stop_token_ids
from inferscale.engines.vllm.connector import kv_transfer_config
from inferscale.engines.vllm.metadata import SegmentRef
from inferscale.engines.vllm.requests import PreparedRequest, RequestBuilder
from inferscale.errors import ConfigError, UnsupportedModelError
from inferscale.kv.encode import EncodeRequest, FactEncoder, check_spans
from inferscale.kv.fact import FactKV
from inferscale.kv.fingerprint import model_fingerprint
from inferscale.kv.serving import ServingSettings

log = logging.getLogger(__name__)


def _pure_injection(serving: ServingSettings) -> ServingSettings:
    """``serving`` when it is pure injection (the only setting vLLM serves).

    Raises:
        ConfigError: naming the setting and why vLLM cannot apply it.
    """
    if not serving.is_pure_injection:
        raise ConfigError(
            f"the vLLM engine serves injected memory as it was encoded; it cannot apply {serving.label()}: "
            "vLLM's attention kernels take no per-column logit bias (memory_attention_scale), a KV connector "
            "may only claim one contiguous span of prompt tokens from position 0 (so memory tokens inside the "
            "segment cannot be recomputed), and the temperature is not wired to the connector. Set "
            "kv.memory_attention_scale=1, kv.memory_temperature=1 and kv.recompute='none' for provider 'vllm'; "
            "the encoding-time remedies (kv.context_window, kv.position_buckets) apply unchanged. "
            "See docs/vllm.md."
        )
    return serving


class VLLMEngine(LayoutTokensMixin):
    """Chat engine on vLLM with KV-injected memory (the same interface as the transformers engine).

    Construction does no I/O; :meth:`load` (or first use) loads the transformers encoder, computes the
    fingerprint, encodes the system prefix and starts vLLM (about 40 s on 2 CPU cores in eager mode).

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
        serving: the request-time remedies; only pure injection (the default) is served.

    Raises:
        ConfigError: when ``serving`` asks for a memory attention scale, a temperature or a recompute policy,
            which vLLM cannot apply without a fork (the message says why).
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
        self.serving = _pure_injection(serving if serving is not None else ServingSettings())
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
        self._ready = False
        self._async_started = False
        self._async_llm: weakref.ref[Any] | None = None

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
            self._encoder = FactEncoder(self._model, batch_size=self._batch_size, pad_token_id=pad)
            self._fingerprint = model_fingerprint(self._model, self._tokenizer, Path(path).name or path)
            self._stop_ids = sorted(stop_token_ids(self._model, self._tokenizer))
            directory = self._staging_dir or Path(tempfile.mkdtemp(prefix="inferscale-vllm-"))
            self._staging_dir = directory
            prefix = self._encoder.encode([EncodeRequest(self._layout.prefix_ids)])[0]
            self._builder = RequestBuilder(self._layout, self._fingerprint, prefix, directory)
            self._encoder_ready = True
            return self

    def engine_args(self) -> dict[str, Any]:
        """Keyword arguments for ``vllm.LLM`` / ``vllm.AsyncEngineArgs``: the model folder, dtype, eager mode, prefix
        caching, KV cache size (bytes), context limit (tokens), the InferScale connector bound to this model's
        fingerprint, and ``llm_kwargs`` on top. Loads the encoder (for the path and fingerprint)."""
        self.load_encoder()
        kwargs: dict[str, Any] = {
            "model": self._path,
            "dtype": self._config.dtype,
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
        with self._lock:
            if self._ready:
                return self
            if self._async_started:
                raise RuntimeError(
                    "this engine started vLLM's async engine (start_async_llm); the offline engine would be a second "
                    "vLLM on the same machine"
                )
            from vllm import LLM

            self._llm = LLM(**self.engine_args())
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
                self._encoder_ready = False
            if self._own_staging and self._staging_dir is not None:
                shutil.rmtree(self._staging_dir, ignore_errors=True)
                self._staging_dir = None

    # ---------------------------------------------------------------- properties
    @property
    def llm(self) -> Any:
        """The ``vllm.LLM`` instance."""
        return self.load()._llm

    @property
    def model(self) -> Any:
        """The transformers copy of the weights (the fact encoder's model)."""
        return self.load_encoder()._model

    @property
    def tokenizer(self) -> Any:
        """The tokenizer."""
        return self.load_encoder()._tokenizer

    @property
    def device(self) -> torch.device:
        """Where encoded fact K/V live (the encoder's device)."""
        return next(self.load_encoder()._model.parameters()).device

    @property
    def fingerprint(self) -> str:
        """Model fingerprint (32 hex characters) of the transformers copy, which is also vLLM's weights."""
        return self.load_encoder()._fingerprint

    @property
    def stop_token_ids(self) -> list[int]:
        """Token ids that end an answer."""
        return list(self.load_encoder()._stop_ids)

    @property
    def prefix_segment(self) -> SegmentRef:
        """The system prefix's segment file."""
        return self.load_encoder()._builder.prefix_ref

    def _prompt_layout(self) -> PromptLayout:
        return self.load_encoder()._layout

    # ---------------------------------------------------------------- encoding
    def encode_facts(self, requests: Sequence[EncodeRequest]) -> list[FactKV]:
        """Pre-RoPE K/V ``[n_layers, n_kv_heads, n_tokens, head_dim]`` per fact, by the transformers encoder.

        Raises:
            InvalidInputError: when a fact with its context and position gap reaches past vLLM's context limit
                (``max_model_len``, or the model's ``max_position_embeddings``).
        """
        self.load_encoder()
        check_spans(requests, self._max_model_len or int(self._model.config.max_position_embeddings))
        with self._lock:
            return self._encoder.encode(requests)

    # ---------------------------------------------------------------- requests
    @property
    def builder(self) -> RequestBuilder:
        """Builds prepared requests (prompt ids, payload, salt) for :meth:`run`."""
        return self.load_encoder()._builder

    def prepare_kv(self, query: str, facts: Sequence[FactKV], cache_scope: str = "") -> PreparedRequest:
        """See :meth:`RequestBuilder.prepare_kv`."""
        return self.builder.prepare_kv(query, facts, cache_scope)

    def prepare_files(self, query: str, refs: Sequence[SegmentRef], cache_scope: str = "") -> PreparedRequest:
        """See :meth:`RequestBuilder.prepare_files`."""
        return self.builder.prepare_files(query, refs, cache_scope)

    def prepare_prompt(self, query: str, fact_ids: Sequence[Sequence[int]], cache_scope: str = "") -> PreparedRequest:
        """See :meth:`RequestBuilder.prepare_prompt`."""
        return self.builder.prepare_prompt(query, fact_ids, cache_scope)

    def run(self, requests: Sequence[PreparedRequest], max_new_tokens: int, logprobs: int | None = None) -> list[Any]:
        """Greedy-generate every request in one ``LLM.generate`` call; returns vLLM ``RequestOutput`` objects in
        order (``kv_transfer_params["inferscale"]`` in each reports local hits and injected tokens)."""
        from vllm import SamplingParams

        self.load()
        sampling = SamplingParams(
            temperature=0.0, max_tokens=max_new_tokens, stop_token_ids=self._stop_ids, logprobs=logprobs
        )
        pairs = [r.vllm_inputs(sampling) for r in requests]
        prompts: list[Any] = [p for p, _ in pairs]  # token prompts (vLLM's TokensPrompt dicts)
        with self._lock:
            return list(self._llm.generate(prompts, [s for _, s in pairs], use_tqdm=False))

    def _generation(self, request: PreparedRequest, max_new_tokens: int, assembly_ms: float) -> Generation:
        t0 = time.perf_counter()
        out = self.run([request], max_new_tokens)[0]
        total_ms = (time.perf_counter() - t0) * 1000.0
        completion = out.outputs[0]
        token_ids = [t for t in completion.token_ids if t not in self._stop_ids]
        metrics = getattr(out, "metrics", None)
        latency = getattr(metrics, "first_token_latency", 0.0) if metrics is not None else 0.0
        return Generation(
            text=self._tokenizer.decode(token_ids, skip_special_tokens=True).strip(),
            token_ids=token_ids,
            kv_assembly_ms=assembly_ms,
            prefill_ms=latency * 1000.0 if latency else total_ms,
            total_ms=assembly_ms + total_ms,
            prompt_tokens=len(request.prompt_ids),
            memory_tokens=request.memory_tokens,
        )

    def generate_kv(
        self,
        query: str,
        facts: Sequence[FactKV],
        max_new_tokens: int,
        cache_scope: str = "",
        serving: ServingSettings | None = None,
    ) -> Generation:
        """Answer with the facts' K/V injected by the connector; vLLM prefills only the query (and any part of the
        system prefix not already in its prefix cache is injected too). ``cache_scope`` salts the prefix cache.

        Raises:
            ConfigError: when ``serving`` is not pure injection (see the class).
        """
        if serving is not None:
            _pure_injection(serving)
        t0 = time.perf_counter()
        request = self.prepare_kv(query, facts, cache_scope)
        return self._generation(request, max_new_tokens, (time.perf_counter() - t0) * 1000.0)

    def generate_prompt(
        self, query: str, fact_ids: Sequence[Sequence[int]], max_new_tokens: int, cache_scope: str = ""
    ) -> Generation:
        """Answer with the same fact tokens prefilled by vLLM (the prompt-injection baseline); ``cache_scope``
        salts the prefix cache, so tenants never share blocks."""
        return self._generation(self.prepare_prompt(query, fact_ids, cache_scope), max_new_tokens, 0.0)

    def first_token_logits(
        self,
        query: str,
        facts: Sequence[FactKV] | None,
        fact_ids: Sequence[Sequence[int]] | None = None,
        serving: ServingSettings | None = None,
    ) -> torch.Tensor:
        """Not available: vLLM returns the top-``max_logprobs`` log-probabilities of a token, not the
        full-vocabulary logits the first-token KL needs (:meth:`run` with ``logprobs`` gives the top ones).

        Raises:
            UnsupportedModelError: always.
        """
        raise UnsupportedModelError(
            "the vLLM engine does not expose full-vocabulary next-token logits; measure first-token fidelity with "
            "the transformers engine on the same weights (engine provider 'transformers')"
        )


def _conforms_to_engine(engine: VLLMEngine) -> Engine:
    """Never called: mypy checks here that :class:`VLLMEngine` implements the whole :class:`Engine`."""
    return engine
