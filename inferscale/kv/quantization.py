"""K/V at rest in 8 bits: a fact's keys and values as 8-bit codes with a scale (and, for int8, an offset) per group,
``x ≈ codes * scale + offset``.

A fact is quantised once, when its K/V are stored (after encoding; keys before RoPE), and dequantised where the
cache is assembled, on that device, to the engine's dtype (:func:`inferscale.kv.compose.assemble`). Only torch
primitives: ``amin``/``amax`` per group for the scale (and offset), then ``.to(torch.float8_e4m3fn)`` or
``round``/``clamp`` to ``uint8``; no bit packing.

The formats (``kv.storage_format``), each a fixed scale layout over ``[n_layers, n_kv_heads, n_tokens, head_dim]``:

- ``"model"``: the model's dtype, no scales (the default);
- ``"float8_e4m3"``: ``torch.float8_e4m3fn`` codes (3 mantissa bits, max 448), one float32 scale per (layer, head)
  for keys and for values. A float8 code keeps a relative precision of 2^-4 over 17 binades, so per-channel key
  scales only halve its KL, and they cost 23 KB per fact for SmolLM2-135M (a whole bfloat16 token) where per
  (layer, head) costs 720 bytes: 2x smaller than bfloat16 rather than 1.8x for a ~20-token fact;
- ``"int8"``: affine 8-bit integer codes in the KIVI layout with zero points (Liu et al. 2024, "KIVI", Sec. 3):
  keys per channel (one scale and offset per (layer, head, channel), over the fact's tokens: outlier channels keep
  their own range), values per token (one per (layer, head, token), over ``head_dim``). Each group's codes span
  its own ``[min, max]`` (``uint8`` 0-255, ``x ≈ code * scale + offset``), so a channel whose keys sit away from
  zero keeps its steps for its own range: about half the key error of symmetric codes. Offset and scale are
  bfloat16, the offset rounded down and the scale up so the group's range stays covered: 4 bytes a group, what the
  float32 scale of symmetric codes took.

What each costs in answers is measured by ``benchmarks/kv_quantization.py`` (docs/architecture.md, "K/V at rest in
8 bits"); ``"model"`` stays the default.

Error bounds, per element, with ``s`` the element's stored scale (tested in ``tests/kv/test_kv_quantization.py``):
float8 e4m3, ``|x - x̂| <= 2^-4 |x| + 2^-10 s`` (half an ulp of a 3-bit mantissa, or of the subnormal step
2^-9 below 2^-6); int8, ``|x - x̂| <= s / 2`` (plus float32 rounding of ``code * s + offset``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from inferscale.errors import ConfigError
from inferscale.formats import StorageFormat

__all__ = [
    "CURRENT_STORAGE_TAGS",
    "FORMATS",
    "STORAGE_FORMATS",
    "KVScales",
    "QuantFormat",
    "ScaleAxis",
    "StorageFormat",
    "dequantize",
    "encoding_setting",
    "quant_format",
    "quantize",
    "scale_shape",
    "storage_tag",
    "tag_of_encoding_key",
]

STORAGE_FORMATS: tuple[str, ...] = get_args(StorageFormat)

ScaleAxis = Literal["channel", "token", "head"]
"""What one scale covers in ``[n_layers, n_kv_heads, n_tokens, head_dim]``: ``"channel"``, one per (layer, head,
channel) over the tokens (``[L, H, 1, D]``); ``"token"``, one per (layer, head, token) over the channels
(``[L, H, T, 1]``); ``"head"``, one per (layer, head) (``[L, H, 1, 1]``)."""

_REDUCED: dict[str, tuple[int, ...]] = {"channel": (2,), "token": (3,), "head": (2, 3)}
"""The dims of ``[L, H, T, D]`` each scale axis takes its amax over (kept as size 1)."""


@dataclass(frozen=True, slots=True)
class QuantFormat:
    """An 8-bit storage format: the code dtype, its code range and the scale layout of keys and values.

    Attributes:
        name: the ``kv.storage_format`` value.
        code_dtype: ``torch.float8_e4m3fn`` or ``torch.uint8``.
        code_max: the largest code used: 448 for e4m3 (symmetric, ``-448..448``), 255 for int8 (``0..255``).
        key_scale, value_scale: the :data:`ScaleAxis` of keys and of values.
        affine: whether each group also has an offset (its minimum): ``x ≈ code * scale + offset``, codes from 0;
            otherwise ``x ≈ code * scale``.
        scale_dtype: the dtype scales (and offsets) are stored in.
    """

    name: str
    code_dtype: torch.dtype
    code_max: float
    key_scale: ScaleAxis
    value_scale: ScaleAxis
    affine: bool = False
    scale_dtype: torch.dtype = torch.float32

    @property
    def tag(self) -> str:
        """The format and its scale layout in one token, e.g. ``"int8:k=channel,v=token,offset"``: what the KV key
        and the file's header record (:func:`storage_tag`)."""
        tag = f"{self.name}:k={self.key_scale},v={self.value_scale}"
        return f"{tag},offset" if self.affine else tag


