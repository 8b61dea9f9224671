"""The torch CPU thread count for ``EngineConfig.num_threads="auto"``: the CPUs this process may really use.

torch's default intra-op thread count is the host's physical core count. In a container or under a CPU quota
that is more threads than the process may run at once: on a 64-core host with a 2-CPU quota, torch starts 32
threads that take turns on 2 CPUs, and a prefill runs several times slower than with 2. ``"auto"`` takes the
smallest of torch's default, the CPUs in the process's affinity mask (``sched_getaffinity``), and the cgroup CPU
quota rounded up (``cpu.max`` in cgroup v2, ``cpu.cfs_quota_us / cpu.cfs_period_us`` in v1).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

CGROUP_ROOT = Path("/sys/fs/cgroup")
"""Where Linux mounts the cgroup filesystem."""


@dataclass(frozen=True, slots=True)
class ThreadChoice:
    """How many torch CPU threads to run, and why.

    Attributes:
        threads: the intra-op thread count (≥ 1).
        reason: one line for the log and the benchmarks' reports.
    """

    threads: int
    reason: str


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None


def cgroup_cpu_quota(root: Path = CGROUP_ROOT) -> float | None:
    """The cgroup CPU quota of this process's cgroup in CPUs (e.g. ``2.0``, ``1.5``), or ``None`` where no quota is
    set or none can be read. Reads cgroup v2's ``<root>/cpu.max`` (``"<quota> <period>"`` in µs, or ``"max"``),
    else cgroup v1's ``<root>/cpu/cpu.cfs_quota_us`` and ``cpu.cfs_period_us`` (quota ``-1``: none)."""
    cpu_max = _read(root / "cpu.max")
    if cpu_max is not None:
        fields = cpu_max.split()
        if len(fields) == 2 and fields[0] != "max":
            return _ratio(fields[0], fields[1])
        return None
    quota, period = _read(root / "cpu" / "cpu.cfs_quota_us"), _read(root / "cpu" / "cpu.cfs_period_us")
    if quota is None or period is None:
        return None
    return _ratio(quota, period)


def _ratio(quota: str, period: str) -> float | None:
    """``quota / period`` for positive integer strings, else ``None`` (no quota, or an unreadable one)."""
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def affinity_cpus() -> int | None:
    """CPUs in this process's affinity mask, or ``None`` on platforms without ``sched_getaffinity``."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    return len(getaffinity(0)) if getaffinity is not None else None


def choose_threads(
    configured: int | str | None,
    *,
    torch_default: int | None = None,
    affinity: int | None = None,
    quota: float | None = None,
) -> ThreadChoice | None:
    """The torch CPU thread count for ``EngineConfig.num_threads``.

    Args:
        configured: an int (used as is), ``"auto"`` (the smallest of the three limits below), or ``None`` (keep
            torch's default: returns ``None``).
        torch_default: torch's own default; ``None`` reads :func:`torch.get_num_threads`.
        affinity: CPUs in the affinity mask; ``None`` reads :func:`affinity_cpus`.
        quota: the cgroup CPU quota in CPUs; ``None`` reads :func:`cgroup_cpu_quota`.

    Returns:
        The choice, or ``None`` for ``configured=None``.
    """
    if configured is None:
        return None
    if not isinstance(configured, str):
        return ThreadChoice(int(configured), "configured")
    limits = {"torch's default": torch_default if torch_default is not None else torch.get_num_threads()}
    cpus = affinity if affinity is not None else affinity_cpus()
    if cpus is not None:
        limits["CPUs in the affinity mask"] = cpus
    cpu_quota = quota if quota is not None else cgroup_cpu_quota()
    if cpu_quota is not None:
        limits[f"cgroup CPU quota {cpu_quota:g}"] = math.ceil(cpu_quota)
    name, threads = min(limits.items(), key=lambda item: item[1])
    seen = ", ".join(f"{key}: {value}" for key, value in limits.items())
    return ThreadChoice(max(1, threads), f"{name} is the tightest limit ({seen})")
