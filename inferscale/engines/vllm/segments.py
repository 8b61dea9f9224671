"""Reading segment files (pre-RoPE K/V in the KV store's safetensors layout) on the engine side, with caches.

The scheduler side needs only a file's header and token ids (:func:`read_header`); workers need the tensors
(:class:`SegmentCache`, an LRU under a byte budget keyed by the segment's uid and the file's size and mtime, so a
rewritten file is read again).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch
from safetensors import safe_open

from inferscale.engines.vllm.metadata import SegmentRef
from inferscale.errors import InferScaleError
from inferscale.kv.tiers.serialization import KVChecksumError, KVFormatError, fact_from_payload


class SegmentError(InferScaleError):
    """A segment file is missing or not in the KV store's layout."""


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    """What the scheduler checks before claiming a segment.

    Attributes:
        fingerprint: the model fingerprint in the file's header.
        token_ids: the tokens the K/V stand for (a tuple of ints).
    """

    fingerprint: str
    token_ids: tuple[int, ...]

    @property
    def n_tokens(self) -> int:
        """Tokens in the segment."""
        return len(self.token_ids)


def _stamp(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise SegmentError(f"segment file {path!r} cannot be read: {exc}") from exc
    return st.st_size, st.st_mtime_ns


def read_header(path: str) -> SegmentHeader:
    """The fingerprint and token ids of a segment file (reads only those, not the K/V).

    Raises:
        SegmentError: when the file is missing or lacks ``token_ids``/``keys``/``values`` or a fingerprint.
    """
    _stamp(path)
    try:
        with safe_open(path, framework="pt") as handle:
            meta = handle.metadata() or {}
            names = set(handle.keys())
            if not {"keys", "values", "token_ids"} <= names or "fingerprint" not in meta:
                raise SegmentError(f"{path!r} is not a KV store entry (needs keys, values, token_ids, fingerprint)")
            token_ids = handle.get_tensor("token_ids")
    except (OSError, RuntimeError, ValueError) as exc:  # safetensors reports a bad file as one of these
        raise SegmentError(f"segment file {path!r} is unreadable: {exc}") from exc
    return SegmentHeader(meta["fingerprint"], tuple(int(t) for t in token_ids.tolist()))


class HeaderCache:
    """Headers by ``(path, size, mtime)``; bounded by entry count (headers are small)."""

    def __init__(self, max_entries: int = 4096) -> None:
        self._max = max_entries
        self._entries: OrderedDict[tuple[str, int, int], SegmentHeader] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: str) -> SegmentHeader:
        """The header of ``path`` (read on a miss). Raises :class:`SegmentError` as :func:`read_header`."""
        key = (path, *_stamp(path))
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
                return hit
        header = read_header(path)
        with self._lock:
            self._entries[key] = header
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)
        return header


class SegmentCache:
    """Pre-RoPE K/V of segments on the workers' device, LRU under a byte budget.

    Args:
        device: where tensors are kept (the KV cache's device).
        budget_bytes: capacity (bytes); the least recently used entries are dropped first.
    """

    def __init__(self, device: torch.device, budget_bytes: int = 1 << 30) -> None:
        self._device = device
        self._budget = budget_bytes
        self._entries: OrderedDict[tuple[str, int, int], tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self._bytes = 0

    def get(self, ref: SegmentRef) -> tuple[torch.Tensor, torch.Tensor]:
        """``(keys, values)``, each ``[n_layers, n_kv_heads, n_tokens, head_dim]`` in the file's dtype; a KV store
        entry held in 8 bits is moved onto this cache's device as codes and scales and dequantised there, to the
        dtype it was quantised from. The file is read and its checksum checked on the CPU first.

        Raises:
            SegmentError: when the file is missing or malformed (an unknown storage format included), or its
                header or tensors do not match their checksums.
        """
        key = (ref.uid, *_stamp(ref.path))
        hit = self._entries.get(key)
        if hit is not None:
            self._entries.move_to_end(key)
            return hit
        try:  # read and checked on the CPU (the checksum hashes host bytes), then moved and dequantised on device
            with safe_open(ref.path, framework="pt", device="cpu") as handle:
                tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
                fact = fact_from_payload(tensors, handle.metadata() or {}, ref.path).to(self._device).dequantized()
        except KVChecksumError as exc:
            raise SegmentError(f"segment file {ref.path!r} was changed after it was written: {exc}") from exc
        except KVFormatError as exc:
            raise SegmentError(f"segment file {ref.path!r} is not in a layout this version reads: {exc}") from exc
        except (OSError, RuntimeError, ValueError) as exc:
            raise SegmentError(f"segment file {ref.path!r} is unreadable: {exc}") from exc
        entry = (fact.keys, fact.values)
        if entry[0].shape != entry[1].shape or entry[0].dim() != 4:
            raise SegmentError(f"{ref.path!r}: keys {tuple(entry[0].shape)} and values {tuple(entry[1].shape)} differ")
        size = 2 * entry[0].numel() * entry[0].element_size()
        self._entries[key] = entry
        self._bytes += size
        while self._bytes > self._budget and len(self._entries) > 1:
            _, (k, _v) = self._entries.popitem(last=False)
            self._bytes -= 2 * k.numel() * k.element_size()
        return entry
