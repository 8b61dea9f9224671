"""The vLLM KV connector that injects memory K/V into the paged KV cache (vLLM v1 ``KVConnectorBase_V1``).

A request lays out ``[system prefix][memory segment][query]`` and names, in its ``kv_transfer_params``, the files
holding the pre-RoPE K/V of the prefix and of each fact (:mod:`inferscale.engines.vllm.metadata`).

- **Scheduler side** (:class:`SchedulerSide`): when the request is first scheduled, vLLM reports how many leading
  tokens its local prefix cache holds (``c``, block aligned). The connector claims positions ``c .. E-1`` (the
  uncached rest of the prefix plus the memory segment; ``E = P+S``, or ``max(P, P+S-n)`` when the request
  recomputes the segment's last ``n`` tokens, ``tail:n``, which vLLM then prefills with the query) as externally
  computed, after checking the files' model fingerprint, that their token ids are the prompt's tokens at those
  positions, that at least one prompt token is left to compute, and that the request's ``cache_salt`` names
  exactly this content (the recomputed tail included). Anything that fails a check is not claimed: vLLM then
  prefills those tokens itself, so the answer stays right, only slower. It computes each claimed position's cache
  slot once (:class:`~inferscale.engines.vllm.metadata.LoadSpec`).
- **Worker side** (:class:`WorkerSide`): before the forward pass that computes the query, it loads the segments,
  rotates their keys to their positions (chunked RoPE with the model's own transformers rotary tables, in the
  keys' dtype), keeps its tensor-parallel shard of KV heads, and writes every layer through the active attention
  backend's own cache-update op (on CPU ``cpu_attn_reshape_and_cache``, which packs K/V per instruction set; on
  GPU, e.g. ``reshape_and_cache_flash``), so block boundaries, unaligned starts and the cache layout are the
  backend's.

Enable it with ``kv_transfer_config={"kv_connector": "InferScaleConnector", "kv_connector_module_path":
"inferscale.engines.vllm.connector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"fingerprint": fp}}``
(:func:`kv_transfer_config`).

Why one file over 400 lines: vLLM loads the connector by one class path, and its scheduler-side and worker-side
halves share the payload they exchange; each half is a class of its own here, under vLLM's own banners.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from inferscale.engines.vllm.metadata import (
    PARAMS_KEY,
    InferScaleConnectorMetadata,
    LoadSpec,
    MemoryPayload,
    SegmentRef,
    salt_content,
)
from inferscale.engines.vllm.segments import HeaderCache, SegmentCache, SegmentError
from inferscale.errors import ConfigError, InvalidInputError, UnsupportedModelError
from inferscale.kv.rope import RopeTable

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

log = logging.getLogger(__name__)

CONNECTOR_MODULE = __name__
CONNECTOR_CLASS = "InferScaleConnector"


def kv_transfer_config(fingerprint: str, segment_cache_bytes: int = 1 << 30) -> dict[str, Any]:
    """The ``kv_transfer_config`` dict that selects this connector.

    Args:
        fingerprint: :func:`inferscale.kv.model_fingerprint` of the served weights; segments encoded under any
            other fingerprint are never injected.
        segment_cache_bytes: the workers' cache of loaded segment K/V (bytes).
    """
    return {
        "kv_connector": CONNECTOR_CLASS,
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": "kv_consumer",
        # A segment the workers cannot read (its file vanished or changed after the scheduler checked it) is
        # reported as a load error; vLLM then recomputes those blocks instead of failing the request.
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"fingerprint": fingerprint, "segment_cache_bytes": segment_cache_bytes},
    }


# ==================================================================================================== scheduler side


@dataclass(frozen=True, slots=True)
class _Plan:
    """A validated claim, from ``get_num_new_matched_tokens`` until ``update_state_after_alloc``."""

    segments: tuple[SegmentRef, ...]
    lengths: tuple[int, ...]
    memory_start: int
    end: int
    """One past the last position injected (:meth:`MemoryPayload.injected_end`)."""


@dataclass(slots=True)
class _Outcome:
    """What happened to one request; returned in its output's ``kv_transfer_params``.

    Attributes:
        local_hit_tokens: leading prompt tokens vLLM's prefix cache held (block aligned).
        injected_tokens: tokens whose K/V the connector wrote.
        memory_tokens: S, the memory segment's length.
        recomputed_tokens: the memory segment's last tokens served with vLLM's own K/V instead of injected ones
            (``tail:n``: ``min(n, S)``), whether prefilled by this request or found in the prefix cache; 0 when the
            payload was refused (then vLLM prefilled the whole memory).
        refused: why nothing was injected, or ``None``.
    """

    local_hit_tokens: int = 0
    injected_tokens: int = 0
    memory_tokens: int = 0
    recomputed_tokens: int = 0
    refused: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "local_hit_tokens": self.local_hit_tokens,
            "injected_tokens": self.injected_tokens,
            "memory_tokens": self.memory_tokens,
            "recomputed_tokens": self.recomputed_tokens,
            "refused": self.refused,
        }


class SchedulerSide:
    """Decides what to claim and builds the frozen per-step metadata. Runs in vLLM's scheduler process.

    Args:
        fingerprint: the served model's fingerprint.
        block_size: the paged cache's block size (tokens).
    """

    def __init__(self, fingerprint: str, block_size: int) -> None:
        self._fingerprint = fingerprint
        self._block_size = block_size
        self._headers = HeaderCache()
        self._plans: dict[str, _Plan] = {}
        self._pending: dict[str, LoadSpec] = {}
        self._outcomes: dict[str, _Outcome] = {}

    def _validate(self, request: Request, payload: MemoryPayload) -> _Plan:
        """The plan for ``payload``, or :class:`_Refusal` naming the failed check."""
        if payload.fingerprint != self._fingerprint:
            raise _Refusal(f"stale: K/V encoded for fingerprint {payload.fingerprint}, serving {self._fingerprint}")
        prompt = list(request.prompt_token_ids or [])
        lengths: list[int] = []
        position = 0
        for seg in payload.segments:
            header = self._headers.get(seg.path)
            if header.fingerprint != self._fingerprint:
                raise _Refusal(f"stale: {seg.path} was encoded for fingerprint {header.fingerprint}")
            if tuple(prompt[position : position + header.n_tokens]) != header.token_ids:
                raise _Refusal(f"segment {seg.uid} does not match the prompt's tokens at position {position}")
            lengths.append(header.n_tokens)
            position += header.n_tokens
        if position >= len(prompt):
            raise _Refusal(f"the segments cover {position} of {len(prompt)} prompt tokens; one must stay to compute")
        if not 0 <= payload.memory_start <= position:
            raise _Refusal(f"memory_start {payload.memory_start} lies outside the segments (0..{position})")
        if salt_content(request.cache_salt) != payload.content_digest(lengths):
            raise _Refusal("cache_salt does not name this memory content (make it with metadata.cache_salt)")
        return _Plan(payload.segments, tuple(lengths), payload.memory_start, payload.injected_end(position))

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]:
        """Called when a waiting request is first scheduled (and again if it could not be). Records the plan;
        returns ``(tokens claimed beyond num_computed_tokens, False)``: ``max(0, E - num_computed_tokens)`` for a
        valid payload, ``E`` being where injection ends (:meth:`MemoryPayload.injected_end`), else 0. Loads are
        synchronous."""
        try:
            payload = MemoryPayload.from_params(request.kv_transfer_params)
        except InvalidInputError as exc:
            self._outcomes[request.request_id] = _Outcome(num_computed_tokens, refused=str(exc))
            log.warning("request %s: %s; prefilling its memory instead", request.request_id, exc)
            return 0, False
        if payload is None:
            return 0, False
        try:
            plan = self._validate(request, payload)
        except (_Refusal, SegmentError) as exc:
            self._outcomes[request.request_id] = _Outcome(num_computed_tokens, refused=str(exc))
            log.warning("request %s: not injecting (%s); vLLM prefills the memory", request.request_id, exc)
            return 0, False
        memory_end = sum(plan.lengths)
        self._outcomes[request.request_id] = _Outcome(
            num_computed_tokens, 0, memory_end - plan.memory_start, recomputed_tokens=memory_end - plan.end
        )
        if num_computed_tokens >= plan.end:
            return 0, False
        self._plans[request.request_id] = plan
        return plan.end - num_computed_tokens, False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        """Called after vLLM allocated the request's blocks. With a claim (positions ``E - num_external_tokens ..
        E - 1``), computes its slot mapping and queues the load for this step's metadata; returns nothing."""
        plan = self._plans.pop(request.request_id, None)
        if plan is None or num_external_tokens == 0:
            return
        start = plan.end - num_external_tokens
        block_ids = blocks.get_block_ids()[0]
        self._pending[request.request_id] = LoadSpec.make(
            request.request_id, plan.segments, plan.lengths, start, plan.end, block_ids, self._block_size
        )
        outcome = self._outcomes.get(request.request_id)
        if outcome is not None:
            outcome.local_hit_tokens, outcome.injected_tokens = start, num_external_tokens

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> InferScaleConnectorMetadata:
        """Called once per scheduler step. Returns the loads queued since the last call and forgets them."""
        meta = InferScaleConnectorMetadata(list(self._pending.values()))
        self._pending.clear()
        return meta

    def request_finished(self, request: Request) -> tuple[bool, dict[str, Any] | None]:
        """Called once when a request ends. Blocks are freed at once (``False``); the request's outcome is
        returned as ``{"inferscale": {...}}`` in its output's ``kv_transfer_params``."""
        self._plans.pop(request.request_id, None)
        self._pending.pop(request.request_id, None)
        outcome = self._outcomes.pop(request.request_id, None)
        return False, ({PARAMS_KEY: outcome.as_dict()} if outcome is not None else None)


