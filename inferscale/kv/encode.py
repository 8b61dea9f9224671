"""Fact encoding: one forward pass over ``[context][fact]`` per fact, keeping the fact's pre-RoPE K/V only.

This is the paper's offline encoding step, with its context-window variant: a fact encoded after its w preceding
conversation turns attends to them (so pronouns resolve), but only the K/V of the fact's own tokens are kept, so
the context costs nothing at serve time.

Keys are captured *before* RoPE with forward hooks on each attention module's key source: the key norm where the
model normalises keys before rotating them (``k_norm``: Qwen3, Gemma 3, OLMo 2; ``k_layernorm``: StableLM and Phi
with ``qk_layernorm``), else ``k_proj``. Values come from ``v_norm`` where present, else ``v_proj``. Models differ in
where the norm sits: Qwen3 normalises ``[B, T, n_kv, hd]`` before the head transpose, Gemma 3, StableLM and Phi
normalise ``[B, n_kv, T, hd]`` after it, OLMo 2 normalises the flat ``[B, T, n_kv * hd]``; the capture tells these
apart by shape (see :class:`PreRopeCapture`). Whether capture and rotation together reproduce the model's own cache
is checked end to end by :func:`inferscale.kv.rope_probe.verify_rerotation`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from inferscale.errors import InvalidInputError, UnsupportedModelError
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
    """

    fact_ids: Sequence[int]
    context_ids: Sequence[int] = field(default=())
    position_gap: int = 0

    @property
    def span(self) -> int:
        """The positions the fact needs with its context and position gap (tokens)."""
        return len(self.context_ids) + self.position_gap + len(self.fact_ids)


def check_spans(requests: Sequence[EncodeRequest], max_positions: int, names: Sequence[str] | None = None) -> None:
    """Refuse requests that reach past a model's context window before anything is encoded.

    Args:
        requests: the facts to encode.
        max_positions: the model's context window (tokens).
        names: what each request is, for the message (``"the memory 'My dog…'"``); default ``"fact <i>"``.

    Raises:
        InvalidInputError: naming the first request whose :attr:`EncodeRequest.span` exceeds ``max_positions``.
    """
    for i, req in enumerate(requests):
        if req.span > max_positions:
            name = names[i] if names is not None else f"fact {i}"
            raise InvalidInputError(
                f"{name} needs positions up to {req.span} with its context and position gap; the model's context "
                f"is {max_positions} tokens: shorten the fact, or encode it after fewer context turns"
            )


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


