"""The Hugging Face transformers engine: KV injection into a ``DynamicCache``, then query-only prefill.

KV mode (paper: KV injection): the system prefix's K/V (prefilled once and reused), then the k facts' stored
pre-RoPE K/V rotated to their serving positions (:func:`inferscale.kv.compose.assemble`), are written into a fresh
cache; the model prefills only the query tokens, with explicit position ids ``P+S .. P+S+Q-1``, and decodes.
Prompt mode (the Mem0-style baseline): the same fact tokens are prefilled after the same cached prefix.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from inferscale.config import EngineConfig
from inferscale.engines.base import Generation
from inferscale.engines.transformers.attention import resolve_attention
from inferscale.engines.transformers.cache import PreallocatedCache
from inferscale.engines.transformers.prompt import LayoutTokensMixin, PromptLayout, stop_token_ids
from inferscale.errors import InvalidInputError
from inferscale.kv.compose import AssembledKV, PrefixKV, SegmentWorkspace, assemble
from inferscale.kv.encode import EncodeRequest, FactEncoder
from inferscale.kv.fact import FactKV
from inferscale.kv.fingerprint import model_fingerprint
from inferscale.kv.rope import RopeTable
from inferscale.models import resolve_llm_path

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    """``"auto"`` → CUDA when available, else CPU; anything else as given."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load_causal_lm(config: EngineConfig, home: Path | None) -> tuple[str, Any, Any]:
    """Load ``config.model`` (the embedded SmolLM2 when ``None``) with its tokenizer, in ``config.dtype``, with
    ``config.attn_implementation``, on ``config.device``, in eval mode.

    Returns:
        ``(path, model, tokenizer)``: the resolved model folder or name, the causal LM and its tokenizer.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_llm_path(config.model, home)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=_DTYPES[config.dtype], attn_implementation=resolve_attention(config.attn_implementation)
    ).to(resolve_device(config.device))
    return path, model.eval(), tokenizer


def _now_ms(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() * 1000.0


class TransformersEngine(LayoutTokensMixin):
    """Chat engine over a transformers causal LM, with KV-injected memory.

    Construction does no I/O; the model loads on first use (or :meth:`load`).

    Args:
        config: model, dtype, device, attention kernel.
        system_prompt: the instruction before the memory segment.
        home: cache directory (for the embedded model's converted folder).
        encode_batch_size: facts per forward pass when encoding.
        model, tokenizer: an already loaded model and tokenizer (tests, or callers that own the model); when
            given, ``config.model``/``dtype``/``device`` are not used to load anything.
        recompute_head_tokens: m, the first tokens of each injected fact recomputed at serve time with attention
            to everything laid out before them (an attention-sink remedy; 0 = pure injection; m >= every fact's
            length reproduces prompt mode exactly). See :meth:`_recompute_heads`.
    """

    def __init__(
        self,
        config: EngineConfig,
        system_prompt: str,
        home: Path | None = None,
        encode_batch_size: int = 16,
        model: Any = None,
        tokenizer: Any = None,
        recompute_head_tokens: int = 0,
    ) -> None:
        self._config = config
        self._system_prompt = system_prompt
        self._home = home
        self._batch_size = encode_batch_size
        self._model = model
        self._tokenizer = tokenizer
        self._lock = threading.RLock()
        self._ready = False
        if recompute_head_tokens < 0:
            raise ValueError(f"recompute_head_tokens must be >= 0, got {recompute_head_tokens}")
        self.recompute_head_tokens = recompute_head_tokens

    # ---------------------------------------------------------------- loading
    def load(self) -> TransformersEngine:
        """Load the model, tokenizer, rope table, system prefix K/V and fingerprint (once). Returns ``self``."""
        with self._lock:
            if self._ready:
                return self
            if self._config.num_threads is not None:
                torch.set_num_threads(self._config.num_threads)
            model_id = "custom"
            if self._model is None:
                path, self._model, self._tokenizer = load_causal_lm(self._config, self._home)
                model_id = Path(path).name or path
            self._model.eval()
            self._device = next(self._model.parameters()).device
            self._layout = PromptLayout(self._tokenizer, self._system_prompt)
            self._table = RopeTable.from_model(self._model, self._device)
            pad = self._tokenizer.pad_token_id if self._tokenizer.pad_token_id is not None else 0
            self._encoder = FactEncoder(self._model, batch_size=self._batch_size, pad_token_id=pad)
            self._stop_ids = stop_token_ids(self._model, self._tokenizer)
            self._prefix = self._prefill_prefix()
            self._workspace = SegmentWorkspace(self._prefix)
            self._fingerprint = model_fingerprint(self._model, self._tokenizer, model_id)
            self._ready = True
            return self

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
        """The loaded transformers model."""
        return self.load()._model

    @property
    def tokenizer(self) -> Any:
        """The loaded tokenizer."""
        return self.load()._tokenizer

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
        """The model's cos/sin table."""
        return self.load()._table

    @property
    def prefix_kv(self) -> PrefixKV:
        """K/V of the system prefix (post-RoPE), prefilled once at load."""
        return self.load()._prefix

    @property
    def max_context_tokens(self) -> int:
        """The model's context window (tokens): ``max_position_embeddings``."""
        return int(self.load()._model.config.max_position_embeddings)

    def _check_context(self, memory_tokens: int, rest: int) -> None:
        """Refuse a request whose prefix + memory + query + answer budget passes the context window: it could
        only fail slowly or answer from positions the model never saw."""
        total = self._prefix.n_tokens + memory_tokens + rest
        if total > self.max_context_tokens:
            raise InvalidInputError(
                f"the prompt needs {total} tokens (system prefix {self._prefix.n_tokens}, memories {memory_tokens}, "
                f"query and answer budget {rest}) but the model's context is {self.max_context_tokens}; retrieve "
                "fewer memories (limit) or store shorter ones"
            )

    def _prompt_layout(self) -> PromptLayout:
        return self.load()._layout

    # ---------------------------------------------------------------- encoding
    def encode_facts(self, requests: Sequence[EncodeRequest]) -> list[FactKV]:
        """Pre-RoPE K/V of each fact, ``[n_layers, n_kv_heads, n_tokens, head_dim]`` in the model's dtype.

        Raises:
            InvalidInputError: when a fact with its context is longer than the model's context window.
        """
        self.load()
        limit = self.max_context_tokens
        for i, req in enumerate(requests):
            if len(req.context_ids) + len(req.fact_ids) > limit:
                raise InvalidInputError(
                    f"fact {i} needs {len(req.context_ids) + len(req.fact_ids)} tokens with its context; the model's "
                    f"context is {limit} tokens"
                )
        with self._lock:
            return self._encoder.encode(requests)

    # ---------------------------------------------------------------- generation
    @staticmethod
    def _cache_from(assembled: AssembledKV) -> PreallocatedCache:
        return PreallocatedCache(assembled.key_buffer, assembled.value_buffer, assembled.n_tokens)

    def assemble(self, facts: Sequence[FactKV]) -> AssembledKV:
        """Prefix K/V followed by the facts' rotated K/V (see :func:`inferscale.kv.compose.assemble`)."""
        self.load()
        return assemble(self._prefix, facts, self._table)

    @torch.inference_mode()
    def generate_kv(
        self, query: str, facts: Sequence[FactKV], max_new_tokens: int, cache_scope: str = ""
    ) -> Generation:
        """Answer with the facts' K/V injected; prefill covers only the query tokens.

        ``cache_scope`` is unused here: each request builds its own cache, so nothing is shared between tenants.
        ``kv_assembly_ms`` covers the rotation and cache build, and the recompute of fact heads when
        ``recompute_head_tokens`` > 0.

        Raises:
            ValueError: when a fact's K/V do not match the model's cache (layers, heads, dtype, device).
            InvalidInputError: when prefix + memories + query + ``max_new_tokens`` exceed the model's context.
        """
        self.load()
        with self._lock:
            t0 = _now_ms(self._device)
            query_ids = self._layout.query_ids(query)
            self._check_context(sum(f.n_tokens for f in facts), len(query_ids) + max_new_tokens)
            assembled, cache = self._kv_cache(facts, extra_capacity=len(query_ids) + max_new_tokens)
            t1 = _now_ms(self._device)
            gen = self._run(cache, query_ids, assembled.n_tokens, max_new_tokens)
            return Generation(
                text=gen[0],
                token_ids=gen[1],
                kv_assembly_ms=t1 - t0,
                prefill_ms=gen[2],
                total_ms=_now_ms(self._device) - t0,
                prompt_tokens=assembled.n_tokens + len(query_ids),
                memory_tokens=assembled.memory_tokens,
            )

    @torch.inference_mode()
    def generate_prompt(
        self, query: str, fact_ids: Sequence[Sequence[int]], max_new_tokens: int, cache_scope: str = ""
    ) -> Generation:
        """Answer with the fact tokens prefilled after the cached system prefix (prompt injection baseline).

        ``cache_scope`` is unused here: each request builds its own cache on the shared system prefix.

        Raises:
            InvalidInputError: when prefix + memories + query + ``max_new_tokens`` exceed the model's context.
        """
        self.load()
        with self._lock:
            t0 = _now_ms(self._device)
            memory_ids = [t for ids in fact_ids for t in ids]
            query_ids = self._layout.query_ids(query)
            self._check_context(len(memory_ids), len(query_ids) + max_new_tokens)
            capacity = len(memory_ids) + len(query_ids) + max_new_tokens
            cache = self._cache_from(self._workspace.assemble([], self._table, extra_capacity=capacity))
            gen = self._run(cache, memory_ids + query_ids, self._prefix.n_tokens, max_new_tokens)
            return Generation(
                text=gen[0],
                token_ids=gen[1],
                kv_assembly_ms=0.0,
                prefill_ms=gen[2],
                total_ms=_now_ms(self._device) - t0,
                prompt_tokens=self._prefix.n_tokens + len(memory_ids) + len(query_ids),
                memory_tokens=len(memory_ids),
            )

    @torch.inference_mode()
    def first_token_logits(
        self, query: str, facts: Sequence[FactKV] | None, fact_ids: Sequence[Sequence[int]] | None = None
    ) -> torch.Tensor:
        """Next-token logits ``[vocab]`` float32 after the prompt: KV mode when ``facts`` is given, else prompt
        mode over ``fact_ids``. Used by exactness tests and the fidelity metrics."""
        self.load()
        with self._lock:
            query_ids = self._layout.query_ids(query)
            if facts is not None:
                assembled, cache = self._kv_cache(facts, extra_capacity=len(query_ids))
                ids: list[int] = []
            else:
                ids = [t for f in fact_ids or [] for t in f]
                assembled = self._workspace.assemble([], self._table, extra_capacity=len(ids) + len(query_ids))
                cache = self._cache_from(assembled)
            return self._forward(cache, ids + query_ids, assembled.n_tokens)[0, -1].float()

    def _kv_cache(self, facts: Sequence[FactKV], extra_capacity: int) -> tuple[AssembledKV, PreallocatedCache]:
        """Assemble prefix + facts into a preallocated cache, then recompute the facts' first m tokens if asked."""
        m = self.recompute_head_tokens
        heads = sum(min(m, f.n_tokens) for f in facts)
        assembled = self._workspace.assemble(facts, self._table, extra_capacity=extra_capacity + heads)
        cache = self._cache_from(assembled)
        if heads:
            self._recompute_heads(cache, facts, assembled.n_tokens, m)
        return assembled, cache

    def _recompute_heads(self, cache: PreallocatedCache, facts: Sequence[FactKV], length: int, m: int) -> None:
        """Recompute the first ``m`` tokens of every fact in place, in one forward pass.

        Each recomputed token at position t of fact i attends to the prefix, to the earlier facts (their
        recomputed first tokens in their fresh form, the rest as injected) and to its own fact's recomputed tokens
        up to t, at its true position. Its new K/V then replace the injected ones
        (:meth:`PreallocatedCache.move_tail`). With ``m`` at least every fact's length this is exactly a full
        prefill of the memory segment (prompt mode); with small ``m`` it re-grounds the start of each fact, where
        a standalone-encoded fact grows its own attention sink (a selective recompute in the spirit of
        CacheBlend, with a fixed choice of tokens). Cost: ``k·m`` prefill tokens attending ``P + S`` keys.
        """
        ids: list[int] = []
        positions: list[int] = []
        fact_start: list[int] = []
        start = self._prefix.n_tokens
        for fact in facts:
            n = min(m, fact.n_tokens)
            ids += fact.token_ids[:n].tolist()
            positions += range(start, start + n)
            fact_start += [start] * n
            start += fact.n_tokens
        pos = torch.tensor(positions, device=self._device)
        owner = torch.tensor(fact_start, device=self._device)
        cols = torch.arange(length, device=self._device)
        stale = torch.zeros(length, dtype=torch.bool, device=self._device)
        stale[pos] = True  # slots whose fresh K/V are in the recomputed block
        allowed_cache = (cols[None, :] < owner[:, None]) & ~stale[None, :]  # [q, length]
        earlier = owner[None, :] < owner[:, None]
        own_causal = (owner[None, :] == owner[:, None]) & (pos[None, :] <= pos[:, None])
        allowed = torch.cat([allowed_cache, earlier | own_causal], dim=1)
        dtype = next(self._model.parameters()).dtype
        mask = torch.zeros(allowed.shape, dtype=dtype, device=self._device)
        mask.masked_fill_(~allowed, torch.finfo(dtype).min)
        self._model.model(
            input_ids=torch.tensor([ids], dtype=torch.long, device=self._device),
            position_ids=pos[None],
            attention_mask=mask[None, None],
            cache=cache,
            use_cache=True,
        )
        cache.move_tail(length, pos)

    def _forward(self, cache: Any, ids: list[int], start: int) -> torch.Tensor:
        input_ids = torch.tensor([ids], dtype=torch.long, device=self._device)
        positions = torch.arange(start, start + len(ids), device=self._device)[None]
        # Only the last position's logits are used: projecting every prompt token onto the vocabulary would add
        # T x hidden x vocab multiply-adds to each prefill (at k=50, more than the query's whole prefill).
        out = self._model(input_ids=input_ids, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1)
        return out.logits

    def _run(self, cache: Any, ids: list[int], start: int, max_new_tokens: int) -> tuple[str, list[int], float]:
        """Prefill ``ids`` at positions ``start..`` on top of ``cache``, then greedy-decode.

        Returns (text, generated ids, prefill ms up to the first token).
        """
        t0 = _now_ms(self._device)
        logits = self._forward(cache, ids, start)
        token = int(logits[0, -1].argmax())
        prefill_ms = _now_ms(self._device) - t0
        generated: list[int] = []
        position = start + len(ids)
        while token not in self._stop_ids and len(generated) < max_new_tokens:
            generated.append(token)
            logits = self._forward(cache, [token], position)
            position += 1
            token = int(logits[0, -1].argmax())
        # A budget that ends inside a multi-byte character leaves a replacement character: drop it.
        text = self._tokenizer.decode(generated, skip_special_tokens=True).rstrip("\ufffd").strip()
        return text, generated, prefill_ms