class _Refusal(Exception):
    """A request's memory cannot be injected; the message says which check failed."""


# ==================================================================================================== worker side


def rotary_for_config(config: Any) -> torch.nn.Module:
    """The transformers rotary module of ``config``'s architecture (e.g. ``LlamaRotaryEmbedding(config)``).

    It is the module the transformers engine rotates with, so a key rotated here equals the one the fact encoder's
    model would have cached.

    Raises:
        UnsupportedModelError: when transformers has no causal LM with a ``<Name>RotaryEmbedding`` for ``config``.
    """
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        # transformers types the lazy mapping's __getitem__ as a pair of classes; it returns the one model class.
        model_cls: Any = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError as exc:
        raise UnsupportedModelError(f"transformers has no causal LM for {type(config).__name__}") from exc
    module = sys.modules[model_cls.__module__]
    name = model_cls.__name__.removesuffix("ForCausalLM") + "RotaryEmbedding"
    rotary_cls = getattr(module, name, None)
    if rotary_cls is None:
        raise UnsupportedModelError(f"{model_cls.__module__} has no {name}; its RoPE cannot be re-rotated here")
    return rotary_cls(config=config)


def kv_head_range(n_kv_heads: int, tp_rank: int, tp_size: int) -> tuple[int, int]:
    """The KV heads ``[lo, hi)`` that tensor-parallel rank ``tp_rank`` holds, as vLLM shards them.

    With ``n_kv_heads >= tp_size`` each rank holds ``n_kv_heads / tp_size`` consecutive heads; with fewer heads
    than ranks each head is replicated on ``tp_size / n_kv_heads`` consecutive ranks.

    Raises:
        ConfigError: when neither count divides the other.
    """
    if n_kv_heads >= tp_size:
        if n_kv_heads % tp_size:
            raise ConfigError(f"{n_kv_heads} KV heads cannot be split over tensor-parallel size {tp_size}")
        per = n_kv_heads // tp_size
        return tp_rank * per, (tp_rank + 1) * per
    if tp_size % n_kv_heads:
        raise ConfigError(f"tensor-parallel size {tp_size} is not a multiple of {n_kv_heads} KV heads")
    head = tp_rank // (tp_size // n_kv_heads)
    return head, head + 1


