"""Chunked RoPE: rotating stored pre-RoPE keys to the positions they are served at.

RoPE (Su et al., RoFormer, eq. 34) rotates the i-th 2-D pair of a key at position p by the angle p·θᵢ. Attention
logits q_m·k_n then depend on positions only through m − n, so a key block captured *before* rotation can be
rotated to any position later and behaves exactly as if it had been computed there (the paper's chunked RoPE,
Theorem 6). We store pre-RoPE keys, so serving needs one forward rotation and never an inverse one.

Layout: the rotate-half ("NeoX") convention used by Llama, Mistral, Qwen2/3, Gemma 3, StableLM and Phi in
transformers: pair i is (x[i], x[i + r/2]) over the first ``r = rotary_dim`` channels; channels past ``rotary_dim``
(partial rotary) pass through unchanged. The interleaved ("GPT-J") convention, pair i = (x[2i], x[2i + 1]) as in
Cohere and GLM, is refused (:class:`RopeTable` checks the table, :func:`verify_rerotation` the attention code).

The cos/sin tables come from the model's own rotary module, so every static scaled variant (``linear``,
``llama3``, ``yarn``, ``longrope`` below its original context) and its attention scaling factor are honoured
exactly as transformers applies them: the module returns ``cos(p·θ)·a`` and ``sin(p·θ)·a`` with ``a`` the
``attention_factor`` (yarn: ``0.1·ln(factor) + 1`` by default; longrope: ``sqrt(1 + ln(factor) / ln(L_orig))``),
and the attention code computes ``k·cos + rotate_half(k)·sin`` with those scaled rows, so the cached key carries
``a`` once. :func:`apply_rope` does the same with the same rows.

Models whose layer types use different rotary parameters (Gemma 3: local sliding-window layers with base 10k,
global layers with base 1M and linear scaling) get one table per layer type and an index per layer.

This module is the rotation math and the table. Reading the rope settings from a model config is
:mod:`inferscale.kv.rope_config`; the end-to-end check of a table against the model is :mod:`inferscale.kv.rope_probe`.
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol

import torch
from torch import nn

from inferscale.errors import UnsupportedModelError
from inferscale.kv.rope_config import max_static_position
from inferscale.kv.rope_probe import verify_rerotation


class RotaryModule(Protocol):
    """A transformers rotary embedding: ``forward(x, position_ids) -> (cos, sin)``, each ``[B, T, rotary_dim]``.

    Models with per-layer-type rotary parameters (Gemma 3) take a third argument, ``layer_type``.
    """

    def __call__(self, x: torch.Tensor, position_ids: torch.Tensor, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for ``position_ids``, in ``x``'s dtype, attention scaling folded in."""
        ...


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` over the last dimension (rotate-half layout)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """``[-sin₁, sin₂]``: the sin rows with the first half negated, so that ``swap(k)·signed_sin(sin)`` equals
    ``rotate_half(k)·sin`` bit for bit (``(-x₂)·s == -(x₂·s)`` in IEEE arithmetic)."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def rotate_into(
    k: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """:func:`apply_rope` with rows already in ``k``'s dtype and the sin rows from :func:`signed_sin`.

    ``out`` may be ``k`` itself (an in-place rotation); it must not otherwise overlap ``k``.
    """
    rotary_dim = cos.shape[-1]
    half = rotary_dim // 2
    if out is None:
        out = torch.empty_like(k)
    x = k[..., :rotary_dim]
    turned = torch.cat((x[..., half:], x[..., :half]), dim=-1)  # [x2, x1], a copy, so out may be k
    turned.mul_(sin_signed)  # rotate_half(x)·sin
    target = out[..., :rotary_dim]
    torch.mul(x, cos, out=target)  # x·cos
    target.add_(turned)
    in_place = out.data_ptr() == k.data_ptr() and out.stride() == k.stride()
    if rotary_dim < k.shape[-1] and not in_place:
        out[..., rotary_dim:] = k[..., rotary_dim:]
    return out


def apply_rope(k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate pre-RoPE keys: ``k·cos + rotate_half(k)·sin`` on the first ``rotary_dim`` channels.

    This is transformers' ``apply_rotary_pos_emb`` for keys (Llama; StableLM/Phi for partial rotary) with the
    same arithmetic: the rows are cast to ``k``'s dtype, as the model's rotary module returns them, and each
    product and the sum are rounded in that dtype. A key rotated here is therefore bit-identical to the key the
    model itself computes at that position, in float32 and in bfloat16/float16 alike, when the rows are the
    model's own (:class:`RopeTable`).

    Args:
        k: ``[..., T, head_dim]`` pre-RoPE keys, any float dtype.
        cos, sin: ``[T, rotary_dim]`` rows (any float dtype; cast to ``k``'s), attention scaling already folded
            in; ``rotary_dim <= head_dim``. Any shape that broadcasts against ``k[..., :rotary_dim]`` works
            (``[L, 1, T, rotary_dim]`` gives each layer its own rows).
        out: optional destination of ``k``'s shape (e.g. a slice of a preallocated cache buffer), written in
            place; it may be ``k`` itself, and must not otherwise overlap ``k``.

    Returns:
        ``[..., T, head_dim]`` rotated keys in ``k``'s dtype (``out`` when given).
    """
    return rotate_into(k, cos.to(k.dtype), signed_sin(sin).to(k.dtype), out=out)


def _takes_layer_type(rotary: Any) -> bool:
    """Whether the rotary module has per-layer-type parameters (Gemma 3: ``forward(x, position_ids, layer_type)``)."""
    if isinstance(getattr(rotary, "rope_type", None), dict):
        return True
    forward = getattr(rotary, "forward", None)
    if forward is None:
        return False
    try:
        parameter = inspect.signature(forward).parameters.get("layer_type")
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.default is inspect.Parameter.empty


class RopeTable:
    """Precomputed cos/sin rows per position, taken from the model's own rotary module.

    Rows are computed once (and regrown by doubling when a longer position is needed), so a rotation at serve
    time is a slice and two multiplies. Every row is a pure function of its position, so a slice computed for
    one request is valid for any other: no rotation is ever cached per offset.

    When the rotary module has per-layer-type parameters (Gemma 3: its ``forward`` takes ``layer_type`` and
    ``config.layer_types`` names each layer's type), one table is kept per distinct layer type plus an index per
    layer, and :meth:`rotate` expects the layer axis first.

    Args:
        rotary: the model's rotary module (``model.model.rotary_emb``).
        config: the model config (to refuse dynamic rope types, bound static ``longrope`` and, for per-layer-type
            rotary modules, read ``layer_types``).
        device: where the table lives (the KV cache's device).
        initial_positions: rows computed up front.

    Raises:
        UnsupportedModelError: see :func:`max_static_position`; also when the rows are not in the rotate-half
            layout (interleaved tables, as in Cohere), when layer types disagree on the rotary dimension, or when a
            per-layer-type rotary module comes without ``config.layer_types``.
    """

    def __init__(self, rotary: RotaryModule, config: Any, device: torch.device, initial_positions: int = 4096) -> None:
        self._rotary = rotary
        self._limit = max_static_position(config)
        self._device = device
        self._kinds: list[str | None] = [None]
        self._layer_types: tuple[str, ...] | None = None
        self._layer_index: torch.Tensor | None = None
        if _takes_layer_type(rotary):
            layer_types = getattr(config, "layer_types", None)
            if not layer_types:
                raise UnsupportedModelError(
                    f"{type(rotary).__name__} has per-layer-type rotary parameters but the config has no layer_types"
                )
            n_layers = int(getattr(config, "num_hidden_layers", len(layer_types)))
            self._layer_types = tuple(str(t) for t in layer_types[:n_layers])
            self._kinds = list(dict.fromkeys(self._layer_types))
            self._layer_index = torch.tensor([self._kinds.index(t) for t in self._layer_types], device=device)
        self._cos = torch.empty(0, device=device)  # [n_kinds, P, rotary_dim] float32
        self._sin = torch.empty(0, device=device)
        self._typed: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}  # cos, signed sin per key dtype
        self._grow(initial_positions if self._limit is None else min(initial_positions, self._limit))
        self._rotates_in_float32 = self._rows_stay_float32()

    @classmethod
    def from_model(cls, model: nn.Module, device: torch.device | None = None, verify: bool = True) -> RopeTable:
        """The table of a transformers causal LM, found from the model itself.

        Discovers ``model.model.rotary_emb`` and, for per-layer-type models, ``config.layer_types``; then (when
        ``verify``) runs :func:`verify_rerotation`: one forward pass of 8 tokens that checks the captured pre-RoPE
        keys, rotated by this table, equal the keys in the model's own cache.

        Args:
            model: a transformers causal LM (``model.model.layers``, ``model.model.rotary_emb``).
            device: where the table lives; defaults to the model's device.
            verify: run the end-to-end check (recommended: it is what refuses interleaved attention code).

        Raises:
            UnsupportedModelError: when there is no shared rotary module, for unsupported rope types or layouts,
                or when the check fails.
        """
        backbone = getattr(model, "model", model)
        rotary = getattr(backbone, "rotary_emb", None)
        if not isinstance(rotary, nn.Module):
            raise UnsupportedModelError(
                f"{type(model).__name__} has no shared rotary module at model.model.rotary_emb; only rotate-half "
                "RoPE models in the Llama layout are supported"
            )
        config = getattr(backbone, "config", None) or model.config
        if device is None:
            device = next(model.parameters()).device
        table = cls(rotary, config, device)
        if verify:
            verify_rerotation(model, table)
        return table

    @property
    def rotary_dim(self) -> int:
        """Channels rotated per head (``head_dim`` unless the model uses partial rotary)."""
        return int(self._cos.shape[-1])

    @property
    def device(self) -> torch.device:
        """Where the rows live; :meth:`rotate` expects keys on this device."""
        return self._device

    @property
    def layer_types(self) -> tuple[str, ...] | None:
        """Each layer's rotary type (Gemma 3: ``sliding_attention``/``full_attention``), or ``None`` for one table."""
        return self._layer_types

    @property
    def max_positions(self) -> int | None:
        """Positions ``0 .. max_positions - 1`` can be served (static ``longrope`` bound), or ``None`` if unbounded."""
        return self._limit

    def _rotary_rows(self, probe: torch.Tensor, position_ids: torch.Tensor, kind: str | None) -> tuple[Any, Any]:
        if kind is None:
            return self._rotary(probe, position_ids)
        return self._rotary(probe, position_ids, kind)

    def _rows_stay_float32(self) -> bool:
        """Whether the model's rotary module returns float32 rows for bfloat16 input (OLMo 2). Its attention then
        rotates a bfloat16 key in float32 and casts the result back, which :meth:`rotate` must do too to give the
        model's own key bit for bit; Llama-style modules return rows in the input's dtype."""
        probe = torch.zeros(1, device=self._device, dtype=torch.bfloat16)
        position_ids = torch.zeros(1, 1, dtype=torch.long, device=self._device)
        with torch.no_grad():
            cos, _ = self._rotary_rows(probe, position_ids, self._kinds[0])
        return bool(cos.dtype == torch.float32)

    def _grow(self, n_positions: int) -> None:
        probe = torch.zeros(1, device=self._device, dtype=torch.float32)
        position_ids = torch.arange(n_positions, device=self._device)[None]
        cos_rows, sin_rows = [], []
        with torch.no_grad():
            for kind in self._kinds:
                cos, sin = self._rotary_rows(probe, position_ids, kind)
                cos_rows.append(cos[0].float())
                sin_rows.append(sin[0].float())
        dims = {c.shape[-1] for c in cos_rows}
        if len(dims) != 1:
            raise UnsupportedModelError(f"layer types {self._kinds} rotate different channel counts {sorted(dims)}")
        cos_all, sin_all = torch.stack(cos_rows), torch.stack(sin_rows)
        rotary_dim = cos_all.shape[-1]
        half = rotary_dim // 2
        if rotary_dim % 2 or not (
            torch.equal(cos_all[..., :half], cos_all[..., half:])
            and torch.equal(sin_all[..., :half], sin_all[..., half:])
        ):
            raise UnsupportedModelError(
                f"{type(self._rotary).__name__} does not produce rotate-half cos/sin rows (the two halves differ): "
                "the interleaved (GPT-J style) rotary layout is not supported"
            )
        self._cos, self._sin = cos_all, sin_all
        self._typed = {}

    def _rows(self, start: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``[n_kinds, length, rotary_dim]`` cos, sin for positions ``start .. start + length - 1``."""
        if start < 0 or length < 0:
            raise ValueError(f"start and length must be >= 0, got {start} and {length}")
        end = start + length
        if self._limit is not None and end > self._limit:
            raise UnsupportedModelError(
                f"position {end - 1} is past original_max_position_embeddings={self._limit}, where longrope "
                "switches to its long factors; re-rotation is exact only below it"
            )
        if end > self._cos.shape[1]:
            target = max(end, 2 * self._cos.shape[1])
            self._grow(target if self._limit is None else min(target, self._limit))
        return self._cos[:, start:end], self._sin[:, start:end]

    def slice(self, start: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin float32 rows for positions ``start .. start + length - 1``.

        Returns:
            ``[length, rotary_dim]`` each for a single-table model; ``[n_layers, length, rotary_dim]`` (each layer's
            own rows) for a per-layer-type model (:attr:`layer_types` is not ``None``).

        Raises:
            UnsupportedModelError: when the positions pass the static bound of a ``longrope`` model.
            ValueError: for a negative start or length.
        """
        cos, sin = self._rows(start, length)
        if self._layer_index is None:
            return cos[0], sin[0]
        return cos[self._layer_index], sin[self._layer_index]

    def rotate(self, k: torch.Tensor, start: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rotate pre-RoPE keys to positions ``start .. start + T - 1``.

        Args:
            k: ``[..., T, head_dim]`` pre-RoPE keys; for a per-layer-type model the layer axis comes first,
                ``[n_layers, ..., T, head_dim]`` (e.g. ``[n_layers, n_kv_heads, T, head_dim]``).
            start: position of the first token.
            out: optional destination of ``k``'s shape, written in place; it may be ``k`` itself (see
                :func:`apply_rope`).

        Returns:
            Rotated keys, same shape and dtype as ``k``, computed as the model computes them, so bit-identical to
            the model's own rotation at those positions: in ``k``'s dtype with the model's rows cast to it (see
            :func:`apply_rope`), or in float32 and cast back to ``k``'s dtype where the model's rotary module returns
            float32 rows whatever its input (OLMo 2).

        Raises:
            UnsupportedModelError: past a ``longrope`` model's static bound.
            ValueError: when a per-layer-type model gets keys without its layer axis first.
        """
        if self._rotates_in_float32 and k.dtype != torch.float32:
            rotated = self.rotate(k.float(), start)
            if out is None:
                return rotated.to(k.dtype)
            return out.copy_(rotated)
        self._rows(start, k.shape[-2])  # bounds check, grows the table if needed
        typed = self._typed.get(k.dtype)
        if typed is None:
            typed = (self._cos.to(k.dtype), signed_sin(self._sin).to(k.dtype))
            self._typed[k.dtype] = typed
        cos, sin = (t[:, start : start + k.shape[-2]] for t in typed)
        if self._layer_index is None:
            cos, sin = cos[0], sin[0]
        else:
            n_layers = self._layer_index.shape[0]
            if k.dim() < 3 or k.shape[0] != n_layers:
                raise ValueError(
                    f"this model's layers use different rotary tables: keys must be [{n_layers}, ..., T, head_dim], "
                    f"got {tuple(k.shape)}"
                )
            cos, sin = cos[self._layer_index], sin[self._layer_index]
            view = (n_layers,) + (1,) * (k.dim() - 3) + tuple(cos.shape[1:])
            cos, sin = cos.view(view), sin.view(view)
        if out is None:
            out = torch.empty_like(k)
        if k.dim() < 4:
            return rotate_into(k, cos, sin, out=out)
        # One leading slice (layer) at a time keeps the temporaries cache-resident: rotating all layers at once
        # streams several times the keys' size through memory and was ~3-5x slower at k=50 on CPU.
        per_layer = cos.dim() == k.dim()
        for i in range(k.shape[0]):
            rotate_into(k[i], cos[i] if per_layer else cos, sin[i] if per_layer else sin, out=out[i])
        return out
