"""benchmarks/vllm_fidelity.py: the comparison of two engines' fidelity rows, on rows the fidelity runner measures
with a tiny real engine (the vLLM side is the same rows with a known change)."""

from __future__ import annotations

from typing import Any

import pytest
from benchmark_scripts import load_benchmark
from tiny_models import tiny_engine

from inferscale.eval.fidelity import FidelitySetting, run_fidelity
from inferscale.eval.fidelity_cases import FidelityCase, FidelitySlice

vf = load_benchmark("vllm_fidelity")

CASES = [
    FidelityCase(memories=["Maya lives in Porto.", "Raj taught Maya chess."], question="Who taught Maya chess?"),
    FidelityCase(memories=["Biscuit is a beagle.", "Clara teaches in Madrid."], question="What is the dog's name?"),
]


def _rows() -> list[dict[str, Any]]:
    return run_fidelity(
        {"short": tiny_engine("llama")}, [FidelitySlice("toy", CASES)], [FidelitySetting()], max_new_tokens=4
    )


def test_the_same_rows_in_both_engines_compare_equal() -> None:
    rows = _rows()
    table = vf.compare({"transformers": rows, "vllm": [dict(r) for r in rows]})
    assert [(e["system_prompt"], e["slice"]) for e in table] == [("short", "toy"), ("all", "all")]
    for entry in table:
        assert entry["n"] == 2 and entry["kl_gap"] == 0.0 and entry["same_kv_answer"] == 1.0
        assert entry["vllm"] == entry["transformers"]


def test_the_gap_is_the_difference_of_the_mean_kls_and_answers_are_matched_case_by_case() -> None:
    rows = _rows()
    other = [dict(r) for r in rows]
    other[0]["kl"] += 0.03  # mean KL over two cases moves by 0.015
    other[1]["kv_answer"] += " (changed)"
    (cell, pooled) = vf.compare({"transformers": rows, "vllm": other})
    for entry in (cell, pooled):
        assert entry["kl_gap"] == pytest.approx(0.015, abs=1e-4)
        assert entry["same_kv_answer"] == 0.5


def test_first_token_rows_carry_no_answer_share() -> None:
    rows = run_fidelity(
        {"short": tiny_engine("llama")}, [FidelitySlice("toy", CASES)], [FidelitySetting()], generate=False
    )
    (cell, _) = vf.compare({"transformers": rows, "vllm": rows})
    assert "same_kv_answer" not in cell
