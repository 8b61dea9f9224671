"""K/V at rest in 8 bits: a fact's keys and values as 8-bit codes with float32 scales, ``x ≈ codes * scale``.

A fact is quantised once, when its K/V are stored (after encoding; keys before RoPE), and dequantised where the
cache is assembled, on that device, to the engine's dtype (:func:`inferscale.kv.compose.assemble`). Only torch
primitives: an ``amax`` per group for the scale, then ``.to(torch.float8_e4m3fn)`` or ``round``/``clamp`` to
``int8``; no bit packing.

The formats (``kv.storage_format``), each a fixed scale layout over ``[n_layers, n_kv_heads, n_tokens, head_dim]``:

- ``"model"``: the model's dtype, no scales (the default);
- ``"float8_e4m3"``: ``torch.float8_e4m3fn`` codes (3 mantissa bits, max 448), one scale per (layer, head) for
  keys and for values. A float8 code keeps a relative precision of 2^-4 over 17 binades, so per-channel key scales
  only halve its KL, and they cost 23 KB per fact for SmolLM2-135M (a whole bfloat16 token) where per (layer, head)
  costs 720 bytes: 2x smaller than bfloat16 rather than 1.8x for a ~20-token fact;
- ``"int8"``: symmetric ``int8`` codes in the KIVI layout (Liu et al. 2024): keys per channel (one scale per
  (layer, head, channel), over the fact's tokens: outlier channels keep their own range), values per token (one
  scale per (layer, head, token), over ``head_dim``). Its first-token KL is ~100x below float8's in float32.

What each costs in answers is measured by ``benchmarks/kv_quantization.py`` (docs/architecture.md, "K/V at rest in
8 bits"); ``"model"`` stays the default.

Error bounds, per element, with ``s`` the element's scale (tested in ``tests/kv/test_kv_quantization.py``):
float8 e4m3, ``|x - x̂| <= 2^-4 |x| + 2^-10 s`` (half an ulp of a 3-bit mantissa, or of the subnormal step
2^-9 below 2^-6); int8, ``|x - x̂| <= s / 2``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch

from inferscale.errors import ConfigError
from inferscale.formats import StorageFormat

__all__ = [
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
    """An 8-bit storage format: the code dtype, its largest magnitude and the scale layout of keys and values.

    Attributes:
        name: the ``kv.storage_format`` value.
        code_dtype: ``torch.float8_e4m3fn`` or ``torch.int8``.
        code_max: the largest code magnitude used (448 for e4m3, 127 for int8: symmetric, -128 unused).
        key_scale, value_scale: the :data:`ScaleAxis` of keys and of values.
    """

    name: str
    code_dtype: torch.dtype
    code_max: float
    key_scale: ScaleAxis
    value_scale: ScaleAxis

    @property
    def tag(self) -> str:
        """The format and its scale layout in one token, e.g. ``"int8:k=channel,v=token"``: what the KV key and
        the file's header record (:func:`storage_tag`)."""
        return f"{self.name}:k={self.key_scale},v={self.value_scale}"


FORMATS: dict[str, QuantFormat] = {
    "float8_e4m3": QuantFormat("float8_e4m3", torch.float8_e4m3fn, 448.0, "head", "head"),
    "int8": QuantFormat("int8", torch.int8, 127.0, "channel", "token"),
}
"""The 8-bit formats by name (every :data:`StorageFormat` but ``"model"``)."""


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
    ``";kv=int8:k=channel,v=token"``. Raises :class:`ConfigError` as :func:`quant_format`."""
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
    """What turns a fact's 8-bit codes back into K/V: ``keys ≈ codes.float() * scales.keys`` (broadcast), likewise
    values.

    Attributes:
        format: the :attr:`QuantFormat.name` (``"float8_e4m3"`` or ``"int8"``).
        keys: float32 key scales, ``[L, H, 1, D]`` (per channel) or ``[L, H, 1, 1]`` (per head).
        values: float32 value scales, ``[L, H, T, 1]`` (per token) or ``[L, H, 1, 1]`` (per head).
        dtype: the dtype the K/V had before quantisation (what :func:`dequantize` gives back when none is asked).
    """

    format: str
    keys: torch.Tensor
    values: torch.Tensor
    dtype: torch.dtype

    @property
    def spec(self) -> QuantFormat:
        """The format's :class:`QuantFormat`."""
        fmt = quant_format(self.format)
        if fmt is None:
            raise ConfigError("KVScales.format must name an 8-bit format, not 'model'")
        return fmt

    @property
    def nbytes(self) -> int:
        """Bytes held by both scale tensors (bytes)."""
        return sum(t.numel() * t.element_size() for t in (self.keys, self.values))


def scale_shape(axis: ScaleAxis, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of the scales of a ``[L, H, T, D]`` tensor of this ``shape`` under ``axis``."""
    return tuple(1 if dim in _REDUCED[axis] else size for dim, size in enumerate(shape))


def quantize(x: torch.Tensor, fmt: QuantFormat, axis: ScaleAxis) -> tuple[torch.Tensor, torch.Tensor]:
    """8-bit codes and scales of ``x``, on its device.

    Each group's scale is ``amax(|x|) / fmt.code_max`` (float32; at least the smallest normal float32, so a group
    of zeros gets codes 0), and ``codes = x / scale`` rounded to ``fmt.code_dtype``: nearest-even by the float8 cast,
    ``round`` then ``clamp`` for int8.

    Args:
        x: ``[n_layers, n_kv_heads, n_tokens, head_dim]``, any float dtype.
        fmt: the format.
        axis: what one scale covers (:data:`ScaleAxis`).

    Returns:
        ``(codes, scale)``: codes ``[L, H, T, D]`` in ``fmt.code_dtype``; scale float32 of
        :func:`scale_shape` ``(axis, x.shape)``.
    """
    x32 = x.detach().float()
    amax = x32.abs().amax(dim=_REDUCED[axis], keepdim=True)
    scale = (amax / fmt.code_max).clamp_min(torch.finfo(torch.float32).tiny)
    scaled = (x32 / scale).clamp(-fmt.code_max, fmt.code_max)
    if fmt.code_dtype.is_floating_point:
        return scaled.to(fmt.code_dtype), scale
    return scaled.round().to(fmt.code_dtype), scale


def dequantize(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``codes * scale`` in ``dtype``, computed in float32 on the codes' device.

    Args:
        codes: ``[L, H, T, D]`` 8-bit codes.
        scale: float32, broadcastable to ``codes`` and on the same device.
        dtype: the dtype returned (the engine's).

    Returns:
        ``[L, H, T, D]`` in ``dtype``.
    """
    return (codes.float() * scale).to(dtype)
