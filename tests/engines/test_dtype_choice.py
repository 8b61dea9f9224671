"""``dtype="auto"``: bfloat16 only where the hardware runs it faster than float32, else float32 (issue #16)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_models import byte_chat_tokenizer, tiny_model

from inferscale.config import EngineConfig, MemoryConfig
from inferscale.engines.hf import dtype as dtype_choice
from inferscale.engines.hf import load_causal_lm

CPU = torch.device("cpu")


def fake_flags(monkeypatch: pytest.MonkeyPatch, flags: frozenset[str] | None) -> None:
    monkeypatch.setattr(dtype_choice, "cpu_flags", lambda: flags)


def fake_clock(monkeypatch: pytest.MonkeyPatch, bf16_ms: float, fp32_ms: float) -> list[torch.dtype]:
    """Each timed MLP run takes ``bf16_ms`` or ``fp32_ms`` by its dtype; returns the dtypes timed, in order."""
    timed: list[torch.dtype] = []
    now = [0.0]
    real_forward = torch.nn.Module.__call__

    def perf_counter() -> float:
        return now[0]

    def timed_call(module: torch.nn.Module, *args: object, **kwargs: object) -> object:
        out = real_forward(module, *args, **kwargs)
        if module.__class__.__name__.endswith("MLP"):
            dtype = next(module.parameters()).dtype
            timed.append(dtype)
            now[0] += (bf16_ms if dtype == torch.bfloat16 else fp32_ms) / 1000
        return out

    monkeypatch.setattr(dtype_choice.time, "perf_counter", perf_counter)
    monkeypatch.setattr(torch.nn.Module, "__call__", timed_call)
    return timed


def test_auto_is_the_default() -> None:
    assert EngineConfig().dtype == "auto"
    assert MemoryConfig().engine.dtype == "auto"


@pytest.mark.parametrize("configured", ["float32", "bfloat16", "float16"])
def test_a_configured_dtype_is_kept_without_probing(monkeypatch: pytest.MonkeyPatch, configured: str) -> None:
    fake_flags(monkeypatch, frozenset({"avx512_bf16"}))
    assert dtype_choice.choose_dtype(configured, CPU) == dtype_choice.DtypeChoice(configured, "configured")


def test_cpu_without_bf16_flags_takes_float32_without_probing(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_flags(monkeypatch, frozenset({"avx2", "fma"}))
    choice = dtype_choice.choose_dtype("auto", CPU)
    assert (choice.dtype, choice.probe) == ("float32", False)
    assert "no avx512_bf16" in choice.reason


@pytest.mark.parametrize(
    ("flags", "stored", "load_as"),
    [
        (frozenset({"avx512_bf16"}), "bfloat16", "bfloat16"),
        (frozenset({"amx_bf16"}), None, "bfloat16"),
        (None, "float32", "float32"),  # flags unreadable: the timing decides; fp32 weights load exactly in fp32
        (frozenset({"avx512_bf16"}), "float16", "float32"),  # float16 widens exactly to float32
    ],
)
def test_cpu_bf16_flags_make_a_provisional_choice_in_a_lossless_dtype(
    monkeypatch: pytest.MonkeyPatch, flags: frozenset[str] | None, stored: str | None, load_as: str
) -> None:
    fake_flags(monkeypatch, flags)
    choice = dtype_choice.choose_dtype("auto", CPU, stored)
    assert (choice.dtype, choice.probe) == (load_as, True)


@pytest.mark.parametrize(
    ("bf16_ms", "fp32_ms", "expected"),
    [
        (2.51, 0.47, "float32"),  # the flag is there but bfloat16 is slower (this project's AMD EPYC VM)
        (0.20, 0.47, "bfloat16"),
        (0.47, 0.47, "float32"),  # a tie keeps float32
        (0.43, 0.47, "float32"),  # 9% faster is within the noise margin: float32 stays
        (0.40, 0.47, "bfloat16"),  # 17.5% faster: past BF16_MARGIN
    ],
)
def test_the_probe_times_the_models_own_mlp_in_both_dtypes(
    monkeypatch: pytest.MonkeyPatch, bf16_ms: float, fp32_ms: float, expected: str
) -> None:
    model = tiny_model("llama")
    before = {name: p.clone() for name, p in model.named_parameters()}
    timed = fake_clock(monkeypatch, bf16_ms, fp32_ms)
    choice = dtype_choice.probe_cpu_dtype(model)
    assert choice.dtype == expected and not choice.probe
    assert f"bfloat16 {bf16_ms:.2f} ms, float32 {fp32_ms:.2f} ms" in choice.reason
    rounds = dtype_choice.PROBE_ROUNDS + 1  # and one warm-up
    assert timed == [torch.bfloat16, torch.float32] * rounds  # interleaved
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())  # copies timed


def test_the_real_probe_returns_a_timed_choice() -> None:
    choice = dtype_choice.probe_cpu_dtype(tiny_model("qwen3"))
    assert choice.dtype in ("bfloat16", "float32")
    assert f"best of {dtype_choice.PROBE_ROUNDS}: bfloat16 " in choice.reason  # it said "(fastest)" after float32


def test_cpu_flags_reads_the_flags_line(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse2 avx2 avx512_bf16\n\n")
    assert dtype_choice.cpu_flags(cpuinfo) == frozenset({"fpu", "sse2", "avx2", "avx512_bf16"})
    assert dtype_choice.cpu_flags(tmp_path / "missing") is None
    (tmp_path / "arm").write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert dtype_choice.cpu_flags(tmp_path / "arm") == frozenset({"fp", "asimd", "bf16"})


@pytest.mark.parametrize(("bf16_ms", "expected"), [(0.1, torch.bfloat16), (9.0, torch.float32)])
@pytest.mark.parametrize("stored", [torch.float32, torch.bfloat16])
def test_the_engine_ends_in_the_chosen_dtype_as_if_loaded_in_it_directly(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, bf16_ms: float, expected: torch.dtype, stored: torch.dtype
) -> None:
    folder = tmp_path / "tiny"
    tiny_model("llama").to(stored).save_pretrained(folder)
    byte_chat_tokenizer().save_pretrained(folder)
    fake_flags(monkeypatch, frozenset({"avx512_bf16"}))
    fake_clock(monkeypatch, bf16_ms=bf16_ms, fp32_ms=1.0)
    _, model, _ = load_causal_lm(EngineConfig(model=str(folder), device="cpu"), tmp_path)
    monkeypatch.undo()
    name = str(expected).removeprefix("torch.")
    _, direct, _ = load_causal_lm(EngineConfig(model=str(folder), dtype=name, device="cpu"), tmp_path)
    assert {p.dtype for p in model.parameters()} == {expected}
    assert dtype_choice.loaded_dtype(model) == name
    want = dict(direct.state_dict(keep_vars=True)) | dict(direct.named_buffers())
    got = dict(model.state_dict(keep_vars=True)) | dict(model.named_buffers())
    assert want.keys() == got.keys()
    for key, tensor in want.items():
        assert tensor.dtype == got[key].dtype and torch.equal(tensor, got[key]), key


def test_the_first_choice_is_recorded_and_reused_so_it_never_flips(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    record = tmp_path / "home" / "dtype-choice.json"
    model = tiny_model("llama")
    timed = fake_clock(monkeypatch, bf16_ms=0.1, fp32_ms=1.0)
    first = dtype_choice.probe_cpu_dtype(model, record)
    assert first.dtype == "bfloat16" and len(timed) == 2 * (dtype_choice.PROBE_ROUNDS + 1)
    monkeypatch.undo()
    timed = fake_clock(monkeypatch, bf16_ms=9.0, fp32_ms=1.0)  # the machine got noisy: the timing now says float32
    again = dtype_choice.probe_cpu_dtype(model, record)
    assert again.dtype == "bfloat16" and timed == []
    assert str(record) in again.reason
    other = tiny_model("llama", intermediate_size=96)  # another MLP shape is timed on its own
    assert dtype_choice.probe_cpu_dtype(other, record).dtype == "float32"
    assert len(json.loads(record.read_text())) == 2
    record.write_text("not json")  # an unreadable record is timed again and rewritten
    assert dtype_choice.probe_cpu_dtype(model, record).dtype == "float32"
