"""`inferscale bench ttft` on the embedded SmolLM2 with k in {0, 2}, one repeat and three tiny facts: every cell is
measured and lands in the JSON; the PNG is written; the vLLM engine is refused clearly when it is not built."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from inferscale.bench.cli import add_bench_parser
from inferscale.bench.ttft import TTFTSettings, print_report, run_ttft_bench, synthetic_facts
from inferscale.config import EngineConfig, MemoryConfig
from inferscale.engines.transformers import TransformersEngine
from inferscale.errors import ConfigError

FACTS = ["I adopted a beagle named Biscuit.", "I live in Porto.", "My partner Daniel was born on June 14."]


@pytest.fixture(scope="module")
def engine(smollm2_fp32: tuple[Any, Any]) -> TransformersEngine:
    model, tokenizer = smollm2_fp32
    return TransformersEngine(
        EngineConfig(dtype="float32", device="cpu"), MemoryConfig().system_prompt, model=model, tokenizer=tokenizer
    )


@pytest.mark.slow
def test_ttft_bench_writes_every_cell(tmp_path: Path, engine: TransformersEngine, embedder: Any) -> None:
    settings = TTFTSettings(ks=(0, 2), repeats=1, warmup=0, dtype="float32", device="cpu", out_dir=tmp_path)
    report = run_ttft_bench(settings, engine=engine, embedder=embedder, facts=FACTS)

    doc = json.loads((tmp_path / "ttft_vs_k.json").read_text(encoding="utf-8"))
    assert (tmp_path / "ttft_vs_k.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    cells = {(c["k"], c["name"]): c for c in doc["cells"]}
    assert report.kv_names == ["kv:host", "kv:disk"]  # no device tier on CPU
    expected = {(0, "query")} | {(k, name) for k in (0, 2) for name in ("prompt", "kv:host", "kv:disk")}
    assert set(cells) == expected
    for cell in cells.values():
        assert cell["n"] == 1 and cell["ttft_p50_ms"] > 0 and cell["ttft_p95_ms"] >= cell["ttft_p50_ms"]
        assert cell["same_memories"] is True
    assert cells[(2, "prompt")]["memory_tokens"] > 0
    assert cells[(2, "kv:host")]["served"] == {"host": 2}
    assert cells[(2, "kv:disk")]["served"] == {"disk": 2}
    assert cells[(0, "kv:host")]["served"] == {}
    assert doc["ratios"]["ttft_kv_host_k2_over_query"] is not None
    assert doc["ratios"]["prefill_flops_kv_k2_over_k2"] == 1.0  # one positive k: compared with itself
    assert doc["settings"]["ks"] == [0, 2]


@pytest.mark.slow
def test_ttft_bench_counts_recomputed_tokens_in_the_flop_ratio(
    tmp_path: Path, smollm2_fp32: tuple[Any, Any], embedder: Any
) -> None:
    from inferscale.bench.flops import prefill_cost
    from inferscale.kv.recompute import RecomputePolicy
    from inferscale.kv.serving import ServingSettings

    model, tokenizer = smollm2_fp32
    engine = TransformersEngine(
        EngineConfig(dtype="float32", device="cpu"),
        MemoryConfig().system_prompt,
        model=model,
        tokenizer=tokenizer,
        serving=ServingSettings(recompute=RecomputePolicy.parse("tail:4")),
    )
    # a given engine serves with its own settings: recompute=None here, and the report must still say tail:4
    settings = TTFTSettings(ks=(1, 3), repeats=1, warmup=0, tiers=("host",), dtype="float32", out_dir=tmp_path)
    report = run_ttft_bench(settings, engine=engine, embedder=embedder, facts=FACTS)
    doc = json.loads((tmp_path / "ttft_vs_k.json").read_text(encoding="utf-8"))
    cells = {(c["k"], c["name"]): c for c in doc["cells"]}
    assert cells[(1, "kv:host")]["recomputed_tokens"] == 4 == cells[(3, "kv:host")]["recomputed_tokens"]
    assert cells[(3, "prompt")]["recomputed_tokens"] == 0
    assert doc["settings"]["recompute"] == "tail:4"  # the policy is recorded with the figures it produced
    console = Console(record=True, width=200)
    print_report(report, console)
    assert "kv.recompute=tail:4" in console.export_text()  # and printed with them
    cost = prefill_cost(engine.model)
    prefix, q = len(engine.system_prefix_ids()), len(engine.query_token_ids(settings.query))
    s1, s3 = cells[(1, "prompt")]["memory_tokens"], cells[(3, "prompt")]["memory_tokens"]
    expected = cost.flops(q + 4, prefix + s3 - 4) / cost.flops(q + 4, prefix + s1 - 4)
    assert doc["ratios"]["prefill_flops_kv_k3_over_k1"] == pytest.approx(expected, abs=1e-4)
    with pytest.raises(ConfigError, match="recompute"):
        TTFTSettings(recompute="tail")


@pytest.mark.slow
def test_flop_ratio_counts_recomputed_tokens_as_prefilled(engine: TransformersEngine) -> None:
    """At k=5 and k=50 (250 and 2,500 memory tokens), 100 recomputed tokens make the prefill 100 tokens longer at
    both k: the ratio is that of (q + 100) tokens after (P + S - 100), not of the query alone."""
    from types import SimpleNamespace

    from inferscale.bench.flops import prefill_cost
    from inferscale.bench.ttft import _flop_ratios
    from inferscale.bench.ttft_report import TTFTCell, TTFTReport

    cells = [
        TTFTCell(5, "prompt", memory_tokens=250),
        TTFTCell(5, "kv", "host", memory_tokens=250, recomputed_tokens=100),
        TTFTCell(50, "prompt", memory_tokens=2500),
        TTFTCell(50, "kv", "host", memory_tokens=2500, recomputed_tokens=100),
    ]
    report = TTFTReport({}, {}, cells, {})
    ratio = _flop_ratios(SimpleNamespace(engine=engine), report, "What is my dog called?")  # type: ignore[arg-type]
    cost = prefill_cost(engine.model)
    prefix, q = len(engine.system_prefix_ids()), len(engine.query_token_ids("What is my dog called?"))
    counted = cost.flops(q + 100, prefix + 2400) / cost.flops(q + 100, prefix + 150)
    query_only = cost.flops(q, prefix + 2500) / cost.flops(q, prefix + 250)
    assert ratio == {"prefill_flops_kv_k50_over_k5": round(counted, 4)}
    assert round(counted, 4) != round(query_only, 4)


def test_vllm_engine_is_refused_when_not_installed(tmp_path: Path) -> None:
    if importlib.util.find_spec("inferscale.engines.vllm") and importlib.util.find_spec("vllm"):
        pytest.skip("the vLLM engine and vllm are installed")
    with pytest.raises(ConfigError, match="not installed"):
        run_ttft_bench(TTFTSettings(ks=(0, 1), repeats=1, engine="vllm", out_dir=tmp_path))


def test_ks_without_a_positive_k_are_refused_when_read() -> None:
    """``--ks 0`` failed after start-up with "messages is an empty list" (it stored no memory); k=0 beside a positive
    k stays valid (a CLI user's report)."""
    with pytest.raises(ConfigError, match="ks needs at least one k >= 1"):
        TTFTSettings(ks=(0,))
    assert TTFTSettings(ks=(0, 5)).ks == (0, 5)


def test_bench_parser_reads_the_options() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "ttft", "--ks", "0,5,50", "--repeats", "3", "--dtype", "float32"])
    assert args.ks == (0, 5, 50) and args.repeats == 3 and args.dtype == "float32" and callable(args.func)


def test_synthetic_facts_are_distinct_and_prefix_stable() -> None:
    facts = synthetic_facts(50)
    assert len(set(facts)) == 50
    assert synthetic_facts(5) == facts[:5]
