"""The unit the KV core stores and injects: one memory fact's per-layer pre-RoPE keys and values."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from inferscale.errors import InvalidInputError
from inferscale.kv.quantization import KVScales, dequantize, quant_format, quantize, scale_shape, storage_tag


@dataclass(frozen=True, slots=True)
class FactKV:
    """K/V of one fact's own tokens, captured while encoding it (after its context, if any).

    Held either in a float dtype (the model's), or in 8 bits with :attr:`scales` (``kv.storage_format``,
    :mod:`inferscale.kv.quantization`): then ``keys`` and ``values`` are codes, and :meth:`dequantized` gives the
    K/V back; the assembly does that on its own device (:func:`inferscale.kv.compose.assemble`).

    Attributes:
        keys: ``[n_layers, n_kv_heads, n_tokens, head_dim]`` pre-RoPE keys (after any key norm), or their 8-bit
            codes.
        values: ``[n_layers, n_kv_heads, n_tokens, head_dim]`` values, or their codes; same dtype and device as
            ``keys``.
        token_ids: ``[n_tokens]`` int64, on the CPU: the fact's tokens, exactly as laid into the prompt.
        encoded_at: position of the fact's first token when it was encoded: its context length plus any position
            gap (:attr:`inferscale.kv.encode.EncodeRequest.position_gap`), in tokens.
        source: path of a safetensors file in the KV store's layout holding exactly these K/V (set by the KV
            store's disk tier), or ``None``. An engine in another process (vLLM's workers) reads that file instead
            of a staged copy.
        scales: the scales of 8-bit ``keys``/``values`` (on their device), or ``None`` for K/V in a float dtype.

    Raises:
        ValueError: when keys and values differ in shape, token ids do not match, or the codes, scales and offsets
            do not fit their format (dtype, shape, offsets present for an affine format only).
    """

    keys: torch.Tensor
    values: torch.Tensor
    token_ids: torch.Tensor
    encoded_at: int
    source: str | None = field(default=None, compare=False)
    scales: KVScales | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.keys.shape != self.values.shape or self.keys.dim() != 4:
            raise ValueError(
                f"keys and values must share a [layers, kv_heads, tokens, head_dim] shape, got "
                f"{tuple(self.keys.shape)} and {tuple(self.values.shape)}"
            )
        if self.token_ids.dim() != 1 or self.token_ids.shape[0] != self.keys.shape[2]:
            raise ValueError(f"token_ids must be [n_tokens={self.keys.shape[2]}], got {tuple(self.token_ids.shape)}")
        if self.scales is not None:
            fmt = self.scales.spec
            shape = tuple(self.keys.shape)
            if self.keys.dtype != fmt.code_dtype or self.values.dtype != fmt.code_dtype:
                raise ValueError(f"{fmt.name} K/V must be {fmt.code_dtype} codes, got {self.keys.dtype}")
            offsets = (self.scales.key_offsets, self.scales.value_offsets)
            if [o is not None for o in offsets] != [fmt.affine, fmt.affine]:
                raise ValueError(f"{fmt.name} K/V need {'both' if fmt.affine else 'no'} key and value offsets")
            for name, scale, offset, axis in (
                ("key", self.scales.keys, offsets[0], fmt.key_scale),
                ("value", self.scales.values, offsets[1], fmt.value_scale),
            ):
                for kind, t, dtype in (("scales", scale, fmt.scale_dtype), ("offsets", offset, fmt.scale_dtype)):
                    if t is not None and (tuple(t.shape) != scale_shape(axis, shape) or t.dtype != dtype):
                        raise ValueError(
                            f"{fmt.name} {name} {kind} must be {dtype} {list(scale_shape(axis, shape))} "
                            f"(per {axis}), got {t.dtype} {list(t.shape)}"
                        )

    @property
    def n_tokens(self) -> int:
        """Tokens in the fact (tokens)."""
        return int(self.keys.shape[2])

    @property
    def storage_format(self) -> str:
        """``"model"`` for K/V in a float dtype, else the 8-bit format's name (``"float8_e4m3"``, ``"int8"``)."""
        return "model" if self.scales is None else self.scales.format

    @property
    def storage_tag(self) -> str:
        """:func:`inferscale.kv.quantization.storage_tag` of :attr:`storage_format`: the format with its scale
        layout, as the KV key records it (:attr:`inferscale.kv.store.KVKey.storage_tag`)."""
        return storage_tag(self.storage_format)

    @property
    def nbytes(self) -> int:
        """Bytes held by keys and values, and by the scales of 8-bit K/V (bytes)."""
        codes = self.keys.numel() * self.keys.element_size() * 2
        return codes + (self.scales.nbytes if self.scales is not None else 0)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the K/V these tensors stand for: ``keys.dtype``, or for 8-bit K/V the dtype they were
        quantised from."""
        return self.keys.dtype if self.scales is None else self.scales.dtype

    def map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> FactKV:
        """A copy with ``fn`` applied to keys, values and scales (not to the token ids), e.g. to move them to
        another device; :attr:`source` is kept, so ``fn`` must not change values."""
        scales = None if self.scales is None else self.scales.map_tensors(fn)
        return FactKV(fn(self.keys), fn(self.values), self.token_ids, self.encoded_at, self.source, scales)

    def quantized(self, storage_format: str) -> FactKV:
        """These K/V stored as ``storage_format`` (:mod:`inferscale.kv.quantization`), on the same device: the
        same object for ``"model"`` or for K/V already in that format.

        Raises:
            ConfigError: for an unknown format name.
            InvalidInputError: for K/V already in another 8-bit format (quantising codes again would add a second
                rounding: encode the fact again instead).
        """
        fmt = quant_format(storage_format)
        if fmt is None or self.storage_format == storage_format:
            return self
        if self.scales is not None:
            raise InvalidInputError(
                f"these K/V are stored as {self.storage_format!r}; quantising them to {storage_format!r} would round "
                "them twice: encode the fact again"
            )
        keys, key_scale, key_offset = quantize(self.keys, fmt, fmt.key_scale)
        values, value_scale, value_offset = quantize(self.values, fmt, fmt.value_scale)
        scales = KVScales(fmt.name, key_scale, value_scale, self.keys.dtype, key_offset, value_offset)
        return FactKV(keys, values, self.token_ids, self.encoded_at, self.source, scales)

    def dequantized(self, dtype: torch.dtype | None = None) -> FactKV:
        """K/V in ``dtype`` (default :attr:`dtype`), computed on their device: 8-bit K/V dequantised
        (:func:`inferscale.kv.quantization.dequantize`), others cast (the same object when already in ``dtype``).
        :attr:`source` is kept when the result is in :attr:`dtype` (the file holds exactly those values)."""
        target = dtype or self.dtype
        if self.scales is None:
            return self if self.keys.dtype == target else self.to(self.keys.device, target)
        return FactKV(
            dequantize(self.keys, self.scales.keys, target, self.scales.key_offsets),
            dequantize(self.values, self.scales.values, target, self.scales.value_offsets),
            self.token_ids,
            self.encoded_at,
            self.source if target == self.dtype else None,
        )

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> FactKV:
        """A copy on ``device`` (and ``dtype``, if given); token ids stay on the CPU. The copy keeps
        :attr:`source` unless the dtype changes (the file then no longer holds these values).

        8-bit K/V are moved as codes and scales, then, with ``dtype``, dequantised on ``device``."""
        if self.scales is not None:
            moved = self.map_tensors(lambda t: t.to(device))
            return moved if dtype is None else moved.dequantized(dtype)
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
        return FactKV(self.keys, self.values, self.token_ids, self.encoded_at, source, self.scales)
