"""The model dtype for ``EngineConfig.dtype="auto"``: the faster of bfloat16 and float32 on the hardware at hand.

bfloat16 halves the bytes of weights and K/V, but it is fast only where the hardware computes in it natively:
CUDA GPUs from Ampere on, and CPUs with AVX512-BF16 or AMX. Elsewhere torch emulates it and a prefill runs 4–6×
slower than in float32. A CPU's flags are not enough either: on this project's 2-core AMD EPYC VM, which reports
``avx512_bf16``, a 20×576 by 576×1536 linear took 2.51 ms in bfloat16 against 0.47 ms in float32 in one session,
while SmolLM2's first MLP ran 1.1 ms against 2.0 ms in another. So on CPU, where the flags allow bfloat16, the
loaded model's own first MLP is timed in both dtypes and the faster one wins (:func:`probe_cpu_dtype`).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)

CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
"""``/proc/cpuinfo`` flags of CPUs that compute in bfloat16 natively."""

BF16_MARGIN = 1.15
"""How much faster bfloat16 must run than float32 to be chosen (a ratio of fastest runs): timings on a shared VM are
noisy, and a dtype that flips between runs strands the stored K/V."""

PROBE_TOKENS = 32
"""Tokens in the probe's input (a short prefill)."""

PROBE_ROUNDS = 7
"""Timed rounds (one run per dtype each, interleaved so load on a shared machine hits both alike) after a warm-up;
each dtype's fastest run counts (the least disturbed: on a loaded 2-core VM medians swung 10× between trials while
the fastest runs held within 10%)."""


@dataclass(frozen=True, slots=True)
class DtypeChoice:
    """Which dtype to run a model in, and why.

    Attributes:
        dtype: ``"bfloat16"``, ``"float16"`` or ``"float32"``.
        reason: one line for the log and the benchmarks' reports.
        probe: the dtype is provisional: load the weights in :attr:`dtype`, then settle it with
            :func:`probe_cpu_dtype` on the loaded model.
    """

    dtype: str
    reason: str
    probe: bool = False


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The CPU's model name from ``cpuinfo`` (Linux), or ``None``."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), None)


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


def choose_dtype(dtype: str, device: torch.device, checkpoint_dtype: str | None = None) -> DtypeChoice:
    """The dtype to load a model in: ``dtype`` itself unless it is ``"auto"``.

    ``"auto"`` picks bfloat16 on a CUDA device that supports it (else float16), and float32 on a CPU without a
    native bfloat16 flag. On a CPU that has one (or whose flags cannot be read) the choice is provisional
    (:attr:`DtypeChoice.probe`): the weights load in float32 when the checkpoint is stored in float32 or float16,
    else in bfloat16, so that :func:`probe_cpu_dtype` can then keep them or cast them without changing a weight
    beyond what loading in the final dtype would.

    Args:
        dtype: ``"auto"``, ``"bfloat16"``, ``"float16"`` or ``"float32"``.
        device: where the model runs.
        checkpoint_dtype: the dtype the checkpoint stores its weights in (its config's ``dtype``), if known.

    Returns:
        The choice; provisional (``probe``) only for ``"auto"`` on a CPU that may run bfloat16 natively.
    """
    if dtype != "auto":
        return DtypeChoice(dtype, "configured")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        if torch.cuda.get_device_capability(device) >= (8, 0):  # Ampere on: bfloat16 tensor cores
            return DtypeChoice("bfloat16", f"CUDA device {name} supports bfloat16")
        return DtypeChoice("float16", f"CUDA device {name} lacks bfloat16")
    if device.type != "cpu":
        return DtypeChoice("float32", f"no dtype probe for device type {device.type!r}")
    flags = cpu_flags()
    if flags is not None and not flags.intersection(CPU_BF16_FLAGS):
        return DtypeChoice("float32", "CPU without native bfloat16 (no avx512_bf16 or amx_bf16 flag)")
    load_as = "float32" if checkpoint_dtype in ("float32", "float16") else "bfloat16"
    return DtypeChoice(load_as, "CPU with native bfloat16: to be timed against float32", probe=True)


def _probe_module(model: nn.Module) -> nn.Module | None:
    """The first decoder layer's MLP (most of a prefill's FLOPs), or ``None`` for a model without one."""
    layers = getattr(getattr(model, "model", model), "layers", None)
    mlp = getattr(layers[0], "mlp", None) if layers is not None and len(layers) else None
    return mlp if isinstance(mlp, nn.Module) else None


