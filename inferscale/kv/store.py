"""KV store: fact K/V keyed by (memory id, text hash, model fingerprint, encoding parameters).

Two tiers here: host memory (an LRU under a byte budget) in front of disk (one safetensors file per entry, which
survives restarts). Each disk file records the key it was written under; a file whose recorded fingerprint
differs from the requested one is refused with :class:`KVFingerprintMismatchError`, never injected.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from inferscale.errors import KVFingerprintMismatchError
from inferscale.kv.fact import FactKV


@dataclass(frozen=True, slots=True)
class KVKey:
    """Identity of one stored entry.

    Attributes:
        memory_id: the memory's public id.
        text_hash: sha256 hex of the memory's text (a changed text is a different entry).
        fingerprint: :func:`inferscale.kv.fingerprint.model_fingerprint` of the encoding model.
        encoding_key: the encoding parameters (context window, prefix), as a short string.
    """

    memory_id: str
    text_hash: str
    fingerprint: str
    encoding_key: str

    def digest(self) -> str:
        """32 hex characters naming this entry on disk."""
        raw = "\x1f".join((self.memory_id, self.text_hash, self.fingerprint, self.encoding_key))
        return hashlib.sha256(raw.encode()).hexdigest()[:32]


class KVStore:
    """Host-memory LRU over a disk tier of safetensors files.

    Args:
        directory: disk tier root; ``None`` keeps entries in host memory only.
        host_budget_bytes: the host tier's capacity in bytes; least recently used entries are dropped first
            (they stay on disk).
        device: where :meth:`get` returns tensors (the engine's device).
    """

    def __init__(
        self,
        directory: Path | None,
        host_budget_bytes: int = 2 << 30,
        device: torch.device | str = "cpu",
    ) -> None:
        self._dir = directory
        self._budget = host_budget_bytes
        self._device = torch.device(device)
        self._host: OrderedDict[KVKey, FactKV] = OrderedDict()
        self._host_bytes = 0
        self._lock = threading.Lock()

    def _path(self, key: KVKey) -> Path:
        assert self._dir is not None
        return self._dir / key.memory_id / f"{key.digest()}.safetensors"

    def location(self, key: KVKey) -> str:
        """Where :meth:`put` writes ``key``: a file path, or ``"host"`` without a disk tier."""
        return str(self._path(key)) if self._dir is not None else "host"

    def put(self, key: KVKey, fact: FactKV) -> str:
        """Store ``fact`` under ``key`` in both tiers; returns :meth:`location`."""
        if self._dir is not None:
            path = self._path(key)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            save_file(
                {
                    "keys": fact.keys.detach().cpu().contiguous(),
                    "values": fact.values.detach().cpu().contiguous(),
                    "token_ids": fact.token_ids.cpu().contiguous(),
                },
                str(tmp),
                metadata={
                    "memory_id": key.memory_id,
                    "text_hash": key.text_hash,
                    "fingerprint": key.fingerprint,
                    "encoding_key": key.encoding_key,
                    "encoded_at": str(fact.encoded_at),
                },
            )
            os.replace(tmp, path)
        self._remember(key, fact.to(self._device))
        return self.location(key)

    def get(self, key: KVKey) -> FactKV | None:
        """The entry for ``key`` on the store's device, or ``None`` on a miss.

        Raises:
            KVFingerprintMismatchError: when the file found for ``key`` records another fingerprint or text hash.
        """
        with self._lock:
            fact = self._host.get(key)
            if fact is not None:
                self._host.move_to_end(key)
                return fact
        if self._dir is None:
            return None
        path = self._path(key)
        if not path.exists():
            return None
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            meta = handle.metadata() or {}
        for field in ("fingerprint", "text_hash", "encoding_key", "memory_id"):
            if meta.get(field) != getattr(key, field):
                raise KVFingerprintMismatchError(
                    f"KV file {path} was written for {field}={meta.get(field)!r}, requested "
                    f"{getattr(key, field)!r}; refusing to inject it"
                )
        tensors = load_file(str(path), device=str(self._device))
        fact = FactKV(tensors["keys"], tensors["values"], tensors["token_ids"].cpu(), int(meta["encoded_at"]))
        self._remember(key, fact)
        return fact

    def _remember(self, key: KVKey, fact: FactKV) -> None:
        with self._lock:
            old = self._host.pop(key, None)
            if old is not None:
                self._host_bytes -= old.nbytes
            self._host[key] = fact
            self._host_bytes += fact.nbytes
            while self._host_bytes > self._budget and len(self._host) > 1:
                _, evicted = self._host.popitem(last=False)
                self._host_bytes -= evicted.nbytes

    def delete_memory(self, memory_id: str) -> int:
        """Remove every entry of ``memory_id`` from both tiers; returns how many host entries were dropped."""
        with self._lock:
            doomed = [k for k in self._host if k.memory_id == memory_id]
            for k in doomed:
                self._host_bytes -= self._host.pop(k).nbytes
        if self._dir is not None:
            shutil.rmtree(self._dir / memory_id, ignore_errors=True)
        return len(doomed)

    def clear(self) -> None:
        """Drop every entry from both tiers."""
        with self._lock:
            self._host.clear()
            self._host_bytes = 0
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    @property
    def host_bytes(self) -> int:
        """Bytes held in the host tier (bytes)."""
        return self._host_bytes
