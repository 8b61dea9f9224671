"""Fact encoding throughput against the model's plain prefill rate, measured side by side in one run.

Three timed jobs over the same ``--facts`` synthetic facts, in the engine's default dtype (``auto``), interleaved per
repeat so drift on a shared machine hits each alike:

- ``prefill``: one plain forward pass over the system prefix and every fact pasted as one prompt (what prompt
  injection prefills): its tokens/s is the model's plain prefill rate;
- ``encode (prefix cached)``: the engine's fact encoder, which prefills the system prefix once and encodes each fact
  on top of its cached K/V (the product's path);
- ``encode (prefix per fact)``: the same encoder without the cached prefix, which prefills the prefix again for
  every fact (the path before issue #16).

Facts are encoded with the prefix only (``kv.context_window`` 0): context turns are prefilled for their own fact and
are counted apart by ``--context-turns``, which puts that many synthetic turns before each fact.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/encode_throughput.py --facts 64 --repeats 5 --out out/encode.json

Prints facts/s, fact tokens/s and prefilled tokens/s per job (medians over repeats) and fact tokens/s as a share of
the plain prefill rate; writes the same as JSON with the machine's description.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from inferscale.bench.common import machine_info, synthetic_facts
from inferscale.config import EngineConfig
from inferscale.engines.hf.dtype import loaded_dtype
from inferscale.engines.transformers import TransformersEngine
from inferscale.kv.encode import EncodeRequest, FactEncoder

SYSTEM_PROMPT = "You are a helpful assistant. Answer the user's question using the memories below.\nMemories:\n"


def _timed(job: Any) -> float:
    start = time.perf_counter()
    job()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--facts", type=int, default=64, help="facts encoded per repeat (default 64)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats after one warm-up (default 5)")
    parser.add_argument("--context-turns", type=int, default=0, help="synthetic turns before each fact (default 0)")
    parser.add_argument("--dtype", default="auto", help="model dtype (default auto)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args()

    engine = TransformersEngine(EngineConfig(dtype=args.dtype, device="cpu"), SYSTEM_PROMPT).load()
    model, prefix = engine.model, engine.system_prefix_ids()
    facts = [engine.fact_token_ids(text) for text in synthetic_facts(args.facts)]
    turns = engine.context_token_ids(synthetic_facts(args.context_turns)) if args.context_turns else []
    requests = [EncodeRequest(fact, [*prefix, *turns]) for fact in facts]
    fact_tokens = sum(len(f) for f in facts)
    pasted = torch.tensor([[*prefix, *(t for f in facts for t in f)]], dtype=torch.long)
    pad = engine.tokenizer.pad_token_id or 0
    cached = FactEncoder(model, pad_token_id=pad)
    cached.cache_prefix(prefix)
    uncached = FactEncoder(model, pad_token_id=pad)

    def prefill() -> None:
        with torch.inference_mode():
            model(input_ids=pasted, use_cache=False)

    jobs = {
        "prefill": (prefill, pasted.shape[1]),
        "encode (prefix cached)": (lambda: cached.encode(requests), None),
        "encode (prefix per fact)": (lambda: uncached.encode(requests), None),
    }
    seconds: dict[str, list[float]] = {name: [] for name in jobs}
    prefilled: dict[str, int] = {}
    for repeat in range(args.repeats + 1):
        for name, (job, tokens) in jobs.items():
            encoder = cached if "cached" in name else uncached if "per fact" in name else None
            before = encoder.tokens_prefilled if encoder is not None else 0
            elapsed = _timed(job)
            prefilled[name] = tokens if encoder is None else encoder.tokens_prefilled - before
            if repeat:  # the first round warms up kernels and allocations
                seconds[name].append(elapsed)

    rows: dict[str, dict[str, float]] = {}
    for name, samples in seconds.items():
        median = statistics.median(samples)
        rows[name] = {
            "median_s": median,
            "prefilled_tokens": prefilled[name],
            "prefilled_tokens_per_s": prefilled[name] / median,
        }
        if name != "prefill":
            rows[name] |= {"facts_per_s": len(facts) / median, "fact_tokens_per_s": fact_tokens / median}
    plain_rate = rows["prefill"]["prefilled_tokens_per_s"]
    for name, row in rows.items():
        if name != "prefill":
            row["fact_tokens_share_of_prefill_rate"] = row["fact_tokens_per_s"] / plain_rate
    report = {
        "settings": vars(args) | {"out": str(args.out) if args.out else None},
        "model_dtype": loaded_dtype(model),
        "facts": len(facts),
        "fact_tokens": fact_tokens,
        "prefix_tokens": len(prefix),
        "context_tokens_per_fact": len(turns),
        "machine": machine_info(),
        "jobs": rows,
    }
    print(
        f"{len(facts)} facts, {fact_tokens} fact tokens, prefix {len(prefix)} tokens, context {len(turns)} tokens "
        f"per fact; {report['model_dtype']} on {report['machine']['processor']} ({report['machine']['cpu_isa']})"
    )
    for name, row in rows.items():
        extra = ""
        if name != "prefill":
            extra = (
                f"  {row['facts_per_s']:.1f} facts/s, {row['fact_tokens_per_s']:.0f} fact tok/s = "
                f"{row['fact_tokens_share_of_prefill_rate']:.2f} of the plain prefill rate"
            )
        print(
            f"{name:26s} {row['median_s'] * 1000:8.1f} ms  {row['prefilled_tokens_per_s']:7.0f} prefilled tok/s{extra}"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
