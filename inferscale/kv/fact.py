"""The unit the KV core stores and injects: one memory fact's per-layer pre-RoPE keys and values."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True, slots=True)
class FactKV:
    """K/V of one fact's own tokens, captured while encoding it (after its context, if any).

    Attributes:
        keys: ``[n_layers, n_kv_heads, n_tokens, head_dim]`` pre-RoPE keys (after any key norm).
        values: ``[n_layers, n_kv_heads, n_tokens, head_dim]`` values; same dtype and device as ``keys``.
        token_ids: ``[n_tokens]`` int64, on the CPU: the fact's tokens, exactly as laid into the prompt.
        encoded_at: position of the fact's first token when it was encoded: its context length plus any position
            gap (:attr:`inferscale.kv.encode.EncodeRequest.position_gap`), in tokens.
        source: path of a safetensors file in the KV store's layout holding exactly these K/V (set by the KV
            store's disk tier), or ``None``. An engine in another process (vLLM's workers) reads that file instead
            of a staged copy.
    """

    keys: torch.Tensor
    values: torch.Tensor
    token_ids: torch.Tensor
    encoded_at: int
    source: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.keys.shape != self.values.shape or self.keys.dim() != 4:
            raise ValueError(
                f"keys and values must share a [layers, kv_heads, tokens, head_dim] shape, got "
                f"{tuple(self.keys.shape)} and {tuple(self.values.shape)}"
            )
        if self.token_ids.dim() != 1 or self.token_ids.shape[0] != self.keys.shape[2]:
            raise ValueError(f"token_ids must be [n_tokens={self.keys.shape[2]}], got {tuple(self.token_ids.shape)}")

    @property
    def n_tokens(self) -> int:
        """Tokens in the fact (tokens)."""
        return int(self.keys.shape[2])

    @property
    def nbytes(self) -> int:
        """Bytes held by keys and values (bytes)."""
        return self.keys.numel() * self.keys.element_size() * 2

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> FactKV:
        """A copy on ``device`` (and ``dtype``, if given); token ids stay on the CPU. The copy keeps
        :attr:`source` unless the dtype changes (the file then no longer holds these values)."""
        same_dtype = dtype is None or dtype == self.keys.dtype
        return FactKV(
            self.keys.to(device=device, dtype=dtype or self.keys.dtype),
            self.values.to(device=device, dtype=dtype or self.values.dtype),
            self.token_ids,
            self.encoded_at,
            self.source if same_dtype else None,
        )

    def with_source(self, source: str | None) -> FactKV:
        """The same tensors (not copied), recorded as held by the file ``source``."""
        return FactKV(self.keys, self.values, self.token_ids, self.encoded_at, source)
