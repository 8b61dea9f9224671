"""Host tier: fact K/V in CPU memory (page-locked when CUDA is present, so copies to the GPU run async)."""

from __future__ import annotations

import torch

from inferscale.errors import ConfigError
from inferscale.kv.fact import FactKV
from inferscale.kv.tiers.memory import MemoryTier


def owned(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when it is contiguous and spans its whole storage, else a compact copy.

    A stored view would keep a larger buffer alive (a whole encoded batch, say) while the budget counts only
    the view's bytes.
    """
    if t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t
    return t.contiguous().clone()


class HostTier(MemoryTier):
    """Host-memory LRU tier under a byte budget.

    Args:
        budget_bytes: capacity (bytes, >= 0).
        pin_memory: keep tensors in page-locked memory; ``None`` means "when ``torch.cuda.is_available()``".

    Raises:
        ConfigError: when ``pin_memory=True`` but CUDA is not available (pinned memory needs a CUDA driver).
        InvalidInputError: when ``budget_bytes`` is negative.
    """

    def __init__(self, budget_bytes: int, pin_memory: bool | None = None) -> None:
        super().__init__("host", budget_bytes)
        cuda = torch.cuda.is_available()
        if pin_memory and not cuda:
            raise ConfigError("pin_memory=True needs CUDA, and torch.cuda.is_available() is False; pass None or False")
        self._pin = cuda if pin_memory is None else pin_memory

    @property
    def pinned(self) -> bool:
        """Whether entries are kept in page-locked memory."""
        return self._pin

    def _place(self, fact: FactKV) -> FactKV:
        return fact.map_tensors(self._to_host)

    def _to_host(self, t: torch.Tensor) -> torch.Tensor:
        if not self._pin:
            return owned(t.to("cpu")) if t.device.type != "cpu" else owned(t)
        if t.device.type == "cpu" and t.is_pinned():
            return owned(t)
        out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        out.copy_(t)  # synchronous: the source may be a GPU tensor about to be freed
        return out
