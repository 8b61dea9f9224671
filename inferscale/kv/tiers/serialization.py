"""Serialisation, apart from transport: :class:`FactKV` + :class:`KVKey` <-> named tensors + str metadata.

The layout is safetensors-shaped (a flat ``str -> Tensor`` dict and a ``str -> str`` header) and holds the full
key, so a reader can tell which model, text and encoding an entry belongs to before loading its tensors.
K/V in the model's dtype (``format`` ``inferscale.kv/1``, as before 8-bit storage)::

    tensors:  keys [n_layers, n_kv_heads, n_tokens, head_dim]  (model dtype, e.g. bfloat16)
              values [n_layers, n_kv_heads, n_tokens, head_dim] (same dtype)
              token_ids [n_tokens] int64
    metadata: format, storage_format ("model"), memory_id, text_hash, fingerprint, encoding_key, encoded_at,
              checksum, header_checksum

K/V in 8 bits (``format`` ``inferscale.kv/2``, :mod:`inferscale.kv.quantization`; a reader of ``/1`` only refuses
it rather than read codes as K/V)::

    tensors:  keys, values [n_layers, n_kv_heads, n_tokens, head_dim]  (float8_e4m3fn or uint8 codes)
              key_scale, value_scale  [L, H, 1, D] / [L, H, T, 1] / [L, H, 1, 1] as the layout says, in the
                                      format's scale dtype (float32 for float8, bfloat16 for int8)
              key_offset, value_offset  shaped and typed as the scales, for an affine format (int8) only
              token_ids [n_tokens] int64
    metadata: as above, storage_format ("float8_e4m3" or "int8"), storage_tag (the format with its layout,
              :attr:`~inferscale.kv.quantization.QuantFormat.tag`), key_scale and value_scale (the scale layouts,
              e.g. "channel" and "token") and kv_dtype (the dtype the K/V were quantised from, e.g. "bfloat16").
              A file without storage_tag was written before it was recorded: its tag is read as
              ``<storage_format>:k=<key_scale>,v=<value_scale>`` (int8 was symmetric then, and is refused now)

``checksum`` is ``sha256:<hex>`` over every tensor's name, dtype, shape and bytes (:func:`tensors_checksum`): a file
whose tensors were changed in place (a failing disk, a tool that rewrote them) is refused with
:class:`KVChecksumError` instead of being injected. ``header_checksum`` is the same over every other header field
(:func:`header_checksum`), so a header changed in place (a flipped byte in its fingerprint, a garbled
``encoded_at``) is told apart from a whole file written under another key, which :func:`check_key` refuses. Files
written before either was recorded have none and are read unchecked. A field added to the header later is covered
by the same checksum (it hashes whatever the header holds); another way of hashing would need another field name,
or this version would take every file written that way for damaged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch

from inferscale.errors import InferScaleError, KVFingerprintMismatchError
from inferscale.kv.fact import FactKV
from inferscale.kv.quantization import FORMATS, STORAGE_FORMATS, KVScales
from inferscale.kv.tiers.base import KVKey

FORMAT = "inferscale.kv/1"
"""The metadata ``format`` of K/V in the model's dtype; files without the field (older stores) use this layout."""

QUANTIZED_FORMAT = "inferscale.kv/2"
"""The metadata ``format`` of 8-bit K/V with scales."""

KEY_FIELDS = ("memory_id", "text_hash", "fingerprint", "encoding_key")

_DTYPES: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d for d in (torch.float32, torch.bfloat16, torch.float16)
}
"""The dtypes 8-bit K/V may be dequantised back to by default (``kv_dtype``), by name."""


class KVFormatError(InferScaleError, ValueError):
    """A stored entry is not in a layout this version reads (unknown ``format`` or ``storage_format``, a scale
    layout this version does not know, missing tensor or field)."""


class KVChecksumError(KVFormatError):
    """A stored entry's header or tensors do not match the checksums written with them: the file was changed after
    it was written. Its K/V must not be injected."""


CHECKSUM_PREFIX = "sha256:"


