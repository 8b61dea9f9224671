"""``dtype="auto"``: bfloat16 only where the hardware runs it faster than float32, else float32 (issue #16)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tiny_models import byte_chat_tokenizer, tiny_model

from inferscale.config import EngineConfig, MemoryConfig
from inferscale.engines.hf import dtype as dtype_choice
from inferscale.engines.hf import load_causal_lm

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def fresh_choice() -> Iterator[None]:
    """The CPU choice is cached per process: each test starts and ends without it."""
    dtype_choice._cpu_choice.cache_clear()
    yield
    dtype_choice._cpu_choice.cache_clear()


def fake_cpu(
    monkeypatch: pytest.MonkeyPatch, flags: frozenset[str] | None, bf16_ms: float, fp32_ms: float
) -> list[str]:
    """CPU flags and probe timings as given; returns the list of dtypes the probe timed."""
    timed: list[str] = []

    def run_ms(dtype: torch.dtype) -> float:
        timed.append(str(dtype).removeprefix("torch."))
        return bf16_ms if dtype == torch.bfloat16 else fp32_ms

    monkeypatch.setattr(dtype_choice, "cpu_flags", lambda: flags)
    monkeypatch.setattr(dtype_choice, "_fastest_run_ms", run_ms)
    return timed


def test_auto_is_the_default() -> None:
    assert EngineConfig().dtype == "auto"
    assert MemoryConfig().engine.dtype == "auto"


@pytest.mark.parametrize("configured", ["float32", "bfloat16", "float16"])
def test_a_configured_dtype_is_kept_without_probing(monkeypatch: pytest.MonkeyPatch, configured: str) -> None:
    timed = fake_cpu(monkeypatch, frozenset({"avx512_bf16"}), bf16_ms=0.1, fp32_ms=9.0)
    assert dtype_choice.choose_dtype(configured, CPU).dtype == configured
    assert timed == []


def test_cpu_without_bf16_flags_takes_float32_without_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    timed = fake_cpu(monkeypatch, frozenset({"avx2", "fma"}), bf16_ms=0.1, fp32_ms=9.0)
    choice = dtype_choice.choose_dtype("auto", CPU)
    assert choice.dtype == "float32"
    assert "no avx512_bf16" in choice.reason
    assert timed == []


@pytest.mark.parametrize(
    ("flags", "bf16_ms", "fp32_ms", "expected"),
    [
        # the flag is there but bfloat16 is slower (this project's AMD EPYC VM: 2.51 ms against 0.47 ms)
        (frozenset({"avx512_bf16"}), 2.51, 0.47, "float32"),
        (frozenset({"amx_bf16", "avx512_bf16"}), 0.20, 0.47, "bfloat16"),
        (frozenset({"amx_bf16"}), 0.47, 0.47, "float32"),  # a tie keeps float32: bfloat16 must be faster
        (None, 0.20, 0.47, "bfloat16"),  # flags unreadable: the timing decides alone
        (None, 0.90, 0.47, "float32"),
    ],
)
def test_flags_that_allow_bf16_are_checked_by_timing(
    monkeypatch: pytest.MonkeyPatch, flags: frozenset[str] | None, bf16_ms: float, fp32_ms: float, expected: str
) -> None:
    timed = fake_cpu(monkeypatch, flags, bf16_ms, fp32_ms)
    choice = dtype_choice.choose_dtype("auto", CPU)
    assert choice.dtype == expected
    assert sorted(timed) == ["bfloat16", "float32"]
    assert f"bfloat16 {bf16_ms:.3f} ms, float32 {fp32_ms:.3f} ms" in choice.reason


def test_the_probe_runs_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    timed = fake_cpu(monkeypatch, frozenset({"avx512_bf16"}), bf16_ms=0.2, fp32_ms=0.4)
    first = dtype_choice.choose_dtype("auto", CPU)
    assert dtype_choice.choose_dtype("auto", CPU) == first
    assert len(timed) == 2  # one bfloat16 and one float32 probe, not four


def test_the_real_probe_times_both_dtypes() -> None:
    for dtype in (torch.bfloat16, torch.float32):
        ms = dtype_choice._fastest_run_ms(dtype)
        assert 0.0 < ms < 10_000.0


def test_cpu_flags_reads_the_flags_line(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse2 avx2 avx512_bf16\n\n")
    assert dtype_choice.cpu_flags(cpuinfo) == frozenset({"fpu", "sse2", "avx2", "avx512_bf16"})
    assert dtype_choice.cpu_flags(tmp_path / "missing") is None
    (tmp_path / "arm").write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert dtype_choice.cpu_flags(tmp_path / "arm") == frozenset({"fp", "asimd", "bf16"})


@pytest.mark.parametrize(("bf16_ms", "expected"), [(0.1, torch.bfloat16), (9.0, torch.float32)])
def test_the_engine_loads_weights_in_the_chosen_dtype(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, bf16_ms: float, expected: torch.dtype
) -> None:
    folder = tmp_path / "tiny"
    tiny_model("llama").save_pretrained(folder)
    byte_chat_tokenizer().save_pretrained(folder)
    fake_cpu(monkeypatch, frozenset({"avx512_bf16"}), bf16_ms=bf16_ms, fp32_ms=1.0)
    _, model, _ = load_causal_lm(EngineConfig(model=str(folder), device="cpu"), None)
    assert {p.dtype for p in model.parameters()} == {expected}
    assert dtype_choice.loaded_dtype(model) == str(expected).removeprefix("torch.")
