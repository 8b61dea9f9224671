"""Fact encoding: a causal pass over ``[context][fact]`` per fact, keeping the fact's pre-RoPE K/V only.

This is the paper's offline encoding step, with its context-window variant: a fact encoded after its w preceding
conversation turns attends to them (so pronouns resolve), but only the K/V of the fact's own tokens are kept, so
the context costs nothing at serve time. What several facts' passes share is prefilled once (:class:`FactEncoder`):
the system prefix, and a context that facts of one call have in common.

Keys are captured *before* RoPE with forward hooks on each attention module's key source: the key norm where the
model normalises keys before rotating them (``k_norm``: Qwen3, Gemma 3, OLMo 2; ``k_layernorm``: StableLM and Phi
with ``qk_layernorm``), else ``k_proj``. Values come from ``v_norm`` where present, else ``v_proj``. Models differ in
where the norm sits: Qwen3 normalises ``[B, T, n_kv, hd]`` before the head transpose, Gemma 3, StableLM and Phi
normalise ``[B, n_kv, T, hd]`` after it, OLMo 2 normalises the flat ``[B, T, n_kv * hd]``; the capture tells these
apart by shape (see :class:`PreRopeCapture`). Whether capture and rotation together reproduce the model's own cache
is checked end to end by :func:`inferscale.kv.rope_probe.verify_rerotation`.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from torch import nn

from inferscale.errors import MemoryTooLongError, UnsupportedModelError
from inferscale.kv.fact import FactKV


@dataclass(frozen=True, slots=True)
class EncodeRequest:
    """One fact to encode.

    Attributes:
        fact_ids: the fact's token ids, exactly as they will be laid into the prompt.
        context_ids: tokens the fact is encoded after (system prefix and/or preceding turns); their K/V are
            discarded. Empty means standalone (the fact starts at position 0).
        position_gap: positions left empty between the context and the fact (tokens): the fact's first token is
            encoded at position ``len(context_ids) + position_gap``, so its K/V carry that distance to the context,
            as if ``position_gap`` other tokens (unseen) stood between them. Position-aware encoding uses it to
            encode a fact at the distance from the system prefix it will be served at.
        chained_on: earlier facts whose stored pre-RoPE K/V stand between the context and this fact, oldest first,
            at consecutive positions right after the context (a *chained* encoding, docs/architecture.md runs 14
            and 17): the fact attends to them as to context tokens, and they are laid in as stored (rotated to
            their new positions, chunked RoPE), not prefilled again. Their K/V may be 8-bit (dequantised first).
            A chained request's ``context_ids`` must be the encoder's cached prefix, and its position gap 0.
    """

    fact_ids: Sequence[int]
    context_ids: Sequence[int] = field(default=())
    position_gap: int = 0
    chained_on: Sequence[FactKV] = field(default=())

    @property
    def chained_tokens(self) -> int:
        """The tokens of :attr:`chained_on`, all facts together."""
        return sum(fact.n_tokens for fact in self.chained_on)

    @property
    def span(self) -> int:
        """The positions the fact needs with its context, the facts it is chained on and its position gap
        (tokens)."""
        return len(self.context_ids) + self.chained_tokens + self.position_gap + len(self.fact_ids)


def check_spans(requests: Sequence[EncodeRequest], max_positions: int, names: Sequence[str] | None = None) -> None:
    """Refuse requests that reach past a model's context window before anything is encoded.

    Args:
        requests: the facts to encode.
        max_positions: the model's context window (tokens).
        names: what each request is, for the message (``"the memory 'My dog…'"``); default ``"fact <i>"``.

    Raises:
        MemoryTooLongError: naming the first request whose :attr:`EncodeRequest.span` exceeds ``max_positions``.
    """
    for i, req in enumerate(requests):
        if req.span > max_positions:
            name = names[i] if names is not None else f"fact {i}"
            gap = (
                f", or lower kv.position_buckets (this encoding leaves a gap of {req.position_gap} positions)"
                if req.position_gap
                else ""
            )
            raise MemoryTooLongError(
                f"{name} needs positions up to {req.span} with its context, any facts it is chained on and its "
                f"position gap; the model's context "
                f"is {max_positions} tokens: shorten the fact, or encode it after fewer context turns{gap}"
            )


def chunk_length(contexts: Sequence[Hashable | None], size: int) -> int:
    """How many of the first items of a queue to encode in one :meth:`FactEncoder.encode` call of at most ``size``,
    so that a call does not end inside a run of items that share a context (a call shares a context only among its
    own requests): ``size`` (all, when fewer are left), cut back to the start of the run the last item belongs to
    when the next item continues it and the run then fits the next call; a run longer than ``size`` is split.

    Args:
        contexts: each item's context, as far as sharing goes (any hashable; ``None`` for one that shares nothing),
            in queue order; items sharing a context are consecutive (the facts of one ``add`` call, the position
            buckets of one memory). Only the first ``2 * size + 1`` are read.
        size: the most items per call (``kv.encode_chunk_size``).

    Raises:
        ValueError: when ``size`` is under 1.
    """
    if size < 1:
        raise ValueError(f"size must be at least 1, got {size}")
    n = min(size, len(contexts))
    if n == len(contexts) or contexts[n - 1] is None or contexts[n] != contexts[n - 1]:
        return n
    run = contexts[n - 1]
    start, end = n - 1, n + 1
    while start > 0 and contexts[start - 1] == run:
        start -= 1
    while end < len(contexts) and end - start <= size and contexts[end] == run:
        end += 1
    return start if start > 0 and end - start <= size else n


def decoder_attention_modules(model: nn.Module) -> list[nn.Module]:
    """The self-attention module of every decoder layer of a transformers causal LM (``model.model.layers``).

    Raises:
        UnsupportedModelError: when the model does not have that structure or separate k/v projections.
    """
    backbone = getattr(model, "model", model)
    layers = getattr(backbone, "layers", None)
    if layers is None:
        raise UnsupportedModelError(f"{type(model).__name__} has no model.layers; only decoder-only LMs are supported")
    modules = []
    for i, layer in enumerate(layers):
        attn = getattr(layer, "self_attn", None)
        if attn is None or not hasattr(attn, "k_proj") or not hasattr(attn, "v_proj"):
            raise UnsupportedModelError(
                f"layer {i} of {type(model).__name__} has no self_attn.k_proj/v_proj (fused QKV is not supported)"
            )
        modules.append(attn)
    return modules


KEY_NORM_NAMES: tuple[str, ...] = ("k_norm", "k_layernorm")
"""Attribute names of a per-head key norm applied before RoPE (Qwen3/Gemma 3/OLMo 2; StableLM/Phi)."""

VALUE_NORM_NAMES: tuple[str, ...] = ("v_norm",)
"""Attribute names of a value norm applied before the cache (Gemma 3n)."""


def model_config(model: nn.Module) -> Any:
    """The transformers config of a causal LM (its backbone's, when the backbone has its own).

    Typed ``Any``: each ``PretrainedConfig`` subclass names its own attributes, which are read by name.
    """
    config: Any = getattr(getattr(model, "model", model), "config", None) or getattr(model, "config", None)
    if config is None:
        raise UnsupportedModelError(f"{type(model).__name__} has no config; pass a transformers causal LM")
    return config


def sliding_window(config: Any) -> int | None:
    """The width (tokens) of a model's sliding-window attention when its layers have one, else ``None``: the
    ``sliding_window`` of a transformers config (of its text config, for a config that has one), unless its
    ``layer_types`` name no ``"sliding_attention"`` layer (a Qwen2 config with ``use_sliding_window`` whose
    ``max_window_layers`` covers every layer keeps its ``sliding_window``, and transformers runs no layer with it).
    The fact encoder lays its cache out by it and encodes nothing chained on it, request-time remedies are refused
    on it, and the engines read it from the config file alone.

    Args:
        config: a ``transformers.PretrainedConfig`` (typed ``Any``: each model class has its own).
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    window = getattr(text, "sliding_window", None)
    layer_types = getattr(text, "layer_types", None)
    if layer_types is not None:
        n_layers = int(getattr(text, "num_hidden_layers", len(layer_types)))
        if "sliding_attention" not in layer_types[:n_layers]:
            return None
    return int(window) if window else None


def kv_head_shape(config: Any) -> tuple[int, int]:
    """``(n_kv_heads, head_dim)`` of a transformers config: ``num_key_value_heads`` and ``head_dim`` (or
    ``hidden_size // num_attention_heads`` when the config has none)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return int(config.num_key_value_heads), int(head_dim)


def key_source(attn: nn.Module) -> nn.Module:
    """The submodule whose output is the pre-RoPE key: the key norm if the attention has one, else ``k_proj``."""
    for name in KEY_NORM_NAMES:
        norm = getattr(attn, name, None)
        if isinstance(norm, nn.Module):
            return norm
    return attn.get_submodule("k_proj")


def value_source(attn: nn.Module) -> nn.Module:
    """The submodule whose output is the cached value: the value norm if the attention has one, else ``v_proj``."""
    for name in VALUE_NORM_NAMES:
        norm = getattr(attn, name, None)
        if isinstance(norm, nn.Module):
            return norm
    return attn.get_submodule("v_proj")


def to_heads(output: torch.Tensor, n_tokens: int, n_kv_heads: int, head_dim: int) -> torch.Tensor:
    """Bring a key/value source's output to ``[B, n_kv_heads, T, head_dim]``.

    Accepted layouts: ``[B, T, n_kv * hd]`` (a projection, or a norm over the flat projection), ``[B, T, n_kv, hd]``
    (a norm before the head transpose, Qwen3) and ``[B, n_kv, T, hd]`` (a norm after it: Gemma 3, StableLM, Phi).

    Raises:
        ValueError: when ``n_tokens == n_kv_heads`` and the output is 4-D (the two 4-D layouts cannot be told
            apart; :class:`FactEncoder` pads its batches so this never happens).
        UnsupportedModelError: for any other shape.
    """
    b = output.shape[0]
    if output.dim() == 3 and output.shape[1] == n_tokens and output.shape[2] == n_kv_heads * head_dim:
        return output.reshape(b, n_tokens, n_kv_heads, head_dim).transpose(1, 2)
    if output.dim() == 4 and output.shape[3] == head_dim:
        if n_tokens == n_kv_heads and n_kv_heads > 1:
            raise ValueError(f"ambiguous 4-D layout: {n_tokens} tokens and {n_kv_heads} KV heads; pad the batch")
        if tuple(output.shape[1:3]) == (n_tokens, n_kv_heads):
            return output.transpose(1, 2)
        if tuple(output.shape[1:3]) == (n_kv_heads, n_tokens):
            return output
    raise UnsupportedModelError(
        f"a key/value source returned shape {tuple(output.shape)}; expected [B, {n_tokens}, {n_kv_heads * head_dim}], "
        f"[B, {n_tokens}, {n_kv_heads}, {head_dim}] or [B, {n_kv_heads}, {n_tokens}, {head_dim}]"
    )


class PreRopeCapture:
    """Forward hooks that record every layer's pre-RoPE keys and values of one forward pass.

    Use as a context manager around exactly one forward pass over ``n_tokens`` positions per row.

    Args:
        attention_modules: one self-attention module per decoder layer (:func:`decoder_attention_modules`).
        n_kv_heads, head_dim: the model's KV heads and head size.
        n_tokens: the sequence length (tokens) of the forward pass, used to recognise the output layout.
    """

    def __init__(self, attention_modules: list[nn.Module], n_kv_heads: int, head_dim: int, n_tokens: int) -> None:
        self._modules = attention_modules
        self._n_kv_heads, self._head_dim, self._n_tokens = n_kv_heads, head_dim, n_tokens
        self.keys: list[torch.Tensor | None] = [None] * len(attention_modules)
        self.values: list[torch.Tensor | None] = [None] * len(attention_modules)
        self._handles: list[Any] = []

    def _store(self, bucket: list[torch.Tensor | None], layer: int) -> Any:
        def hook(_module: nn.Module, _inputs: Any, output: torch.Tensor) -> None:
            bucket[layer] = to_heads(output, self._n_tokens, self._n_kv_heads, self._head_dim)

        return hook

    def __enter__(self) -> PreRopeCapture:
        for i, attn in enumerate(self._modules):
            self._handles.append(key_source(attn).register_forward_hook(self._store(self.keys, i)))
            self._handles.append(value_source(attn).register_forward_hook(self._store(self.values, i)))
        return self

    def __exit__(self, *_exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def stacked(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``([L, B, n_kv, T, hd], [L, B, n_kv, T, hd])`` for the last forward pass.

        Raises:
            UnsupportedModelError: when some layer's key or value source did not run.
        """
        keys = [k for k in self.keys if k is not None]
        values = [v for v in self.values if v is not None]
        if len(keys) != len(self.keys) or len(values) != len(self.values):
            raise UnsupportedModelError("a layer's key or value projection was not called during the forward pass")
        return torch.stack(keys), torch.stack(values)


KVPerLayer = list[tuple[torch.Tensor, torch.Tensor]]
"""Post-RoPE K/V of a run of tokens, as the model caches them: ``(keys, values)`` per layer, each
``[1, n_kv_heads, n_tokens, head_dim]`` (a sliding-window layer's: its last ``sliding_window - 1`` of them)."""


@dataclass(frozen=True, slots=True)
class _Row:
    """One row of a :class:`FactEncoder` pass: tokens to prefill after cached K/V.

    Attributes:
        cached: the K/V of the tokens before ``ids`` (``None`` for none: ``ids`` start the sequence).
        n_cached: how many tokens come before ``ids`` in ``cached`` (a sliding layer holds only its window).
        ids: the token ids prefilled in this pass.
        start: the position of ``ids[0]`` (before the ``gap_at`` shift): the tokens before it, plus the fact's
            position gap in a row that prefills the fact alone.
        gap_at: from this index of ``ids`` on, positions are shifted by ``gap`` (a fact's position gap).
        gap: the shift (tokens).
    """

    cached: KVPerLayer | None
    n_cached: int
    ids: Sequence[int]
    start: int
    gap_at: int = 0
    gap: int = 0


_Item = TypeVar("_Item")


class FactEncoder:
    """Encodes facts in padded batches and returns each fact's pre-RoPE K/V.

    A batch's rows are right-padded, and the cached K/V they follow left-padded, so each row's tokens sit right
    after its own cache; padding is masked, and under the causal mask no real token attends to it, so each fact's
    K/V are the same as in an unbatched pass (up to kernel rounding). Rows are sorted by length before batching to
    keep padding small (a model with sliding-window layers batches only rows with as many cached tokens); results
    come back in request order.

    Nothing is prefilled twice that two requests share:

    - a shared prefix (the system prefix every fact is encoded after) is prefilled once (:meth:`cache_prefix`): a
      request whose context starts with it is encoded on top of the prefix's cached K/V, so only the rest of its
      context and its fact tokens are prefilled;
    - requests of one :meth:`encode` call whose whole ``context_ids`` are equal and reach past the cached prefix
      (the facts one ``add(infer=True)`` call extracts share the call's context turns; one memory at several
      position buckets shares its own) prefill that context once, on top of the cached prefix where it starts
      with it, and then only their fact tokens, each at its own position gap.

    Either way the result equals the plain pass over ``[context][fact]`` up to kernel rounding: the same tokens at
    the same positions attend to the same K/V. :attr:`tokens_prefilled` counts what was prefilled.

    A request chained on earlier facts (:attr:`EncodeRequest.chained_on`) prefills its fact tokens alone, on the
    cached prefix followed by those facts' stored keys, rotated to the positions right after the prefix
    (``rotate_keys``), and their values. When the facts it is chained on were themselves encoded after the prefix
    and one another in that order, the result equals the plain pass over ``[prefix][those facts][fact]`` up to
    kernel rounding; otherwise it is what the chained encoding defines. Models with sliding-window layers are not
    chained (their caches hold a window of slots, which this path does not build).

    Args:
        model: a transformers causal LM (``model.model.layers[i].self_attn`` with ``k_proj``/``v_proj``).
        batch_size: rows per forward pass (facts, or shared contexts being prefilled).
        pad_token_id: id used for padding (never attended to).
        share_contexts: prefill a context that several requests of a call share once (default); ``False``
            prefills it again for each of them (the path before it, kept for ``benchmarks/encode_throughput.py``).
        rotate_keys: rotates pre-RoPE keys ``[n_layers, n_kv_heads, T, head_dim]`` to positions ``start ..
            start + T - 1`` (:meth:`inferscale.kv.rope.RopeTable.rotate` of the model's table); needed only for
            chained requests.

    Raises:
        ValueError: when ``batch_size`` is under 1.
    """

    def __init__(
        self,
        model: nn.Module,
        batch_size: int = 16,
        pad_token_id: int = 0,
        share_contexts: bool = True,
        rotate_keys: Callable[[torch.Tensor, int], torch.Tensor] | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self._model = model
        self._backbone = getattr(model, "model", model)
        self._attn = decoder_attention_modules(model)
        self._n_kv_heads, self._head_dim = kv_head_shape(model_config(model))
        self._batch_size = batch_size
        self._pad = pad_token_id
        self._share_contexts = share_contexts
        self._rotate_keys = rotate_keys
        self._window = sliding_window(model_config(model))
        self._prefix_ids: tuple[int, ...] = ()
        self._prefix_kv: KVPerLayer = []
        self.tokens_prefilled = 0
        """Real (not padding) tokens prefilled by every :meth:`encode` call so far, the cached prefix's once."""

    @property
    def prefix_ids(self) -> tuple[int, ...]:
        """The cached shared prefix (empty when none is cached)."""
        return self._prefix_ids

    @torch.inference_mode()
    def cache_prefix(self, prefix_ids: Sequence[int]) -> None:
        """Prefill ``prefix_ids`` once (positions from 0) and keep its K/V (post-RoPE, as the model caches them,
        ``[1, n_kv, P, hd]`` per layer) for the requests whose ``context_ids`` start with it; an empty prefix
        drops the cache."""
        self._prefix_ids = tuple(int(i) for i in prefix_ids)
        self._prefix_kv = []
        if self._prefix_ids:
            (self._prefix_kv,) = self._prefill([_Row(None, 0, self._prefix_ids, 0)])

    @property
    def device(self) -> torch.device:
        """The model's device."""
        return next(self._model.parameters()).device

    @torch.inference_mode()
    def encode(self, requests: Sequence[EncodeRequest]) -> list[FactKV]:
        """Encode every request; ``FactKV`` tensors are on the model's device in its dtype.

        Raises:
            ValueError: when a request has no fact tokens, or a negative position gap; when a chained request's
                context is not the cached prefix, or it has a position gap, or the encoder has no ``rotate_keys``.
            UnsupportedModelError: for a chained request on a model with sliding-window layers.
        """
        for i, req in enumerate(requests):
            if len(req.fact_ids) == 0:
                raise ValueError(f"request {i} has no fact tokens")
            if req.position_gap < 0:
                raise ValueError(f"request {i} has a negative position gap ({req.position_gap})")
            if req.chained_on:
                self._check_chained(i, req)
        # A chained request shares nothing: its context (the prefix) is followed by its own chained facts.
        contexts = [tuple(int(t) for t in req.context_ids) if not req.chained_on else None for req in requests]
        # Each shared context once, on the cached prefix where it starts with it.
        context_rows = self._shared_contexts([c for c in contexts if c is not None])
        context_kv: dict[tuple[int, ...], KVPerLayer] = {}
        for some in self._batches(list(context_rows), context_rows.__getitem__, uniform=True):
            context_kv.update(zip(some, self._prefill([context_rows[c] for c in some]), strict=True))
        rows: dict[int, _Row] = {}
        for i, (req, context) in enumerate(zip(requests, contexts, strict=True)):
            if context is None:  # chained: only the fact tokens, after the prefix and the chained facts
                rows[i] = self._chained_row(req.chained_on, req.fact_ids)
            elif context in context_kv:  # only the fact tokens remain
                rows[i] = _Row(context_kv[context], len(context), req.fact_ids, len(context) + req.position_gap)
            else:  # the context past the cached prefix, then the fact at its position gap
                row = self._context_row(context)
                ids = [*row.ids, *req.fact_ids]
                rows[i] = dataclasses.replace(row, ids=ids, gap_at=len(row.ids), gap=req.position_gap)
        encoded: dict[int, FactKV] = {}
        for batch in self._batches(list(rows), rows.__getitem__, uniform=False):
            facts = self._encode_batch([rows[i] for i in batch], [requests[i] for i in batch])
            encoded.update(zip(batch, facts, strict=True))
        return [encoded[i] for i in range(len(requests))]

    def _check_chained(self, i: int, req: EncodeRequest) -> None:
        """Refuse chained request ``i`` when this encoder cannot encode it (see :meth:`encode`)."""
        if self._rotate_keys is None:
            raise ValueError(f"request {i} is chained on stored facts, but this encoder was built without rotate_keys")
        if tuple(int(t) for t in req.context_ids) != self._prefix_ids:
            raise ValueError(f"request {i} is chained on stored facts: its context must be the cached prefix")
        if req.position_gap:
            raise ValueError(f"request {i} is chained on stored facts: it takes no position gap")
        if self._window is not None:
            raise UnsupportedModelError(
                "this model has sliding-window layers: facts are not encoded on stored K/V (chained) on it"
            )

    def _chained_row(self, chained_on: Sequence[FactKV], fact_ids: Sequence[int]) -> _Row:
        """The row that prefills ``fact_ids`` on the cached prefix followed by ``chained_on``'s stored K/V: each
        fact's keys rotated to the positions right after the prefix and the facts before it, in the model's dtype
        on its device (8-bit ones dequantised)."""
        if self._rotate_keys is None:
            raise AssertionError("checked by _check_chained")
        dtype, device = next(self._model.parameters()).dtype, self.device
        start = len(self._prefix_ids)
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        for fact in chained_on:
            stored = fact.dequantized(dtype).to(device)
            keys.append(self._rotate_keys(stored.keys, start))
            values.append(stored.values)
            start += fact.n_tokens
        cached: KVPerLayer = []
        for layer in range(len(self._attn)):
            layer_keys = [k[layer][None] for k in keys]
            layer_values = [v[layer][None] for v in values]
            if self._prefix_kv:
                layer_keys.insert(0, self._prefix_kv[layer][0])
                layer_values.insert(0, self._prefix_kv[layer][1])
            cached.append((torch.cat(layer_keys, dim=2), torch.cat(layer_values, dim=2)))
        return _Row(cached, start, fact_ids, start)

    def _batches(self, items: list[_Item], row_of: Callable[[_Item], _Row], uniform: bool) -> Iterator[list[_Item]]:
        """``items`` in batches of at most ``batch_size``, sorted by the tokens each row prefills (the batch's width,
        so padding stays small), then by its cached ones. A sliding-window layer keeps only the last
        ``sliding_window - 1`` slots of the cache and masks by slot: when a padded pass over these rows could reach
        that many slots (the most cached tokens plus the widest row, and the one extra column of
        :meth:`_encode_batch`), a batch never mixes rows of different cached lengths (whose caches would be padded),
        nor, when ``uniform`` (a prefill whose cache is kept), rows of different widths (whose kept cache would hold
        padding)."""
        window = self._window
        rows = [row_of(item) for item in items]
        slots = max((r.n_cached for r in rows), default=0) + max((len(r.ids) for r in rows), default=0) + 1
        sliding = window is not None and slots >= window - 1

        def key(item: _Item) -> tuple[int, int]:
            row = row_of(item)
            return (row.n_cached, len(row.ids)) if sliding else (len(row.ids), row.n_cached)

        batch: list[_Item] = []
        for item in sorted(items, key=key):
            full = len(batch) == self._batch_size
            if batch and (full or (sliding and not self._fits(row_of(batch[0]), row_of(item), uniform))):
                yield batch
                batch = []
            batch.append(item)
        if batch:
            yield batch

    @staticmethod
    def _fits(first: _Row, row: _Row, uniform: bool) -> bool:
        """Whether ``row`` may share a sliding-window model's batch with ``first`` (see :meth:`_batches`)."""
        return row.n_cached == first.n_cached and (not uniform or len(row.ids) == len(first.ids))

    def _shared_contexts(self, contexts: Sequence[tuple[int, ...]]) -> dict[tuple[int, ...], _Row]:
        """The row that prefills each context two or more requests have whole (``contexts``, one per request) and
        that reaches past the cached prefix (a context equal to the prefix is the prefix's cache already), in
        first-seen order; none when contexts are not shared."""
        if not self._share_contexts:
            return {}
        rows = {c: self._context_row(c) for c, n in Counter(contexts).items() if n > 1}
        return {c: row for c, row in rows.items() if row.ids}

    def _context_row(self, context: tuple[int, ...]) -> _Row:
        """The row that prefills ``context``: what follows the cached prefix, on its K/V, when ``context`` starts
        with it; else all of it, from position 0."""
        n = len(self._prefix_ids)
        skip = n if n and context[:n] == self._prefix_ids else 0
        return _Row(self._prefix_kv if skip else None, skip, context[skip:], skip)

    def _forward(self, rows: Sequence[_Row], width: int, keep_cache: bool = False) -> Any:
        """One forward pass over ``rows``: each row's ``ids`` right-padded to ``width`` columns, after its cached K/V
        left-padded to the longest row's, so every row's tokens sit right after its own cache and the distance
        between two of its tokens, in positions and in cache slots, is the true one. Padding is masked out and never
        attended to by a real token. Returns the model's output; with ``keep_cache``, or when a row had a cache, its
        cache holds the pass's K/V (``[B, n_kv, C_max + width, hd]`` per layer; a sliding layer's last
        ``sliding_window - 1`` slots)."""
        device = self.device
        n_cached = max(r.n_cached for r in rows)
        input_ids = torch.full((len(rows), width), self._pad, dtype=torch.long)
        mask = torch.zeros((len(rows), n_cached + width), dtype=torch.long)
        position_ids = torch.zeros((len(rows), width), dtype=torch.long)
        for b, row in enumerate(rows):
            input_ids[b, : len(row.ids)] = torch.tensor(list(row.ids), dtype=torch.long)
            mask[b, n_cached - row.n_cached : n_cached + len(row.ids)] = 1
            position_ids[b] = row.start + torch.arange(width, dtype=torch.long)
            position_ids[b, row.gap_at :] += row.gap
            # padding repeats the row's last position: no column passes the batch's longest real span, which
            # longrope reads (max position) to choose its factor for the whole pass
            position_ids[b, len(row.ids) :] = position_ids[b, len(row.ids) - 1]
        extra: dict[str, Any] = {"use_cache": keep_cache}
        if n_cached:
            extra = {"use_cache": True, "cache": self._left_padded_cache(rows)}
        return self._backbone(
            input_ids=input_ids.to(device),
            attention_mask=mask.to(device),
            position_ids=position_ids.to(device),
            **extra,
        )

    def _left_padded_cache(self, rows: Sequence[_Row]) -> Any:
        """A fresh transformers cache holding each row's cached K/V in the last slots of each layer, zeros (masked)
        before them: ``[B, n_kv, C, hd]`` per layer, C the longest row's slots in that layer."""
        from transformers import DynamicCache

        layers = next(r.cached for r in rows if r.cached)
        data = []
        for layer, (k0, v0) in enumerate(layers):
            slots = max(r.cached[layer][0].shape[2] if r.cached else 0 for r in rows)
            keys = k0.new_zeros((len(rows), k0.shape[1], slots, k0.shape[3]))
            values = v0.new_zeros((len(rows), v0.shape[1], slots, v0.shape[3]))
            for b, row in enumerate(rows):
                if row.cached:
                    k, v = row.cached[layer]
                    keys[b, :, slots - k.shape[2] :] = k[0]
                    values[b, :, slots - v.shape[2] :] = v[0]
            data.append((keys, values))
        return DynamicCache(ddp_cache_data=data, config=model_config(self._model))

    def _prefill(self, rows: Sequence[_Row]) -> list[KVPerLayer]:
        """Prefill ``rows`` in one pass; returns each row's K/V as the model caches them (post-RoPE, per layer
        ``[1, n_kv, n, hd]``: n = its cached and new tokens; a sliding layer's last ``sliding_window - 1`` of them)."""
        width = max(len(r.ids) for r in rows)
        out = self._forward(rows, width, keep_cache=True)
        cache = getattr(out, "cache", None) or out.past_key_values  # renamed in transformers 5.x
        self.tokens_prefilled += sum(len(r.ids) for r in rows)
        kept = []
        for b, row in enumerate(rows):
            real = row.n_cached + len(row.ids)
            per_layer = []
            for layer in cache.layers:
                # the row's real slots end len(ids) into the pass; a sliding layer (whose batches carry no
                # padding, see _batches) holds fewer slots than the row's tokens
                end = layer.keys.shape[2] - (width - len(row.ids))
                lo = max(0, end - real)
                # copies: a view would keep the whole batch's cache alive as long as one row's K/V
                per_layer.append((layer.keys[b : b + 1, :, lo:end].clone(), layer.values[b : b + 1, :, lo:end].clone()))
            kept.append(per_layer)
        return kept

    def _encode_batch(self, rows: list[_Row], requests: list[EncodeRequest]) -> list[FactKV]:
        """Encode one batch in one forward pass: row b prefills ``rows[b].ids``, whose last tokens are
        ``requests[b]``'s fact; returns each fact's pre-RoPE K/V."""
        width = max(len(r.ids) for r in rows)
        if width == self._n_kv_heads:  # one extra pad column keeps [B, T, n_kv, hd] and [B, n_kv, T, hd] distinct
            width += 1
        with PreRopeCapture(self._attn, self._n_kv_heads, self._head_dim, width) as capture:
            self._forward(rows, width)
            keys, values = capture.stacked()
        self.tokens_prefilled += sum(len(r.ids) for r in rows)
        facts = []
        for b, (row, req) in enumerate(zip(rows, requests, strict=True)):
            lo, hi = len(row.ids) - len(req.fact_ids), len(row.ids)
            facts.append(
                FactKV(
                    keys=keys[:, b, :, lo:hi].contiguous(),
                    values=values[:, b, :, lo:hi].contiguous(),
                    token_ids=torch.tensor(list(req.fact_ids), dtype=torch.long),
                    encoded_at=len(req.context_ids) + req.chained_tokens + req.position_gap,
                )
            )
        return facts
