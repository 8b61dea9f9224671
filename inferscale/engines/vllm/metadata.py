"""What travels from a request to the connector, and from the connector's scheduler side to its workers.

Wire format (a request's ``kv_transfer_params``; JSON, so the OpenAI server can carry it)::

    {"inferscale": {
        "version": 1,
        "fingerprint": "<32 hex>",              # model fingerprint the K/V were encoded under
        "segments": [                            # consecutive from prompt position 0: system prefix, fact 1, ...
            {"path": "/.../prefix.safetensors", "uid": "<id of this K/V: memory id + version, or a staging id>"},
            ...
        ],
        "memory_start": P,                       # where the memory segment begins (the prefix's length)
        "recompute_tail": n                      # optional, default 0: the memory's last n tokens are left to vLLM
    }}

Each segment file holds pre-RoPE ``keys``/``values`` ``[n_layers, n_kv_heads, n_tokens, head_dim]`` and
``token_ids [n_tokens]`` (the layout of :mod:`inferscale.kv.store`), with ``fingerprint`` in its header.

``recompute_tail`` is the ``tail:n`` recompute policy (:mod:`inferscale.kv.recompute`): the connector injects only
positions ``0 .. max(P, end - n) - 1`` (``end`` where the segments end) and vLLM prefills the memory segment's last
``n`` tokens itself, each attending to the injected K/V before it, then the query.

The request must also carry a ``cache_salt`` made by :func:`cache_salt`: vLLM hashes it into every block of the
request, and the connector checks that its content part matches the segments, so blocks that hold injected K/V
are only ever reused by a request of the same tenant with the same memories, layout and model.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from inferscale.errors import InvalidInputError

PARAMS_KEY = "inferscale"
"""The key of our entry in ``kv_transfer_params``."""

WIRE_VERSION = 1
SALT_PREFIX = "is1"
PROMPT_SALT_PREFIX = "isp"
"""The first field of a memory request's ``cache_salt`` (:func:`cache_salt`) and of a prompt-mode one
(:func:`prompt_cache_salt`); the vLLM server refuses client requests whose salt starts with either."""


@dataclass(frozen=True, slots=True)
class SegmentRef:
    """One run of consecutive prompt tokens whose pre-RoPE K/V lie in a file.

    Attributes:
        path: a safetensors file readable by the engine's workers.
        uid: what identifies this K/V (the store's entry digest: memory id, text hash, fingerprint, encoding; or a
            staging id); it names the segment in the cache salt and keys the workers' tensor cache.
    """

    path: str
    uid: str


@dataclass(frozen=True, slots=True)
class MemoryPayload:
    """A request's memory: which K/V fill prompt positions ``0 .. end - 1`` (see the module docstring).

    Attributes:
        fingerprint: the model fingerprint the segments were encoded under (32 hex characters).
        segments: consecutive segments from position 0 (the system prefix first).
        memory_start: P, the first position of the memory segment (tokens).
        recompute_tail: n >= 0, the memory segment's last tokens that vLLM prefills instead of the connector
            injecting them (``tail:n``; 0 is pure injection). More than the segment holds means all of it.
    """

    fingerprint: str
    segments: tuple[SegmentRef, ...]
    memory_start: int
    recompute_tail: int = 0

    def to_params(self) -> dict[str, Any]:
        """The ``kv_transfer_params`` dict carrying this payload (JSON-serialisable)."""
        return {
            PARAMS_KEY: {
                "version": WIRE_VERSION,
                "fingerprint": self.fingerprint,
                "segments": [{"path": s.path, "uid": s.uid} for s in self.segments],
                "memory_start": self.memory_start,
                "recompute_tail": self.recompute_tail,
            }
        }

    @classmethod
    def from_params(cls, params: Mapping[str, Any] | None) -> MemoryPayload | None:
        """The payload in ``kv_transfer_params``, or ``None`` when the request carries none.

        Raises:
            InvalidInputError: when our entry is present but malformed (wrong version, missing or mistyped field).
        """
        if not params or PARAMS_KEY not in params:
            return None
        raw = params[PARAMS_KEY]
        if not isinstance(raw, Mapping) or raw.get("version") != WIRE_VERSION:
            raise InvalidInputError(f"kv_transfer_params[{PARAMS_KEY!r}] must be a dict with version={WIRE_VERSION}")
        segments = raw.get("segments")
        fingerprint = raw.get("fingerprint")
        start = raw.get("memory_start")
        if not isinstance(segments, list) or not segments:
            raise InvalidInputError("kv_transfer_params: 'segments' must be a non-empty list of {path, uid}")
        if not isinstance(fingerprint, str) or not isinstance(start, int) or isinstance(start, bool) or start < 0:
            raise InvalidInputError("kv_transfer_params: 'fingerprint' must be a str and 'memory_start' an int >= 0")
        tail = raw.get("recompute_tail", 0)
        if not isinstance(tail, int) or isinstance(tail, bool) or tail < 0:
            raise InvalidInputError(f"kv_transfer_params: 'recompute_tail' must be an int >= 0, got {tail!r}")
        refs = []
        for i, seg in enumerate(segments):
            if (
                not isinstance(seg, Mapping)
                or not isinstance(seg.get("path"), str)
                or not isinstance(seg.get("uid"), str)
            ):
                raise InvalidInputError(f"kv_transfer_params: segment {i} must be {{'path': str, 'uid': str}}")
            refs.append(SegmentRef(seg["path"], seg["uid"]))
        return cls(fingerprint, tuple(refs), start, tail)

    def injected_end(self, end: int) -> int:
        """One past the last position the connector injects: ``max(memory_start, end - recompute_tail)``, where
        ``end`` is one past the segments' last position (P + S); vLLM prefills positions from there on."""
        return max(self.memory_start, end - self.recompute_tail)

    def content_digest(self, lengths: Sequence[int]) -> str:
        """32 hex characters naming the served content: fingerprint, segment uids in order, their lengths
        (tokens), where the memory starts and the recomputed tail (its blocks hold vLLM's own K/V, not injected
        ones, so requests that differ only in ``recompute_tail`` never share a block). ``lengths`` are the
        segments' token counts."""
        h = hashlib.sha256(f"{self.fingerprint}|{self.memory_start}|tail={self.recompute_tail}".encode())
        for seg, n in zip(self.segments, lengths, strict=True):
            h.update(f"|{seg.uid}:{n}".encode())
        return h.hexdigest()[:32]


