"""benchmarks/context_ensemble.py: the earlier-memory contexts against hand-written ones, and the mean of a fact's
encodings against a hand-computed one."""

from __future__ import annotations

import pytest
import torch
from benchmark_scripts import load_benchmark

from inferscale.kv.fact import FactKV

ce = load_benchmark("context_ensemble")


def test_shifted_contexts_are_the_w_memories_before_the_w_right_before() -> None:
    assert ce.shifted_earlier(7, 2) == [[], [], [], [0], [0, 1], [1, 2], [2, 3]]


def test_random_contexts_hold_only_earlier_memories_in_order_and_repeat_with_the_seed() -> None:
    drawn = ce.random_earlier(30, 5, seed=3)
    assert drawn[:3] == [[], [0], [0, 1]]  # fewer earlier memories than w: all of them
    for i, row in enumerate(drawn):
        assert row == sorted(set(row)) and len(row) == min(5, i) and all(j < i for j in row)
    assert drawn == ce.random_earlier(30, 5, seed=3)
    assert drawn != ce.random_earlier(30, 5, seed=4)


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


def test_encodings_of_different_facts_or_none_are_refused() -> None:
    k = torch.zeros(1, 1, 2, 4)
    with pytest.raises(ValueError, match="same fact"):
        ce.averaged([_fact(k, k, [1, 2]), _fact(k, k, [1, 3])])
    with pytest.raises(ValueError, match="no encodings"):
        ce.averaged([])


def test_a_run_names_its_slice(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.argv", ["context_ensemble.py"])
    with pytest.raises(SystemExit) as exited:
        ce.main()
    assert exited.value.code == 2
    assert "give --locomo PATH (or --demo)" in capsys.readouterr().err