FORMATS: dict[str, QuantFormat] = {
    "float8_e4m3": QuantFormat("float8_e4m3", torch.float8_e4m3fn, 448.0, "head", "head"),
    "int8": QuantFormat("int8", torch.uint8, 255.0, "channel", "token", affine=True, scale_dtype=torch.bfloat16),
}
"""The 8-bit formats by name (every :data:`StorageFormat` but ``"model"``)."""

CURRENT_STORAGE_TAGS: frozenset[str] = frozenset({"model", *(fmt.tag for fmt in FORMATS.values())})
"""The storage tags this version writes and reads (:func:`storage_tag`); an entry under any other (an earlier
layout of a format) is never looked up again."""


def quant_format(name: str) -> QuantFormat | None:
    """The 8-bit format called ``name``, or ``None`` for ``"model"`` (no quantisation).

    Raises:
        ConfigError: for a name that is not a :data:`StorageFormat`.
    """
    if name == "model":
        return None
    found = FORMATS.get(name)
    if found is None:
        raise ConfigError(f"unknown K/V storage format {name!r}; choose one of {list(STORAGE_FORMATS)}")
    return found


def storage_tag(name: str) -> str:
    """``"model"``, or the 8-bit format's :attr:`QuantFormat.tag`. Raises :class:`ConfigError` as
    :func:`quant_format`."""
    fmt = quant_format(name)
    return "model" if fmt is None else fmt.tag


_KEY_SETTING = "kv="


def encoding_setting(name: str) -> str:
    """The part of an encoding key (:func:`inferscale.kv.fingerprint.encoding_key`) that names the storage format:
    ``""`` for ``"model"`` (keys written before 8-bit storage stay valid), else ``";kv=<tag>"``, e.g.
    ``";kv=int8:k=channel,v=token,offset"``. Raises :class:`ConfigError` as :func:`quant_format`."""
    fmt = quant_format(name)
    return "" if fmt is None else f";{_KEY_SETTING}{fmt.tag}"


def tag_of_encoding_key(encoding_key: str) -> str:
    """The storage tag an encoding key records (:func:`encoding_setting`): ``"model"`` when it names none."""
    for part in encoding_key.split(";"):
        if part.startswith(_KEY_SETTING):
            return part[len(_KEY_SETTING) :]
    return "model"


@dataclass(frozen=True, slots=True)
class KVScales:
    """What turns a fact's 8-bit codes back into K/V: ``keys ≈ codes.float() * scales.keys + scales.key_offsets``
    (broadcast; no offset for a format that is not affine), likewise values.

    Attributes:
        format: the :attr:`QuantFormat.name` (``"float8_e4m3"`` or ``"int8"``).
        keys: key scales in the format's ``scale_dtype``, ``[L, H, 1, D]`` (per channel) or ``[L, H, 1, 1]`` (per
            head).
        values: value scales, ``[L, H, T, 1]`` (per token) or ``[L, H, 1, 1]`` (per head).
        dtype: the dtype the K/V had before quantisation (what :func:`dequantize` gives back when none is asked).
        key_offsets, value_offsets: the groups' offsets, shaped and typed as the scales, for an affine format;
            else ``None``.
    """

    format: str
    keys: torch.Tensor
    values: torch.Tensor
    dtype: torch.dtype
    key_offsets: torch.Tensor | None = None
    value_offsets: torch.Tensor | None = None

    @property
    def spec(self) -> QuantFormat:
        """The format's :class:`QuantFormat`."""
        fmt = quant_format(self.format)
        if fmt is None:
            raise ConfigError("KVScales.format must name an 8-bit format, not 'model'")
        return fmt

    @property
    def nbytes(self) -> int:
        """Bytes held by the scales and offsets (bytes)."""
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The scales, then the offsets when there are any."""
        if self.key_offsets is None or self.value_offsets is None:
            return (self.keys, self.values)
        return (self.keys, self.values, self.key_offsets, self.value_offsets)

    def map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> KVScales:
        """A copy with ``fn`` applied to every scale and offset (e.g. to move them to another device)."""
        return KVScales(
            self.format,
            fn(self.keys),
            fn(self.values),
            self.dtype,
            None if self.key_offsets is None else fn(self.key_offsets),
            None if self.value_offsets is None else fn(self.value_offsets),
        )


def scale_shape(axis: ScaleAxis, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of the scales of a ``[L, H, T, D]`` tensor of this ``shape`` under ``axis``."""
    return tuple(1 if dim in _REDUCED[axis] else size for dim, size in enumerate(shape))


