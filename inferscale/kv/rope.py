"""Chunked RoPE: rotating stored pre-RoPE keys to the positions they are served at.

RoPE (Su et al., RoFormer, eq. 34) rotates the i-th 2-D pair of a key at position p by the angle p·θᵢ. Attention
logits q_m·k_n then depend on positions only through m − n, so a key block captured *before* rotation can be
rotated to any position later and behaves exactly as if it had been computed there (the paper's chunked RoPE,
Theorem 6). We store pre-RoPE keys, so serving needs one forward rotation and never an inverse one.

Layout: the rotate-half ("NeoX") convention used by Llama, Mistral, Qwen2/3 and Gemma in transformers: pair i is
(x[i], x[i + d/2]) over the first ``rotary_dim`` channels; channels past ``rotary_dim`` (partial rotary) pass
through unchanged. The cos/sin tables come from the model's own rotary module, so every scaled variant
(``linear``, ``llama3``, ``yarn``, static ``longrope``) and its attention scaling factor is honoured.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from inferscale.errors import UnsupportedModelError

# Rope types whose frequencies do not depend on the sequence length: re-rotation is exact for them.
STATIC_ROPE_TYPES: frozenset[str] = frozenset({"default", "linear", "llama3", "yarn"})


class RotaryModule(Protocol):
    """A transformers rotary embedding: ``forward(x, position_ids) -> (cos, sin)``, each ``[B, T, rotary_dim]``."""

    def __call__(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


def rope_parameters(config: Any) -> dict[str, Any]:
    """The rope settings of a transformers config as one dict (``rope_parameters``, or legacy ``rope_scaling``)."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return dict(params)


def max_static_position(config: Any) -> int | None:
    """The largest position count for which the model's RoPE is static, or ``None`` when it always is.

    Raises:
        UnsupportedModelError: for ``dynamic`` NTK scaling, whose frequencies change with the sequence length,
            so a key rotated for one request length would be silently wrong for another.
    """
    params = rope_parameters(config)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type in STATIC_ROPE_TYPES:
        return None
    if rope_type == "longrope":
        # longrope switches from its short to its long factors once a sequence exceeds the original context;
        # below that bound the short factors are used for every position and the rotation is static.
        return int(params.get("original_max_position_embeddings") or config.max_position_embeddings)
    raise UnsupportedModelError(
        f"rope_type {rope_type!r} is not supported for KV re-rotation: its frequencies depend on the sequence "
        f"length, so stored keys cannot be rotated exactly. Supported: {sorted(STATIC_ROPE_TYPES | {'longrope'})}"
    )


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` over the last dimension (rotate-half layout)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pre-RoPE keys: ``k·cos + rotate_half(k)·sin`` on the first ``rotary_dim`` channels.

    Args:
        k: ``[..., T, head_dim]`` pre-RoPE keys, any float dtype.
        cos, sin: ``[T, rotary_dim]`` float32, attention scaling already folded in; ``rotary_dim <= head_dim``.

    Returns:
        ``[..., T, head_dim]`` rotated keys in ``k``'s dtype. The math runs in float32.
    """
    rotary_dim = cos.shape[-1]
    k32 = k.float()
    k_rot, k_pass = k32[..., :rotary_dim], k32[..., rotary_dim:]
    out = k_rot * cos + rotate_half(k_rot) * sin
    if k_pass.shape[-1]:
        out = torch.cat((out, k_pass), dim=-1)
    return out.to(k.dtype)


class RopeTable:
    """Precomputed cos/sin rows per position, taken from the model's own rotary module.

    Rows are computed once (and regrown by doubling when a longer position is needed), so a rotation at serve
    time is a slice and two multiplies. Every row is a pure function of its position, so a slice computed for
    one request is valid for any other: no rotation is ever cached per offset.

    Args:
        rotary: the model's rotary module (``model.model.rotary_emb``).
        config: the model config (to refuse dynamic rope types and bound static ``longrope``).
        device: where the table lives (the KV cache's device).
        initial_positions: rows computed up front.

    Raises:
        UnsupportedModelError: see :func:`max_static_position`.
    """

    def __init__(self, rotary: RotaryModule, config: Any, device: torch.device, initial_positions: int = 4096) -> None:
        self._rotary = rotary
        self._limit = max_static_position(config)
        self._device = device
        self._cos = torch.empty(0, device=device)
        self._sin = torch.empty(0, device=device)
        self._grow(initial_positions if self._limit is None else min(initial_positions, self._limit))

    @property
    def rotary_dim(self) -> int:
        """Channels rotated per head (``head_dim`` unless the model uses partial rotary)."""
        return int(self._cos.shape[-1])

    def _grow(self, n_positions: int) -> None:
        probe = torch.zeros(1, device=self._device, dtype=torch.float32)
        position_ids = torch.arange(n_positions, device=self._device)[None]
        with torch.no_grad():
            cos, sin = self._rotary(probe, position_ids)
        self._cos, self._sin = cos[0].float(), sin[0].float()

    def slice(self, start: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin ``[length, rotary_dim]`` float32 for positions ``start .. start + length - 1``.

        Raises:
            UnsupportedModelError: when the positions pass the static bound of a ``longrope`` model.
        """
        end = start + length
        if self._limit is not None and end > self._limit:
            raise UnsupportedModelError(
                f"position {end - 1} is past original_max_position_embeddings={self._limit}, where longrope "
                "switches to its long factors; re-rotation is exact only below it"
            )
        if end > self._cos.shape[0]:
            target = max(end, 2 * self._cos.shape[0])
            self._grow(target if self._limit is None else min(target, self._limit))
        return self._cos[start:end], self._sin[start:end]

    def rotate(self, k: torch.Tensor, start: int) -> torch.Tensor:
        """Rotate ``k: [..., T, head_dim]`` (pre-RoPE) to positions ``start .. start + T - 1``."""
        cos, sin = self.slice(start, k.shape[-2])
        return apply_rope(k, cos, sin)
