"""`inferscale bench throughput` without vLLM: the workload draws, the report's figures and ratios, the outputs and
the CLI. The end-to-end run on vLLM is in tests/bench/test_vllm_throughput.py (vLLM stage)."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest
from rich.console import Console

from inferscale.bench.cli import add_bench_parser
from inferscale.bench.throughput import (
    ThroughputReport,
    ThroughputRound,
    ThroughputSettings,
    draws,
    print_throughput,
    run_throughput_bench,
    write_outputs,
)
from inferscale.errors import ConfigError


def test_every_request_draws_its_own_k_distinct_facts_deterministically() -> None:
    settings = ThroughputSettings(users=(3,), k=5, requests_per_user=2, facts=12)
    per_user = draws(settings, 3)
    assert [len(mine) for mine in per_user] == [2, 2, 2]
    flat = [d for mine in per_user for d in mine]
    for d in flat:
        assert len(d.facts) == 5 and len(set(d.facts)) == 5 and all(0 <= i < 12 for i in d.facts)
    assert len({d.facts for d in flat}) == 6  # no two requests share a memory segment
    assert len({d.question for d in flat}) == 6
    assert draws(settings, 3) == per_user  # seeded: the same workload on every run and for both modes
    assert draws(ThroughputSettings(users=(3,), k=5, requests_per_user=2, facts=12, seed=1), 3) != per_user


@pytest.mark.parametrize(
    "overrides",
    [
        {"users": ()},
        {"users": (0,)},
        {"users": (4, 4)},
        {"k": 0},
        {"k": 9, "facts": 8},
        {"requests_per_user": 0},
        {"modes": ("x",)},
        {"modes": ("kv", "kv")},
    ],
)
def test_bad_settings_are_refused(overrides: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        ThroughputSettings(**overrides)  # type: ignore[arg-type]


def _report() -> ThroughputReport:
    rounds = [
        ThroughputRound(1, "prompt", wall_s=2.0, ttft_ms=[400.0, 600.0], latency_ms=[900.0, 1100.0], output_tokens=8),
        ThroughputRound(1, "kv", wall_s=0.5, ttft_ms=[100.0, 100.0], latency_ms=[240.0, 260.0], output_tokens=8),
        ThroughputRound(4, "prompt", wall_s=8.0, ttft_ms=[1000.0] * 8, latency_ms=[1500.0] * 8, output_tokens=32),
        ThroughputRound(4, "kv", wall_s=1.0, ttft_ms=[200.0] * 8, latency_ms=[300.0] * 8, output_tokens=32),
    ]
    settings = {"users": [1, 4], "k": 30, "requests_per_user": 2, "max_tokens": 4, "modes": ["prompt", "kv"]}
    settings["dtype"] = "bfloat16"
    return ThroughputReport(settings=settings, machine={"model": "m", "processor": "cpu"}, rounds=rounds)


def test_report_figures_and_ratios(tmp_path: Path) -> None:
    report = _report()
    assert report.round(1, "prompt").requests_per_s == pytest.approx(1.0)  # type: ignore[union-attr]
    assert report.round(4, "kv").output_tokens_per_s == pytest.approx(32.0)  # type: ignore[union-attr]
    assert report.ratios() == {
        "throughput_kv_over_prompt_n1": 4.0,
        "ttft_prompt_over_kv_n1": 5.0,
        "throughput_kv_over_prompt_n4": 8.0,
        "ttft_prompt_over_kv_n4": 5.0,
    }
    write_outputs(report, tmp_path)
    doc = json.loads((tmp_path / "throughput_vs_users.json").read_text(encoding="utf-8"))
    assert (tmp_path / "throughput_vs_users.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    first = doc["rounds"][0]
    assert (first["users"], first["mode"], first["requests"], first["ttft_p50_ms"]) == (1, "prompt", 2, 500.0)
    assert doc["ratios"]["throughput_kv_over_prompt_n4"] == 8.0
    console = Console(record=True, width=200)
    print_throughput(report, console)
    text = console.export_text()
    assert "8.00×" in text and "throughput_kv_over_prompt_n1 = 4.0" in text


def test_throughput_needs_vllm(tmp_path: Path) -> None:
    if importlib.util.find_spec("inferscale.engines.vllm") and importlib.util.find_spec("vllm"):
        pytest.skip("vllm is installed here; tests/bench/test_vllm_throughput.py runs the benchmark")
    with pytest.raises(ConfigError, match="not installed") as refused:
        run_throughput_bench(ThroughputSettings(users=(1,), k=1, facts=1, out_dir=tmp_path))
    # it has no --engine option to switch (a CLI user's report: the message advised --engine transformers)
    assert str(refused.value).startswith("bench throughput: ") and str(refused.value).endswith("runs on vLLM only")
    assert "--engine" not in str(refused.value)


def test_throughput_parser_reads_the_options() -> None:
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["bench", "throughput", "--users", "1,8,100", "-k", "30", "--requests-per-user", "3", "--modes", "kv"]
    )
    assert args.users == (1, 8, 100) and args.k == 30 and args.requests_per_user == 3 and args.modes == ("kv",)
    assert args.max_tokens == 16 and callable(args.func)