class FactEncoder:
    """Encodes facts in padded batches and returns each fact's pre-RoPE K/V.

    Sequences are right-padded: under the causal mask no real token attends to padding, so each fact's K/V are
    the same as in an unbatched pass (up to kernel rounding). Requests are sorted by length before batching to
    keep padding small; results come back in request order.

    A shared prefix (the system prefix every fact is encoded after) is prefilled once (:meth:`cache_prefix`): a
    request whose context starts with it is encoded on top of the prefix's cached K/V, so only the rest of its
    context and its fact tokens are prefilled. The result equals the plain pass up to kernel rounding (the same
    tokens at the same positions attend to the same K/V). :attr:`tokens_prefilled` counts what was prefilled.

    Args:
        model: a transformers causal LM (``model.model.layers[i].self_attn`` with ``k_proj``/``v_proj``).
        batch_size: facts per forward pass.
        pad_token_id: id used for padding (never attended to).
    """

    def __init__(self, model: nn.Module, batch_size: int = 16, pad_token_id: int = 0) -> None:
        self._model = model
        self._backbone = getattr(model, "model", model)
        self._attn = decoder_attention_modules(model)
        self._n_kv_heads, self._head_dim = kv_head_shape(model_config(model))
        self._batch_size = batch_size
        self._pad = pad_token_id
        self._prefix_ids: tuple[int, ...] = ()
        self._prefix_kv: list[tuple[torch.Tensor, torch.Tensor]] = []
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
        if not self._prefix_ids:
            return
        ids = torch.tensor([self._prefix_ids], dtype=torch.long, device=self.device)
        out = self._backbone(
            input_ids=ids, position_ids=torch.arange(ids.shape[1], device=self.device)[None], use_cache=True
        )
        cache = getattr(out, "cache", None) or out.past_key_values  # renamed in transformers 5.x
        self._prefix_kv = [(layer.keys, layer.values) for layer in cache.layers]
        self.tokens_prefilled += len(self._prefix_ids)

    def _uses_prefix(self, req: EncodeRequest) -> bool:
        n = len(self._prefix_ids)
        return n > 0 and len(req.context_ids) >= n and tuple(req.context_ids[:n]) == self._prefix_ids

    @property
    def device(self) -> torch.device:
        """The model's device."""
        return next(self._model.parameters()).device

    @torch.inference_mode()
    def encode(self, requests: Sequence[EncodeRequest]) -> list[FactKV]:
        """Encode every request; ``FactKV`` tensors are on the model's device in its dtype.

        Raises:
            ValueError: when a request has no fact tokens.
        """
        for i, req in enumerate(requests):
            if len(req.fact_ids) == 0:
                raise ValueError(f"request {i} has no fact tokens")
            if req.position_gap < 0:
                raise ValueError(f"request {i} has a negative position gap ({req.position_gap})")
        encoded: dict[int, FactKV] = {}
        for cached in (True, False):
            group = [i for i, req in enumerate(requests) if self._uses_prefix(req) == cached]
            skip = len(self._prefix_ids) if cached else 0
            group.sort(key=lambda i: len(requests[i].context_ids) + len(requests[i].fact_ids))
            for start in range(0, len(group), self._batch_size):
                chunk = group[start : start + self._batch_size]
                encoded.update(zip(chunk, self._encode_batch([requests[i] for i in chunk], skip), strict=True))
        return [encoded[i] for i in range(len(requests))]

    def _prefix_cache(self, rows: int) -> Any:
        """A fresh transformers cache holding the cached prefix for ``rows`` rows (every forward extends it)."""
        from transformers import DynamicCache

        data = [(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)) for k, v in self._prefix_kv]
        return DynamicCache(ddp_cache_data=data, config=model_config(self._model))

    def _encode_batch(self, batch: list[EncodeRequest], skip: int = 0) -> list[FactKV]:
        """Encode ``batch`` in one forward pass; with ``skip`` > 0 every request's context starts with the cached
        prefix, which is not prefilled again: row tokens start at position ``skip``."""
        device = self.device
        seqs = [list(r.context_ids[skip:]) + list(r.fact_ids) for r in batch]
        width = max(len(s) for s in seqs)
        if width == self._n_kv_heads:  # one extra pad column keeps [B, T, n_kv, hd] and [B, n_kv, T, hd] distinct
            width += 1
        input_ids = torch.full((len(seqs), width), self._pad, dtype=torch.long)
        attention_mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for row, seq in enumerate(seqs):
            input_ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            attention_mask[row, : len(seq)] = 1
        position_ids = skip + torch.arange(width, dtype=torch.long)[None].repeat(len(seqs), 1)
        for row, req in enumerate(batch):
            if req.position_gap:
                position_ids[row, len(req.context_ids) - skip :] += req.position_gap
        cache: dict[str, Any] = {"use_cache": False}
        if skip:
            cache = {"use_cache": True, "cache": self._prefix_cache(len(seqs))}
            attention_mask = torch.cat([torch.ones((len(seqs), skip), dtype=torch.long), attention_mask], dim=1)
        with PreRopeCapture(self._attn, self._n_kv_heads, self._head_dim, width) as capture:
            self._backbone(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                position_ids=position_ids.to(device),
                **cache,
            )
            keys, values = capture.stacked()
        self.tokens_prefilled += sum(len(seq) for seq in seqs)
        facts = []
        for row, req in enumerate(batch):
            lo, hi = len(req.context_ids) - skip, len(req.context_ids) - skip + len(req.fact_ids)
            facts.append(
                FactKV(
                    keys=keys[:, row, :, lo:hi].contiguous(),
                    values=values[:, row, :, lo:hi].contiguous(),
                    token_ids=torch.tensor(list(req.fact_ids), dtype=torch.long),
                    encoded_at=len(req.context_ids) + req.position_gap,
                )
            )
        return facts