def cache_salt(scope_key: str, content_digest: str) -> str:
    """The ``cache_salt`` of a memory request: ``"is1.<scope hash>.<content digest>"`` (81 characters).

    Args:
        scope_key: the tenant (:meth:`inferscale.scope.Scope.key`, or any string naming who may share blocks).
        content_digest: :meth:`MemoryPayload.content_digest` of the request's payload.
    """
    scope_hash = hashlib.sha256(scope_key.encode()).hexdigest()[:16]
    return f"{SALT_PREFIX}.{scope_hash}.{content_digest}"


def prompt_cache_salt(scope_key: str) -> str:
    """The ``cache_salt`` of a request without injected memory (prompt mode): ``"isp.<scope hash>"``.

    vLLM hashes the salt into every block, so one tenant's prompt-mode requests share prefix-cache blocks with each
    other but never with another tenant's, whose hits would otherwise reveal, by timing, which memory texts that
    tenant holds. The connector never claims such a request (it has no payload).
    """
    return f"{PROMPT_SALT_PREFIX}.{hashlib.sha256(scope_key.encode()).hexdigest()[:16]}"


def salt_content(salt: str | None) -> str | None:
    """The content digest inside a salt made by :func:`cache_salt`, or ``None`` for any other salt."""
    if salt is None:
        return None
    parts = salt.split(".")
    if len(parts) != 3 or parts[0] != SALT_PREFIX:
        return None
    return parts[2]


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """What one worker writes for one request: K/V of positions ``start .. end - 1`` into ``slot_mapping``.

    Built once on the scheduler side (:meth:`make`); the worker only moves tensors.

    Attributes:
        req_id: the vLLM request id.
        segments: the request's segments (from position 0).
        lengths: each segment's token count.
        start: first position to write (the local prefix-cache hit, block aligned).
        end: one past the last position to write (the end of the memory segment, less a recomputed tail:
            :meth:`MemoryPayload.injected_end`).
        slot_mapping: ``[end - start]`` int64, the paged-cache slot of each position
            (``block_ids[pos // block_size] * block_size + pos % block_size``).
    """

    req_id: str
    segments: tuple[SegmentRef, ...]
    lengths: tuple[int, ...]
    start: int
    end: int
    slot_mapping: torch.Tensor

    @classmethod
    def make(
        cls,
        req_id: str,
        segments: tuple[SegmentRef, ...],
        lengths: tuple[int, ...],
        start: int,
        end: int,
        block_ids: Sequence[int],
        block_size: int,
    ) -> LoadSpec:
        """Compute the slot mapping of positions ``start .. end - 1`` (``end <= sum(lengths)``).

        Raises:
            ValueError: when ``end`` lies past the segments or ``block_ids`` do not cover the positions.
        """
        if not start <= end <= sum(lengths):
            raise ValueError(f"request {req_id}: positions {start}..{end - 1} outside the segments (0..{sum(lengths)})")
        positions = torch.arange(start, end, dtype=torch.int64)
        blocks = torch.as_tensor(list(block_ids), dtype=torch.int64)
        needed = (end + block_size - 1) // block_size
        if blocks.numel() < needed:
            raise ValueError(f"request {req_id}: {blocks.numel()} blocks cannot hold positions up to {end - 1}")
        slots = blocks[positions // block_size] * block_size + positions % block_size
        return cls(req_id, segments, lengths, start, end, slots)

    @property
    def n_tokens(self) -> int:
        """Tokens written (``end - start``)."""
        return self.end - self.start


@dataclass
class InferScaleConnectorMetadata(KVConnectorMetadata):
    """One step's loads, handed from the scheduler-side connector to every worker.

    Attributes:
        loads: the requests whose memory K/V must be written before this step's forward pass.
    """

    loads: list[LoadSpec] = field(default_factory=list)
