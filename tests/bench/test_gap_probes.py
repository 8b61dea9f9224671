"""benchmarks/gap_probes.py's layouts and argument checks against hand-written values (its forward passes check
themselves when it runs: a band of no layer is KV mode, of every layer prompt mode)."""

from __future__ import annotations

import argparse

import pytest
import torch
from benchmark_scripts import load_benchmark
from mem0_fakes import HashEmbedder
from served_kv import context_free_request
from tiny_models import tiny_engine

from inferscale.kv.fact import FactKV

gp = load_benchmark("gap_probes")


def _fact(n_tokens: int, encoded_at: int) -> FactKV:
    zeros = torch.zeros(1, 1, n_tokens, 2)
    return FactKV(keys=zeros, values=zeros.clone(), token_ids=torch.arange(n_tokens), encoded_at=encoded_at)


def test_the_layouts_place_each_fact_as_documented() -> None:
    facts = [_fact(4, 30), _fact(3, 31), _fact(5, 60)]  # encoded after a 10-token prefix and 20 / 21 / 50 of context
    assert gp.contiguous_starts(10, facts) == [10, 14, 17]  # as the product serves them
    # at its encoded position, or right after the fact before it when that ends later
    assert gp.gapped_starts(10, facts) == [30, 34, 60]
    assert gp.gapped_starts(40, [_fact(2, 30)]) == [40]  # never before the prefix ends


def test_bands_parse_and_bad_ones_are_refused() -> None:
    assert gp.parse_band("top:4", 30) == ("top", 4)
    assert gp.parse_band("bottom:0", 30) == ("bottom", 0)
    assert gp.parse_band("top:30", 30) == ("top", 30)
    assert gp.parse_band("top:99") == ("top", 99)  # the layer count is checked once the model is loaded
    for bad in ("top:31", "middle:3", "top:-1", "top:", "top"):
        with pytest.raises(ValueError, match="expected 'top:N' or 'bottom:N'"):
            gp.parse_band(bad, 30)
    with pytest.raises(argparse.ArgumentTypeError, match="'mid:2'"):
        gp.band_argument("mid:2")
    assert gp.band_argument("bottom:4") == "bottom:4"


def test_chain_windows_are_positive_integers() -> None:
    assert gp.window_argument("3") == 3
    for bad in ("0", "-1", "x", "2.5"):
        with pytest.raises(argparse.ArgumentTypeError, match="is not a window w >= 1"):
            gp.window_argument(bad)


def test_a_chain_reaches_its_last_w_context_turns_and_never_past_its_blocks_anchor() -> None:
    # one chain through the scope: the last w context turns, whatever their index
    assert gp.chain_context(0, [], 3) == (False, [])  # the first memory is encoded alone
    assert gp.chain_context(7, [2, 3, 4, 5, 6], 3) == (False, [4, 5, 6])
    assert gp.chain_context(7, [5, 6], 3) == (False, [5, 6])  # a session's second turn: one turn before it
    # blocks of 4: memories 0, 4, 8 are anchors (encoded after text), the rest chain inside their block only
    assert gp.chain_context(4, [1, 2, 3], 3, block=4) == (True, [])
    assert gp.chain_context(8, [], 3, block=4) == (True, [])
    assert gp.chain_context(5, [2, 3, 4], 3, block=4) == (False, [4])
    assert gp.chain_context(6, [3, 4, 5], 3, block=4) == (False, [4, 5])
    assert gp.chain_context(7, [1, 2, 3, 4, 5, 6], 3, block=4) == (False, [4, 5, 6])
    assert gp.chain_context(7, [1, 2, 3, 4, 5, 6], 2, block=4) == (False, [5, 6])
    assert gp.chain_context(3, [0, 1, 2], 3, block=4) == (False, [0, 1, 2])  # the first block's anchor is memory 0
    with pytest.raises(ValueError, match=r"memory 3's context turns must be memories stored before it, got \[1, 3\]"):
        gp.chain_context(3, [1, 3], 3)
    with pytest.raises(ValueError, match="a chain's window must be at least 1, got 0"):
        gp.chain_context(3, [0, 1, 2], 0)  # context[-0:] would be every turn
    assert [i for i in range(10) if gp.is_anchor(i, 4)] == [0, 4, 8]
    assert not any(gp.is_anchor(i, 0) for i in range(10))


def test_a_negative_answer_budget_is_refused_before_the_model_loads(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.argv", ["gap_probes.py", "--locomo", "unused.json", "--max-new-tokens", "-1"])
    with pytest.raises(SystemExit) as exited:
        gp.main()
    assert exited.value.code == 2
    assert "argument --max-new-tokens: expected an integer >= 0, got '-1'" in capsys.readouterr().err


def test_the_product_probe_serves_each_memory_in_context_and_first_from_its_prefix_alone() -> None:
    engine = tiny_engine("llama")
    memories = ["Maya lives in Porto.", "Raj taught Maya chess.", "Biscuit is a beagle."]
    in_context, context_free, prefilled, second = gp.product_encode(engine, HashEmbedder(), memories, "Be brief.", 0)
    prefix = engine.system_prefix_ids()
    fresh = engine.encode_facts([context_free_request(engine, t) for t in memories])
    for text, alone in zip(memories, fresh, strict=True):
        assert float((context_free[text].keys - alone.keys).abs().max()) < 1e-5
    assert in_context[memories[0]].encoded_at == len(prefix)  # the first memory added has no turn before it
    turns = [len(engine.context_token_ids(memories[:i])) for i in (1, 2)]
    assert [in_context[t].encoded_at - len(prefix) for t in memories[1:]] == turns
    facts = [len(engine.fact_token_ids(t)) for t in memories]
    assert (prefilled, second) == (sum(facts) + sum(turns), facts[1] + facts[2])