def tensors_checksum(tensors: Mapping[str, torch.Tensor]) -> str:
    """``sha256:<64 hex>`` over the tensors sorted by name: each one's name, dtype, shape and bytes (tensors on
    another device are copied to the CPU). About 0.5 ms per 500 KB on this project's CPUs."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().to("cpu").contiguous()
        digest.update(f"{name}|{str(tensor.dtype).removeprefix('torch.')}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().data)
    return CHECKSUM_PREFIX + digest.hexdigest()


def check_checksum(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str], source: str) -> None:
    """Refuse tensors that do not match the ``checksum`` in ``metadata`` (entries without one are not checked).

    Raises:
        KVChecksumError: naming ``source`` and both checksums.
    """
    recorded = metadata.get("checksum")
    if recorded is None:
        return
    found = tensors_checksum(tensors)
    if found != recorded:
        raise KVChecksumError(
            f"{source} holds K/V that do not match the checksum written with them ({found} != {recorded}): the "
            "file was changed after it was written; refusing to inject it"
        )


def header_checksum(metadata: Mapping[str, str]) -> str:
    """``sha256:<64 hex>`` over every header field but ``header_checksum`` itself, sorted by name (name and value of
    each, length-prefixed so no two headers collide by how their fields are cut)."""
    digest = hashlib.sha256()
    for name in sorted(metadata):
        if name != "header_checksum":
            for part in (name, metadata[name]):
                data = part.encode()
                digest.update(len(data).to_bytes(8, "little") + data)
    return CHECKSUM_PREFIX + digest.hexdigest()


def check_header(metadata: Mapping[str, str], source: str) -> None:
    """Refuse a header that does not match the ``header_checksum`` written in it (headers without one are not
    checked): it was changed after the file was written, so none of its fields can be trusted.

    Raises:
        KVChecksumError: naming ``source``.
    """
    recorded = metadata.get("header_checksum")
    if recorded is not None and header_checksum(metadata) != recorded:
        raise KVChecksumError(
            f"{source} has a header that does not match the checksum written with it: the file was changed after "
            "it was written; refusing to inject it"
        )


def fact_to_payload(key: KVKey, fact: FactKV) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Named CPU tensors and metadata of ``fact`` stored under ``key``.

    Returns:
        ``(tensors, metadata)``: contiguous CPU tensors (``keys``, ``values`` in the fact's dtype or as 8-bit codes,
        the scales of 8-bit K/V and an affine format's offsets; ``token_ids`` int64) and the header strings, which
        include every :class:`KVKey` field, the storage format, the tensors' checksum (:func:`tensors_checksum`) and the
        header's own (:func:`header_checksum`).
    """
    tensors = {
        "keys": fact.keys.detach().to("cpu").contiguous(),
        "values": fact.values.detach().to("cpu").contiguous(),
        "token_ids": fact.token_ids.to(device="cpu", dtype=torch.int64).contiguous(),
    }
    metadata = {"format": FORMAT, "storage_format": fact.storage_format}
    if fact.scales is not None:
        fmt = fact.scales.spec
        tensors["key_scale"] = fact.scales.keys.detach().to("cpu").contiguous()
        tensors["value_scale"] = fact.scales.values.detach().to("cpu").contiguous()
        if fact.scales.key_offsets is not None and fact.scales.value_offsets is not None:
            tensors["key_offset"] = fact.scales.key_offsets.detach().to("cpu").contiguous()
            tensors["value_offset"] = fact.scales.value_offsets.detach().to("cpu").contiguous()
        metadata.update(
            format=QUANTIZED_FORMAT,
            storage_tag=fmt.tag,
            key_scale=fmt.key_scale,
            value_scale=fmt.value_scale,
            kv_dtype=str(fact.scales.dtype).removeprefix("torch."),
        )
    metadata.update({name: getattr(key, name) for name in KEY_FIELDS})
    metadata["encoded_at"] = str(int(fact.encoded_at))
    metadata["checksum"] = tensors_checksum(tensors)
    metadata["header_checksum"] = header_checksum(metadata)
    return tensors, metadata


def key_from_metadata(metadata: Mapping[str, str], source: str) -> KVKey:
    """The :class:`KVKey` an entry was written under.

    Args:
        metadata: the entry's header.
        source: where it came from (a path), for error messages.

    Raises:
        KVFormatError: when ``format`` is unknown or a key field is missing.
    """
    fmt = metadata.get("format", FORMAT)
    if fmt not in (FORMAT, QUANTIZED_FORMAT):
        raise KVFormatError(f"{source} has format {fmt!r}; this version reads {FORMAT!r} and {QUANTIZED_FORMAT!r}")
    missing = [name for name in (*KEY_FIELDS, "encoded_at") if name not in metadata]
    if missing:
        raise KVFormatError(f"{source} lacks metadata fields {missing}; it was not written by the KV store")
    return KVKey(*(metadata[name] for name in KEY_FIELDS))