def quantize(
    x: torch.Tensor, fmt: QuantFormat, axis: ScaleAxis
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """8-bit codes, scales and offsets of ``x``, on its device.

    Symmetric (float8): each group's scale is ``amax(|x|) / fmt.code_max`` (at least the smallest normal float32, so
    a group of zeros gets codes 0) and ``codes = x / scale``, rounded nearest-even by the float8 cast; no offset.
    Affine (int8): each group's offset is its minimum rounded down to ``fmt.scale_dtype`` and its scale ``(max -
    offset) / fmt.code_max`` rounded up to it (at least its smallest normal), so ``[offset, offset + code_max *
    scale]`` covers the group; ``codes = round((x - offset) / scale)``, clamped to ``0..code_max``.

    Args:
        x: ``[n_layers, n_kv_heads, n_tokens, head_dim]``, any float dtype. A non-finite element makes its whole
            group non-finite when dequantised (as it would be in the model's dtype: nothing is checked here).
        fmt: the format.
        axis: what one scale covers (:data:`ScaleAxis`).

    Returns:
        ``(codes, scale, offset)``: codes ``[L, H, T, D]`` in ``fmt.code_dtype``; scale and offset (``None`` unless
        ``fmt.affine``) in ``fmt.scale_dtype``, shaped :func:`scale_shape` ``(axis, x.shape)``.
    """
    x32 = x.detach().float()
    reduced = _REDUCED[axis]
    if not fmt.affine:
        amax = x32.abs().amax(dim=reduced, keepdim=True)
        scale = (amax / fmt.code_max).clamp_min(torch.finfo(torch.float32).tiny)
        scaled = (x32 / scale).clamp(-fmt.code_max, fmt.code_max)
        codes = scaled.to(fmt.code_dtype) if fmt.code_dtype.is_floating_point else scaled.round().to(fmt.code_dtype)
        return codes, scale.to(fmt.scale_dtype), None
    offset = _rounded(x32.amin(dim=reduced, keepdim=True), fmt.scale_dtype, up=False)
    wanted = ((x32.amax(dim=reduced, keepdim=True) - offset.float()) / fmt.code_max).clamp_min(
        torch.finfo(fmt.scale_dtype).tiny
    )
    scale = _rounded(wanted, fmt.scale_dtype, up=True)
    codes = ((x32 - offset.float()) / scale.float()).round().clamp(0, fmt.code_max).to(fmt.code_dtype)
    return codes, scale, offset


def _rounded(x: torch.Tensor, dtype: torch.dtype, *, up: bool) -> torch.Tensor:
    """``x`` (float32) in ``dtype``, rounded toward +inf (``up``) or -inf instead of to nearest."""
    near = x.to(dtype)
    past = near.float() < x if up else near.float() > x
    return torch.where(past, torch.nextafter(near, torch.full_like(near, float("inf") if up else float("-inf"))), near)


def dequantize(
    codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, offset: torch.Tensor | None = None
) -> torch.Tensor:
    """``codes * scale (+ offset)`` in ``dtype``, computed in float32 on the codes' device.

    Args:
        codes: ``[L, H, T, D]`` 8-bit codes.
        scale: ``[L, H, 1, D]``, ``[L, H, T, 1]`` or ``[L, H, 1, 1]`` (:func:`scale_shape`), float32 or bfloat16, on
            the codes' device.
        dtype: the dtype returned (the engine's): the error bounds above hold in float32, and casting to a narrower
            dtype adds its own rounding.
        offset: shaped as ``scale``, for an affine format (required for its unsigned codes); else ``None``.

    Returns:
        ``[L, H, T, D]`` in ``dtype``.
    """
    out = codes.float() * scale.float()
    if offset is not None:
        out = out + offset.float()
    return out.to(dtype)
