"""``run_fidelity`` against a K/V reference (what ``benchmarks/kv_quantization.py`` measures): the facts are encoded
once, quantised once per storage format, served stored, and compared with the model-dtype K/V's answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch

from inferscale.errors import ConfigError
from inferscale.eval.fidelity import FactCache, FidelitySetting, run_fidelity
from inferscale.eval.fidelity_cases import FidelityCase, FidelitySlice
from inferscale.eval.fidelity_cli import _settings
from inferscale.kv import EncodeRequest, FactKV


@dataclass
class _Generation:
    text: str
    token_ids: list[int]
    recomputed_tokens: int = 0
    kv_assembly_ms: float = 0.0
    prefill_ms: float = 0.0


class _Engine:
    """Logits that are a function of the served K/V (their dequantised values), and an answer naming their rounded
    sum; records the storage format of every fact it is served."""

    def __init__(self) -> None:
        self.encoded = 0
        self.calls: list[int] = []
        self.served: list[str] = []

    def fact_token_ids(self, text: str) -> list[int]:
        return [3 + b % 50 for b in text.encode()][:6]

    def system_prefix_ids(self) -> list[int]:
        return [1, 2]

    def context_token_ids(self, turns: list[str]) -> list[int]:
        return [t for turn in turns for t in self.fact_token_ids(turn)]

    def encode_facts(self, requests: list[EncodeRequest]) -> list[FactKV]:
        self.encoded += len(requests)
        self.calls.append(len(requests))
        out = []
        for req in requests:
            g = torch.Generator().manual_seed(sum(req.fact_ids))
            shape = (2, 1, len(req.fact_ids), 8)
            out.append(
                FactKV(torch.randn(shape, generator=g), torch.randn(shape, generator=g), torch.tensor(req.fact_ids), 2)
            )
        return out

    def _logits(self, facts: list[FactKV]) -> torch.Tensor:
        self.served += [f.storage_format for f in facts]
        return torch.cat([f.dequantized(torch.float32).values.reshape(-1)[:4] for f in facts])

    def first_token_logits(self, question: str, facts: list[FactKV] | None, *_: Any, **__: Any) -> torch.Tensor:
        assert facts is not None, "a K/V reference never asks for prompt mode"
        return self._logits(facts)

    def generate_kv(self, question: str, facts: list[FactKV], max_new_tokens: int, **_: Any) -> _Generation:
        total = float(self._logits(facts).sum())
        return _Generation(f"sum {total:.1f}", [1, 2])


CASES = FidelitySlice(
    "toy",
    [
        FidelityCase(memories=["I live in Lisbon.", "My dog is Rex."], question="Where?", answer="Lisbon"),
        FidelityCase(memories=["My dog is Rex.", "I like tea."], question="Dog?", answer="Rex"),
    ],
)


def test_8bit_settings_are_compared_with_the_model_dtype_kv() -> None:
    engine = _Engine()
    reference = FidelitySetting(name="model")
    settings = [
        reference,
        *(reference.model_copy(update={"storage_format": f, "name": f}) for f in ("int8", "float8_e4m3")),
    ]
    caches: dict[str, FactCache] = {}
    rows = run_fidelity({"p": engine}, [CASES], settings, reference=reference, caches=caches)
    assert engine.encoded == 3  # three distinct memories, each encoded once for all formats
    assert len(caches["p"].encoded()) == 3
    assert {"int8", "float8_e4m3", "model"} <= set(engine.served)
    by = {(r["setting"], r["case"]): r for r in rows}
    for case in range(2):
        assert (
            by[("model", case)]["kl"] == 0.0
            and by[("model", case)]["kv_answer"] == by[("model", case)]["prompt_answer"]
        )
        assert 0 < by[("int8", case)]["kl"] < by[("float8_e4m3", case)]["kl"]  # int8's error is the smaller here
        assert by[("int8", case)]["prompt_answer"] == by[("model", case)]["kv_answer"]  # the reference's answer
    run_fidelity({"p": engine}, [CASES], settings[1:], reference=reference, caches=caches, generate=False)
    assert engine.encoded == 3  # a second run reuses the caches


def test_a_control_encodes_each_fact_alone_once() -> None:
    engine = _Engine()
    control = FidelitySetting(name="control", encode_alone=True)
    rows = run_fidelity({"p": engine}, [CASES], [control], reference=FidelitySetting(), generate=False)
    # case 1: the reference encodes its two facts in one call, the control each alone; case 2: one new fact each
    assert engine.calls == [2, 1, 1, 1, 1] and engine.encoded == 6
    assert [r["kl"] for r in rows] == [0.0, 0.0]  # this fake encodes alike alone and batched
    assert control.label == "control" and FidelitySetting(encode_alone=True).label.endswith("encoded alone")


def test_a_setting_with_an_unknown_storage_format_is_a_config_error() -> None:
    assert _settings(('{"storage_format": "int8"}',))[0].label.endswith("kv=int8")
    with pytest.raises(ConfigError, match="storage_format"):
        _settings(('{"storage_format": "int4"}',))
