"""Serialisation, apart from transport: :class:`FactKV` + :class:`KVKey` <-> named tensors + str metadata.

The layout is safetensors-shaped (a flat ``str -> Tensor`` dict and a ``str -> str`` header) and holds the full
key, so a reader can tell which model, text and encoding an entry belongs to before loading its tensors::

    tensors:  keys [n_layers, n_kv_heads, n_tokens, head_dim]  (model dtype, e.g. bfloat16)
              values [n_layers, n_kv_heads, n_tokens, head_dim] (same dtype)
              token_ids [n_tokens] int64
    metadata: format, memory_id, text_hash, fingerprint, encoding_key, encoded_at
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from inferscale.errors import InferScaleError, KVFingerprintMismatchError
from inferscale.kv.fact import FactKV
from inferscale.kv.tiers.base import KVKey

FORMAT = "inferscale.kv/1"
"""The metadata ``format`` value written; files without the field (older stores) use the same layout."""

KEY_FIELDS = ("memory_id", "text_hash", "fingerprint", "encoding_key")


class KVFormatError(InferScaleError, ValueError):
    """A stored entry is not in a layout this version reads (unknown ``format``, missing tensor or field)."""


def fact_to_payload(key: KVKey, fact: FactKV) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Named CPU tensors and metadata of ``fact`` stored under ``key``.

    Returns:
        ``(tensors, metadata)``: contiguous CPU tensors (``keys``, ``values`` in the fact's dtype; ``token_ids``
        int64) and the header strings, which include every :class:`KVKey` field.
    """
    tensors = {
        "keys": fact.keys.detach().to("cpu").contiguous(),
        "values": fact.values.detach().to("cpu").contiguous(),
        "token_ids": fact.token_ids.to(device="cpu", dtype=torch.int64).contiguous(),
    }
    metadata = {"format": FORMAT, **{name: getattr(key, name) for name in KEY_FIELDS}}
    metadata["encoded_at"] = str(int(fact.encoded_at))
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
    if fmt != FORMAT:
        raise KVFormatError(f"{source} has format {fmt!r}; this version reads {FORMAT!r}")
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


def fact_from_payload(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str], source: str) -> FactKV:
    """The :class:`FactKV` of a stored entry (tensors as given; ``token_ids`` on the CPU).

    Raises:
        KVFormatError: when a tensor or ``encoded_at`` is missing or malformed.
    """
    missing = [name for name in ("keys", "values", "token_ids") if name not in tensors]
    if missing or "encoded_at" not in metadata:
        raise KVFormatError(f"{source} lacks {missing or ['encoded_at']}; it was not written by the KV store")
    try:
        return FactKV(tensors["keys"], tensors["values"], tensors["token_ids"].cpu(), int(metadata["encoded_at"]))
    except ValueError as exc:
        raise KVFormatError(f"{source} holds malformed K/V: {exc}") from exc