def _probe_key(mlp: nn.Module) -> str:
    """What a probe's result depends on: the CPU, torch, and the MLP's weight shapes."""
    shapes = ",".join("x".join(map(str, p.shape)) for p in mlp.parameters())
    return f"{cpu_model() or 'unknown CPU'}|torch {torch.__version__}|{type(mlp).__name__}({shapes})"


def probe_cpu_dtype(model: nn.Module, record: Path | None = None) -> DtypeChoice:
    """Time the model's own first MLP in bfloat16 and float32 on a :data:`PROBE_TOKENS`-token input
    (:data:`PROBE_ROUNDS` interleaved rounds, fastest runs compared) and return bfloat16 only when it wins by
    :data:`BF16_MARGIN` or more, else float32. A CPU's flags alone are not enough: a VM can report ``avx512_bf16``
    while torch runs bfloat16 slower. Copies of the MLP are timed, the model is not changed. A model without a
    ``layers[0].mlp`` keeps bfloat16 (the flags said native).

    The dtype is part of the model fingerprint, so a choice that flipped between runs would make every stored K/V
    a miss. With ``record``, the first probe's choice is written there (JSON, keyed by CPU model, torch version
    and the MLP's shapes) and later calls with the same key reuse it without timing.

    Returns:
        The choice (never provisional).
    """
    mlp = _probe_module(model)
    if mlp is None:
        return DtypeChoice("bfloat16", "CPU with native bfloat16; no MLP to time in this model")
    key = _probe_key(mlp)
    recorded = _read_record(record).get(key) if record is not None else None
    if isinstance(recorded, dict) and recorded.get("dtype") in ("bfloat16", "float32"):
        return DtypeChoice(str(recorded["dtype"]), f"recorded in {record}: {recorded.get('reason', '')}")
    choice = _timed_choice(mlp)
    if record is not None:
        _write_record(record, key, choice)
    return choice


def _read_record(record: Path) -> dict[str, Any]:
    try:
        data = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_record(record: Path, key: str, choice: DtypeChoice) -> None:
    """Add ``choice`` under ``key`` to ``record`` (atomically: a temporary file renamed over it); a record that
    cannot be written is logged and skipped (the next load times again)."""
    data = _read_record(record) | {key: {"dtype": choice.dtype, "reason": choice.reason}}
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        tmp = record.with_name(f".{record.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
        os.replace(tmp, record)
    except OSError as exc:
        log.warning("cannot record the dtype choice in %s (%s)", record, exc)


def _timed_choice(mlp: nn.Module) -> DtypeChoice:
    """The faster dtype of ``mlp`` by timing (see :func:`probe_cpu_dtype`)."""
    hidden = next(p for p in mlp.parameters() if p.dim() == 2).shape[1]
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1, PROBE_TOKENS, hidden, generator=generator)
    copies = {dtype: copy.deepcopy(mlp).to(dtype) for dtype in (torch.bfloat16, torch.float32)}
    inputs = {dtype: x.to(dtype) for dtype in copies}
    times: dict[torch.dtype, list[float]] = {dtype: [] for dtype in copies}
    with torch.inference_mode():
        for dtype, module in copies.items():  # warm-up: kernel selection, first-touch allocation
            module(inputs[dtype])
        for _ in range(PROBE_ROUNDS):
            for dtype, module in copies.items():
                start = time.perf_counter()
                module(inputs[dtype])
                times[dtype].append((time.perf_counter() - start) * 1000)
    bf16_ms, fp32_ms = min(times[torch.bfloat16]), min(times[torch.float32])
    best = f"bfloat16 {bf16_ms:.2f} ms, float32 {fp32_ms:.2f} ms"
    timing = f"first MLP on {PROBE_TOKENS} tokens, best of {PROBE_ROUNDS}: {best}"
    if bf16_ms * BF16_MARGIN <= fp32_ms:
        return DtypeChoice("bfloat16", f"CPU with native bfloat16, faster than float32 ({timing})")
    return DtypeChoice("float32", f"bfloat16 is not {BF16_MARGIN}x faster than float32 on this CPU ({timing})")


def cpu_isa() -> str:
    """The vector instruction set torch's CPU kernels use here (e.g. ``"AVX512"``, ``"AVX2"``), for reports."""
    return str(torch.backends.cpu.get_cpu_capability())


def loaded_dtype(model: torch.nn.Module) -> str:
    """The dtype ``model``'s weights were loaded in, by name (``"bfloat16"``, ``"float32"``...): what ``"auto"``
    became, for an engine that must load the same weights again in the same dtype (vLLM's ``--dtype``)."""
    return str(next(model.parameters()).dtype).removeprefix("torch.")
