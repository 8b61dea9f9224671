"""Device tier: fact K/V resident on a CUDA device, ready for assembly without a copy."""

from __future__ import annotations

import torch

from inferscale.errors import ConfigError
from inferscale.kv.fact import FactKV
from inferscale.kv.tiers.host import owned
from inferscale.kv.tiers.memory import MemoryTier


class DeviceTier(MemoryTier):
    """GPU-memory LRU tier under a byte budget.

    Copies from pinned host memory are issued ``non_blocking`` on the current stream, so they are ordered
    before any kernel that later reads the entry on that stream.

    Args:
        device: a CUDA device, e.g. ``"cuda"`` or ``"cuda:1"``.
        budget_bytes: capacity (bytes, >= 0) of K/V held on the device.

    Raises:
        ConfigError: when ``device`` is not a CUDA device or CUDA is not available (a CPU-only build or machine
            has no device tier: build the store without ``device_budget_bytes``).
        InvalidInputError: when ``budget_bytes`` is negative.
    """

    def __init__(self, device: torch.device | str, budget_bytes: int) -> None:
        dev = torch.device(device)
        if dev.type != "cuda":
            raise ConfigError(f"the device tier holds CUDA tensors; got device {str(dev)!r}")
        if not torch.cuda.is_available():
            raise ConfigError(
                f"the device tier needs CUDA but torch.cuda.is_available() is False (torch {torch.__version__}); "
                "build the store without a device tier (device_budget_bytes=0)"
            )
        super().__init__("device", budget_bytes)
        self._device = dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())

    @property
    def device(self) -> torch.device:
        """The CUDA device entries live on (with its index)."""
        return self._device

    def _place(self, fact: FactKV) -> FactKV:
        return fact.map_tensors(lambda t: owned(t.to(self._device, non_blocking=True)))
