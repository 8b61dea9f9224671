"""benchmarks/context_ensemble.py: the earlier-memory contexts against hand-written ones, the mean of a fact's
encodings against a hand-computed one, the context check on hand-made encodings, and the argument checks (before any
model or file loads)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from benchmark_scripts import load_benchmark

from inferscale.eval.fidelity_cases import FidelityCase
from inferscale.kv.fact import FactKV

ce = load_benchmark("context_ensemble")
lp = load_benchmark("locomo_probe")


def test_shifted_contexts_end_w_memories_before_the_memory() -> None:
    assert ce.shifted_earlier(7, 2) == [[], [], [], [0], [0, 1], [1, 2], [2, 3]]


def test_random_contexts_hold_only_earlier_memories_in_order_and_repeat_with_the_seed() -> None:
    drawn = ce.random_earlier(30, 5, seed=3)
    assert drawn[:3] == [[], [0], [0, 1]]  # fewer earlier memories than w: all of them
    for i, row in enumerate(drawn):
        assert row == sorted(set(row)) and len(row) == min(5, i) and all(j < i for j in row)
    assert drawn == ce.random_earlier(30, 5, seed=3)
    assert drawn != ce.random_earlier(30, 5, seed=4)


def _conversation() -> Any:
    memories = ["m0", "m1", "m2", "m3", "m4"]
    vectors = np.eye(5, dtype=np.float32)
    vectors[4] = vectors[1]  # m4 is most like m1
    temporal = [[], ["m0"], ["m0", "m1"], [], ["m3"]]  # m3 opens a second session
    return lp.EmbeddedConversation(memories, temporal, [("q?", "a")], vectors)


def test_variants_name_the_memories_each_rule_picks() -> None:
    variants = ce.context_variants(_conversation(), w=1, seed=0)
    assert variants["temporal"] == [[], ["m0"], ["m0", "m1"], [], ["m3"]]
    assert variants["shifted"] == [[], [], ["m0"], ["m1"], ["m2"]]
    assert variants["similar"][4] == ["m1"]
    random_rows = ce.random_earlier(5, 1, 0)
    assert variants["random"] == [[f"m{j}" for j in row] for row in random_rows]
    assert variants["random2"] == [[f"m{j}" for j in row] for row in ce.random_earlier(5, 1, 1)]
    assert set(variants) == set(ce.CONTEXTS)


def test_a_case_takes_each_memorys_context_from_the_variant() -> None:
    case = FidelityCase(memories=["m3", "m1"], question="q?", contexts=[["x"], ["y"]])
    moved = ce.with_contexts(case, {"m0": ["a"], "m1": ["b"], "m2": ["c"], "m3": ["d", "e"]})
    assert moved.contexts == [["d", "e"], ["b"]] and moved.memories == case.memories


def _fact(keys: torch.Tensor, values: torch.Tensor, ids: list[int], at: int = 7) -> FactKV:
    return FactKV(keys=keys, values=values, token_ids=torch.tensor(ids), encoded_at=at)


def test_the_average_is_the_element_wise_mean_of_keys_and_values() -> None:
    g = torch.Generator().manual_seed(0)
    shape = (2, 3, 4, 8)
    encodings = [
        _fact(torch.randn(shape, generator=g), torch.randn(shape, generator=g), [5, 6, 7, 8], at=at)
        for at in (9, 12, 4)
    ]
    mean = ce.averaged(encodings)
    expected_k = (encodings[0].keys + encodings[1].keys + encodings[2].keys) / 3
    expected_v = (encodings[0].values + encodings[1].values + encodings[2].values) / 3
    torch.testing.assert_close(mean.keys, expected_k, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(mean.values, expected_v, atol=1e-6, rtol=1e-6)
    assert mean.encoded_at == 9 and torch.equal(mean.token_ids, torch.tensor([5, 6, 7, 8]))
    alone = ce.averaged(encodings[:1])
    assert torch.equal(alone.keys, encodings[0].keys) and torch.equal(alone.values, encodings[0].values)


def test_the_average_keeps_a_bfloat16_dtype() -> None:
    keys = torch.ones(1, 1, 2, 4, dtype=torch.bfloat16)
    mean = ce.averaged([_fact(keys, keys, [1, 2]), _fact(3 * keys, 3 * keys, [1, 2])])
    assert mean.keys.dtype == torch.bfloat16 and torch.equal(mean.keys, 2 * keys)


def test_encodings_of_different_facts_none_or_8_bit_codes_are_refused() -> None:
    k = torch.zeros(1, 1, 2, 4)
    with pytest.raises(ValueError, match="same fact"):
        ce.averaged([_fact(k, k, [1, 2]), _fact(k, k, [1, 3])])
    with pytest.raises(ValueError, match="no encodings"):
        ce.averaged([])
    plain = _fact(torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2, 4), [1, 2])
    with pytest.raises(ValueError, match="dequantize them first"):
        ce.averaged([plain, plain.quantized("int8")])


def test_encodings_must_follow_their_contexts() -> None:
    base = FidelityCase(memories=["m0", "m1"], question="q?", contexts=[["a", "b"], ["c"]])
    other = base.model_copy(update={"contexts": [["z", "b"], ["d"]]})  # m0's last turn is the same, m1's is not
    k0, k1, k2 = (torch.full((1, 1, 2, 4), float(v)) for v in (0, 1, 2))
    cases = {"temporal": base, "random": other}
    good = {
        "temporal": [_fact(k0, k0, [1, 2]), _fact(k1, k1, [1, 2])],
        "random": [_fact(k0, k0, [1, 2]), _fact(k2, k2, [1, 2])],
    }
    assert ce.context_mismatches(cases, good, w=1) == []
    ignored = {"temporal": good["temporal"], "random": [_fact(k0, k0, [1, 2]), _fact(k1, k1, [1, 2])]}
    assert ce.context_mismatches(cases, ignored, w=1) == [("random", 1)]  # a new context, the old K/V
    assert ce.context_mismatches(cases, good, w=2) == [("random", 0)]  # at w=2 m0's context differs too


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "give one of --locomo PATH and --demo"),
        (["--demo", "--locomo", "x.json"], "give one of --locomo PATH and --demo"),
        (["--demo", "--ensembles", "temporal+recent"], "unknown contexts ['recent'] in --ensembles"),
        (["--demo", "-w", "17"], "-w is at most 16"),
        (["--demo", "-w", "0"], "argument -w: expected an integer >= 1, got '0'"),
    ],
)
def test_bad_arguments_are_refused_before_anything_loads(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        ce.parse_arguments(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_ensembles_are_parsed_into_their_contexts() -> None:
    args = ce.parse_arguments(["--demo", "--ensembles", "temporal,temporal+random2"])
    assert args.ensembles == [("temporal",), ("temporal", "random2")] and args.w == 5
