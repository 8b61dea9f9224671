"""benchmarks/cost_model.py against hand counts, the KV store's real files, and docs/scaling.md's tables."""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from benchmark_scripts import BENCHMARKS, load_benchmark

cm = load_benchmark("cost_model")


@pytest.fixture(scope="module")
def inp() -> Any:
    return cm.load_inputs()


def _model(inp: Any, name: str) -> Any:
    return next(m for m in inp.models if m.name == name)


def _format(inp: Any, name: str) -> Any:
    return next(f for f in inp.formats if f.name == name)


def test_kv_bytes_per_token_are_2_layers_heads_dims_bytes(inp: Any) -> None:
    bf16, fp8, int8 = (_format(inp, n) for n in ("bf16", "fp8", "int8"))
    smol, l8, l70 = (_model(inp, n) for n in ("SmolLM2-135M", "Llama-3.1-8B", "Llama-3.1-70B"))
    assert bf16.kv_bytes(l8, 1) == 2 * 32 * 8 * 128 * 2 == 131_072
    assert bf16.kv_bytes(l70, 1) == 2 * 80 * 8 * 128 * 2 == 327_680
    assert bf16.kv_bytes(smol, 1) == 2 * 30 * 3 * 64 * 2 == 23_040  # the "~23 KB per token"
    assert bf16.kv_bytes(l8, 25) == 3_276_800  # the "~3.2 MB" per 25-token fact
    # 8-bit: one byte per element, plus float32 scales: fp8 one per layer and KV head for K and for V; int8 (KIVI)
    # one per layer, KV head and channel for K, and per layer, KV head and token for V.
    assert fp8.kv_bytes(l8, 25) == 65_536 * 25 + 2 * 32 * 8 * 4
    assert int8.kv_bytes(l8, 25) == 65_536 * 25 + (32 * 8 * 128 + 32 * 8 * 25) * 4


def test_model_shapes_give_the_published_parameter_counts(inp: Any) -> None:
    l8, l70, smol = (_model(inp, n) for n in ("Llama-3.1-8B", "Llama-3.1-70B", "SmolLM2-135M"))
    assert l8.linear_params == 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336) == 6_979_321_856
    assert l8.weight_params == 8_029_995_008  # 8.03B
    assert round(l70.weight_params / 1e9, 1) == 70.6
    assert 2 * smol.linear_params == 212_336_640  # inferscale.bench.flops on the real model (test_bench_flops.py)
    assert smol.weight_params == 134_515_008 - 35_136  # tied embeddings; its 61 RMSNorm vectors (576 each) left out


def test_the_file_formula_equals_a_real_kv_store_file(inp: Any, tmp_path: Path) -> None:
    from inferscale.kv import FactKV, KVKey
    from inferscale.kv.fingerprint import encoding_key
    from inferscale.kv.tiers.disk import DiskTier

    keys = torch.randn(30, 3, 25, 64).to(torch.bfloat16)  # SmolLM2-135M's shape, a 25-token fact
    fact = FactKV(keys, keys.clone(), torch.arange(25), encoded_at=37)
    key = KVKey(str(uuid.uuid4()), "a" * 64, "f" * 32, encoding_key("b" * 32, ["turn"] * 5, 5, 0))
    tier = DiskTier(tmp_path, fsync=False)
    tier.put(key, fact)
    written = tier.path(key).stat().st_size
    assert cm.file_bytes(inp, _model(inp, "SmolLM2-135M"), _format(inp, "bf16"), 25) == written


def test_break_even_and_cold_user_follow_the_formulas(inp: Any) -> None:
    l8 = _model(inp, "Llama-3.1-8B")
    per_fact = 131_072 * 25 + 8 * 25 + inp["kv_file_header_bytes"]
    flops_per_token = 2 * 6_979_321_856 + 4 * 32 * 32 * 128 * 13  # attention to (25 + 1) / 2 keys on average
    rate = 989e12 * 0.5 / flops_per_token
    row = next(r for r in cm.break_even(inp) if (r["model"], r["format"], r["device"]) == (l8.name, "bf16", "H200"))
    assert row["recompute_tokens_per_s"] == pytest.approx(rate)
    assert row["break_even_bytes_per_s"] == pytest.approx(per_fact / 25 * rate)
    assert row["tiers"]["NVMe"]["load_over_recompute"] == pytest.approx(per_fact / 25 * rate / 7e9)
    assert row["tiers"]["10 GbE store"]["load_over_recompute"] > 1 > row["tiers"]["NVMe"]["load_over_recompute"]

    cold = next(r for r in cm.cold_user(inp) if (r["model"], r["format"], r["device"]) == (l8.name, "bf16", "H200"))
    assert cold["bytes"] == 10 * per_fact
    assert cold["load_s"]["NVMe"] == pytest.approx(1e-4 + 10 * per_fact / 7e9)
    assert cold["load_s"]["host RAM"] == pytest.approx(1e-5 + 10 * per_fact / 64e9)
    # 250 tokens: FLOP-bound on one H200 (the 16 GB of weights take 3.3 ms to read)
    assert cold["recompute_s"] == pytest.approx(250 / (989e12 * 0.5 / (2 * 6_979_321_856 + 4 * 32 * 32 * 128 * 125.5)))
    assert "GPU HBM" not in cold["load_s"]  # a cold user's K/V are not resident


def test_simulation_totals(inp: Any) -> None:
    sim = cm.simulate(inp)
    per_fact = 131_072 * 25 + 8 * 25 + inp["kv_file_header_bytes"]
    assert sim["memories"] == 10_000_000 * 200
    kv = next(r for r in sim["kv"] if (r["model"], r["format"]) == ("Llama-3.1-8B", "bf16"))
    assert kv["total_bytes"] == 2e9 * per_fact
    assert kv["nvme_bytes"] == 1e6 * 200 * per_fact  # 10% of users active today
    assert kv["nvme_servers"] == math.ceil(1e6 * 200 * per_fact / 30.72e12)
    assert kv["host_bytes"] == pytest.approx(1e6 * 30 / 1440 * 2 * 50 * per_fact)
    sql = 2e9 * inp["sql_bytes_per_memory_postgresql"]
    assert sim["sql"]["bytes"] == sql and sim["sql"]["machines"] == 2 * math.ceil(sql / 4e12)


def test_overrides_and_bad_inputs(tmp_path: Path) -> None:
    assert cm.simulate(cm.load_inputs(overrides={"users": 1e8}))["memories"] == 2e10
    with pytest.raises(ValueError, match="no such constant"):
        cm.load_inputs(overrides={"userz": 1.0})
    raw = json.loads(cm.CONSTANTS.read_text())
    raw["constants"]["k"]["kind"] = "guessed"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="kind"):
        cm.load_inputs(bad)


def test_docs_scaling_tables_are_the_scripts_output(tmp_path: Path) -> None:
    markdown = cm.render_markdown(cm.compute(cm.load_inputs()))
    doc = (BENCHMARKS.parent / "docs" / "scaling.md").read_text()
    assert cm.doc_block(doc) == markdown, "docs/scaling.md drifted: run benchmarks/cost_model.py --write-doc"
    # --write-doc and --json round-trip
    copy = tmp_path / "scaling.md"
    copy.write_text(doc.replace("| `k` |", "| `kk` |"))
    cm.main(["--write-doc", str(copy), "--json", str(tmp_path / "cost.json")])
    assert copy.read_text() == doc
    assert json.loads((tmp_path / "cost.json").read_text())["simulation"]["memories"] == 2e9