class WorkerSide:
    """Writes the claimed K/V into the paged cache. One instance per worker (per tensor-parallel rank).

    Args:
        vllm_config: the engine config (model config for RoPE and heads, parallel config for the shard).
        segment_cache_bytes: byte budget of the loaded-segment cache.
    """

    def __init__(self, vllm_config: VllmConfig, segment_cache_bytes: int) -> None:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        self._hf_config = vllm_config.model_config.hf_config
        tp_size = vllm_config.parallel_config.tensor_parallel_size
        n_kv_heads = int(self._hf_config.num_key_value_heads)
        self._heads = kv_head_range(n_kv_heads, get_tensor_model_parallel_rank() if tp_size > 1 else 0, tp_size)
        self._cache_bytes = segment_cache_bytes
        self._block_size = int(vllm_config.cache_config.block_size)
        self._failed_blocks: set[int] = set()
        self._device: torch.device | None = None
        self._rope: RopeTable | None = None
        self._segments: SegmentCache | None = None

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Called once after the paged caches are allocated. Builds the RoPE table and the segment cache on the
        caches' device; returns nothing."""
        self._init_on(next(iter(kv_caches.values())).device)

    def _init_on(self, device: torch.device) -> None:
        if self._device == device:
            return
        self._device = device
        self._rope = RopeTable(rotary_for_config(self._hf_config), self._hf_config, device)
        self._segments = SegmentCache(device, self._cache_bytes)

    def take_failed_blocks(self) -> set[int]:
        """The paged-cache block ids of requests whose K/V could not be loaded since the last call (then cleared)."""
        failed, self._failed_blocks = self._failed_blocks, set()
        return failed

    def _span(self, spec: LoadSpec, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Post-RoPE K/V of positions ``spec.start .. spec.end - 1`` for this rank's heads:
        ``[n_layers, n_local_heads, n_tokens, head_dim]`` each, in ``dtype``."""
        assert self._rope is not None and self._segments is not None
        lo_head, hi_head = self._heads
        keys, values = [], []
        offset = 0
        for ref, n in zip(spec.segments, spec.lengths, strict=True):
            lo, hi = max(spec.start - offset, 0), min(spec.end - offset, n)
            if lo < hi:
                k, v = self._segments.get(ref)
                if k.shape[2] != n:
                    raise SegmentError(f"{ref.path!r} holds {k.shape[2]} tokens; the scheduler saw {n}")
                keys.append(k[:, lo_head:hi_head, lo:hi])
                values.append(v[:, lo_head:hi_head, lo:hi])
            offset += n
        k_pre = torch.cat(keys, dim=2)
        return self._rope.rotate(k_pre, spec.start).to(dtype), torch.cat(values, dim=2).to(dtype)

    def start_load_kv(self, metadata: InferScaleConnectorMetadata, forward_context: ForwardContext) -> None:
        """Called every step before the forward pass when a synchronous load is pending (after vLLM zeroed new
        blocks). Writes every queued request's K/V into every attention layer's paged cache; returns nothing.

        A request whose segments cannot be read (a file disappeared or changed since the scheduler checked it)
        is skipped and its blocks are reported by :meth:`get_block_ids_with_load_errors`, so vLLM recomputes them.

        Raises:
            UnsupportedModelError: for an attention backend that writes its cache inside ``forward``.
        """
        if not metadata.loads:
            return
        from vllm.model_executor.models.utils import extract_layer_index

        layers = [
            (extract_layer_index(name), layer)
            for name, layer in forward_context.no_compile_layers.items()
            if isinstance(getattr(layer, "kv_cache", None), torch.Tensor) and hasattr(layer, "impl")
        ]
        for _, layer in layers:
            if not hasattr(layer.impl, "do_kv_cache_update"):
                raise UnsupportedModelError(f"{type(layer.impl).__name__} has no do_kv_cache_update")
        if not layers:
            raise UnsupportedModelError("the forward context holds no attention layer with a paged KV cache")
        self._init_on(layers[0][1].kv_cache.device)
        for spec in metadata.loads:
            dtype = layers[0][1].kv_cache.dtype
            try:
                keys, values = self._span(spec, dtype)
            except SegmentError as exc:
                log.warning("request %s: memory K/V not loaded, vLLM recomputes them (%s)", spec.req_id, exc)
                self._failed_blocks.update(int(b) for b in torch.unique(spec.slot_mapping // self._block_size))
                continue
            slots = spec.slot_mapping.to(keys.device)
            for index, layer in layers:
                # [n_local_heads, n_tokens, head_dim] -> [n_tokens, n_local_heads, head_dim], as the backend takes it.
                k = keys[index].transpose(0, 1).contiguous()
                v = values[index].transpose(0, 1).contiguous()
                layer.impl.do_kv_cache_update(layer, k, v, layer.kv_cache, slots)


# ==================================================================================================== the connector


class InferScaleConnector(KVConnectorBase_V1):
    """vLLM v1 KV connector: one instance per role, delegating to :class:`SchedulerSide` or :class:`WorkerSide`.

    Only the hooks this connector needs are overridden; every other hook keeps vLLM's do-nothing default.

    Raises:
        ConfigError: when ``kv_connector_extra_config`` has no ``fingerprint``.
        UnsupportedModelError: for models with more than one KV cache group (hybrid or sliding-window layouts).
    """

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        fingerprint = extra.get("fingerprint")
        if not isinstance(fingerprint, str) or not fingerprint:
            raise ConfigError("kv_connector_extra_config must name the served model's 'fingerprint'")
        groups = getattr(kv_cache_config, "kv_cache_groups", None) or []
        if len(groups) > 1:
            raise UnsupportedModelError(
                f"{len(groups)} KV cache groups; InferScale injects into one full-attention group"
            )
        self._scheduler: SchedulerSide | None = None
        self._worker: WorkerSide | None = None
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = SchedulerSide(fingerprint, vllm_config.cache_config.block_size)
        else:
            self._worker = WorkerSide(vllm_config, int(extra.get("segment_cache_bytes", 1 << 30)))

    # ---------------------------------------------------------------- scheduler side
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        """See :meth:`SchedulerSide.get_num_new_matched_tokens`."""
        assert self._scheduler is not None
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        """See :meth:`SchedulerSide.update_state_after_alloc`."""
        assert self._scheduler is not None
        self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        """See :meth:`SchedulerSide.build_connector_meta`."""
        assert self._scheduler is not None
        return self._scheduler.build_connector_meta(scheduler_output)

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """See :meth:`SchedulerSide.request_finished`."""
        assert self._scheduler is not None
        return self._scheduler.request_finished(request)

    # ---------------------------------------------------------------- worker side
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """See :meth:`WorkerSide.register_kv_caches`."""
        assert self._worker is not None
        self._worker.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        """See :meth:`WorkerSide.start_load_kv`; ``kwargs`` are not used."""
        assert self._worker is not None
        metadata = self._get_connector_metadata()
        assert isinstance(metadata, InferScaleConnectorMetadata)
        self._worker.start_load_kv(metadata, forward_context)

    def get_block_ids_with_load_errors(self) -> set[int]:
        """See :meth:`WorkerSide.take_failed_blocks`: block ids whose K/V this step could not load (vLLM
        recomputes them, ``kv_load_failure_policy="recompute"``)."""
        return self._worker.take_failed_blocks() if self._worker is not None else set()

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Called per attention layer. Loads are complete when :meth:`start_load_kv` returns: nothing to wait for."""

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata, **kwargs: Any
    ) -> None:
        """Called per attention layer. This connector only loads: does nothing."""

    def wait_for_save(self) -> None:
        """Called once per step. This connector only loads: does nothing."""