def check_key(metadata: Mapping[str, str], expected: KVKey, source: str) -> None:
    """Refuse an entry whose recorded key is not ``expected``.

    Raises:
        KVFingerprintMismatchError: naming the first differing field (fingerprint, text hash, encoding key or
            memory id) with both values; the entry must not be injected.
        KVFormatError: as :func:`key_from_metadata`.
    """
    recorded = key_from_metadata(metadata, source)
    for name in ("fingerprint", "text_hash", "encoding_key", "memory_id"):
        if getattr(recorded, name) != getattr(expected, name):
            raise KVFingerprintMismatchError(
                f"KV entry {source} was written for {name}={getattr(recorded, name)!r}, but "
                f"{getattr(expected, name)!r} was requested; refusing to inject it (delete the file, or the "
                "memory's entries with delete_memory, to re-encode it)"
            )


def _scales(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str], source: str) -> KVScales | None:
    """The scales of an 8-bit entry (``None`` for K/V in a float dtype), its layout checked against this version's.

    Raises:
        KVFormatError: for an unknown storage format or dtype, a storage tag (scale layout, offsets) other than
            the format's, a missing scale or offset tensor, or a ``format`` that does not match the storage format.
    """
    name = metadata.get("storage_format", "model")
    if name not in STORAGE_FORMATS:
        raise KVFormatError(
            f"{source} holds K/V stored as {name!r}; this version reads {list(STORAGE_FORMATS)}: delete the file "
            "(or the memory's entries) to re-encode it"
        )
    quantized = name != "model"
    if metadata.get("format", FORMAT) != (QUANTIZED_FORMAT if quantized else FORMAT):
        raise KVFormatError(f"{source} has format {metadata.get('format')!r} for storage format {name!r}")
    if not quantized:
        return None
    spec = FORMATS[name]
    layout = (metadata.get("key_scale"), metadata.get("value_scale"))
    if layout != (spec.key_scale, spec.value_scale):
        raise KVFormatError(
            f"{source} holds {name} K/V with key/value scales per {layout}; this version reads "
            f"{(spec.key_scale, spec.value_scale)}"
        )
    tag = metadata.get("storage_tag", f"{name}:k={layout[0]},v={layout[1]}")
    if tag != spec.tag:
        raise KVFormatError(
            f"{source} holds {name} K/V stored as {tag!r}; this version reads {spec.tag!r}: delete the file (or the "
            "memory's entries) to re-encode it"
        )
    dtype = _DTYPES.get(metadata.get("kv_dtype", ""))
    wanted = ("key_scale", "value_scale", *(("key_offset", "value_offset") if spec.affine else ()))
    missing = [t for t in wanted if t not in tensors]
    if dtype is None or missing:
        raise KVFormatError(
            f"{source} lacks {missing or ['a known kv_dtype']} for its {name} K/V; it was not written by the KV store"
        )
    offsets = (tensors.get("key_offset"), tensors.get("value_offset"))
    return KVScales(name, tensors["key_scale"], tensors["value_scale"], dtype, *offsets)


def fact_from_payload(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str], source: str) -> FactKV:
    """The :class:`FactKV` of a stored entry (tensors as given, 8-bit K/V with their scales; ``token_ids`` on the
    CPU).

    Raises:
        KVChecksumError: when the header or the tensors do not match the entry's checksums (:func:`check_header`,
            :func:`check_checksum`).
        KVFormatError: when a tensor or ``encoded_at`` is missing or malformed, or the storage format or its scale
            layout is not one this version reads.
    """
    check_header(metadata, source)  # first: a damaged field name is damage, not a missing field
    missing = [name for name in ("keys", "values", "token_ids") if name not in tensors]
    if missing or "encoded_at" not in metadata:
        raise KVFormatError(f"{source} lacks {missing or ['encoded_at']}; it was not written by the KV store")
    check_checksum(tensors, metadata, source)
    scales = _scales(tensors, metadata, source)
    try:
        return FactKV(
            tensors["keys"], tensors["values"], tensors["token_ids"].cpu(), int(metadata["encoded_at"]), None, scales
        )
    except ValueError as exc:
        raise KVFormatError(f"{source} holds malformed K/V: {exc}") from exc
