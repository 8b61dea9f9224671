"""The model dtype for ``EngineConfig.dtype="auto"``: the faster of bfloat16 and float32 on the hardware at hand.

bfloat16 halves the bytes of weights and K/V, but it is fast only where the hardware computes in it natively:
CUDA GPUs from Ampere on, and CPUs with AVX512-BF16 or AMX. Elsewhere torch emulates it and a prefill runs 4–6×
slower than in float32. A CPU's flags are not enough either: a VM can report ``avx512_bf16`` while torch's
matmul still runs bfloat16 5× slower than float32 (measured on a 2-core AMD EPYC VM: a 20×576 by 576×1536 linear
took 2.51 ms in bfloat16 and 0.47 ms in float32). So on CPU, where the flags allow bfloat16 it is timed against
float32 on a small linear layer once per process, and the faster one wins.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
"""``/proc/cpuinfo`` flags of CPUs that compute in bfloat16 natively."""

PROBE_SHAPE = (32, 576, 1536)
"""The timed linear layer: ``[tokens, hidden] @ [hidden, intermediate]`` (SmolLM2-135M's MLP, a 32-token prefill)."""

PROBE_REPEATS = 5
"""Timed runs per dtype (after one warm-up run); the fastest counts."""


@dataclass(frozen=True, slots=True)
class DtypeChoice:
    """Which dtype ``"auto"`` chose, and why.

    Attributes:
        dtype: ``"bfloat16"``, ``"float16"`` or ``"float32"``.
        reason: one line for the log and the benchmarks' reports.
    """

    dtype: str
    reason: str


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str] | None:
    """The CPU's feature flags from ``cpuinfo`` (Linux), or ``None`` where that file cannot be read."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return None


def _fastest_run_ms(dtype: torch.dtype) -> float:
    """The fastest of :data:`PROBE_REPEATS` runs of the probe linear in ``dtype`` on CPU (ms)."""
    tokens, hidden, out = PROBE_SHAPE
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, hidden, generator=generator).to(dtype)
    w = torch.randn(out, hidden, generator=generator).to(dtype)
    best = float("inf")
    with torch.inference_mode():
        torch.nn.functional.linear(x, w)  # warm-up: kernel selection, first-touch allocation
        for _ in range(PROBE_REPEATS):
            start = time.perf_counter()
            torch.nn.functional.linear(x, w)
            best = min(best, (time.perf_counter() - start) * 1000)
    return best


@functools.cache
def _cpu_choice() -> DtypeChoice:
    flags = cpu_flags()
    if flags is not None and not flags.intersection(CPU_BF16_FLAGS):
        return DtypeChoice("float32", "CPU without native bfloat16 (no avx512_bf16 or amx_bf16 flag)")
    bf16_ms, fp32_ms = _fastest_run_ms(torch.bfloat16), _fastest_run_ms(torch.float32)
    timing = f"probe linear {PROBE_SHAPE}: bfloat16 {bf16_ms:.3f} ms, float32 {fp32_ms:.3f} ms"
    if bf16_ms < fp32_ms:
        return DtypeChoice("bfloat16", f"CPU with native bfloat16, faster than float32 ({timing})")
    return DtypeChoice("float32", f"bfloat16 is not faster than float32 on this CPU ({timing})")


def choose_dtype(dtype: str, device: torch.device) -> DtypeChoice:
    """The dtype to load a model in: ``dtype`` itself unless it is ``"auto"``.

    ``"auto"`` picks bfloat16 on a CUDA device that supports it (else float16), and on CPU bfloat16 only where the
    CPU has native bfloat16 and a timed probe (:data:`PROBE_SHAPE`, once per process, a few ms) finds it faster
    than float32; float32 otherwise. The choice is logged at INFO. The model fingerprint records the dtype the
    weights were loaded in, so K/V encoded under one choice are never served under the other.

    Args:
        dtype: ``"auto"``, ``"bfloat16"``, ``"float16"`` or ``"float32"``.
        device: where the model runs.
    """
    if dtype != "auto":
        return DtypeChoice(dtype, "configured")
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            choice = DtypeChoice("bfloat16", f"CUDA device {torch.cuda.get_device_name(device)} supports bfloat16")
        else:
            choice = DtypeChoice("float16", f"CUDA device {torch.cuda.get_device_name(device)} lacks bfloat16")
    elif device.type == "cpu":
        choice = _cpu_choice()
    else:
        choice = DtypeChoice("float32", f"no dtype probe for device type {device.type!r}")
    log.info("dtype auto: %s (%s)", choice.dtype, choice.reason)
    return choice


def cpu_isa() -> str:
    """The vector instruction set torch's CPU kernels use here (e.g. ``"AVX512"``, ``"AVX2"``), for reports."""
    return str(torch.backends.cpu.get_cpu_capability())


def loaded_dtype(model: torch.nn.Module) -> str:
    """The dtype ``model``'s weights were loaded in, by name (``"bfloat16"``, ``"float32"``...): what ``"auto"``
    became, for an engine that must load the same weights again in the same dtype (vLLM's ``--dtype``)."""
    return str(next(model.parameters()).dtype).removeprefix("torch.")
