"""What 8-bit K/V at rest costs: bytes per memory, first-token KL and greedy answers against model-dtype K/V.

For each dtype, the chat model (SmolLM2-135M-Instruct, embedded, unless ``--model``) answers the LoCoMo slice
(conversation ``--conversation``, its first ``--questions`` questions of categories 1-4, top ``-k`` memories by the
sentence embedder) and the bundled demo's questions, through ``inferscale eval fidelity``'s runner
(:func:`inferscale.eval.fidelity.run_fidelity`) with a K/V reference: every case is answered with its memories' K/V
in the model's dtype (the reference) and stored in each 8-bit format (quantised once after encoding, dequantised by
the engine's assembly, as ``kv.storage_format`` serves them), under the default ``KVConfig`` otherwise (w = 5
context turns, the default remedies). Per format and slice it reports:

- bytes per memory: the mean safetensors file of the slice's facts (as the KV store writes it: header, token ids
  and scales included) and the in-memory size the tier budgets count, with the ratio to the model dtype;
- first-token KL(model-dtype K/V ‖ 8-bit K/V) in nats (mean, median, max) and top-1 agreement;
- greedy answers (``--max-new-tokens``): the share identical to the reference's, token F1 against the reference's,
  and F1 of both against the gold answer. Only the first ``--answer-questions`` LoCoMo questions are answered (all
  by default); the first-token figures cover every question.

The same figures for a control (``--no-control`` leaves it out): the model-dtype K/V of each fact encoded in a
forward pass of its own instead of batched, as the product may encode it (``FidelitySetting.encode_alone``), which
changes only the kernels' rounding. It is the noise floor the product already accepts; in bfloat16 that rounding
moves K/V by about 0.6% of their norm, more than int8 storage does.

Each fact is encoded once per dtype (twice with the control) and quantised once per format.

    OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/kv_quantization.py \\
        --locomo ../shared/data/locomo/locomo10.json --dtypes bfloat16,float32 --out out/kv_quantization.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inferscale.bench.common import machine_info, write_json

FORMATS = ("float8_e4m3", "int8")
CONTROL = "control"


def file_bytes(fact: Any, fmt: str) -> int:
    """Size of the safetensors file the KV store's disk tier writes for ``fact`` stored as ``fmt`` (bytes)."""
    from safetensors.torch import save

    from inferscale.kv import KVKey
    from inferscale.kv.fingerprint import encoding_key
    from inferscale.kv.tiers.serialization import fact_to_payload

    key = KVKey("m" * 36, "h" * 64, "f" * 32, encoding_key("p" * 64, ["turn"], 5, 0, fmt))
    tensors, metadata = fact_to_payload(key, fact.quantized(fmt))
    return len(save(tensors, metadata))


def sizes(facts: Sequence[Any], formats: Sequence[str]) -> dict[str, dict[str, float]]:
    """Mean file and in-memory bytes per fact for the model dtype and each format, with the ratio to the model's."""
    out: dict[str, dict[str, float]] = {}
    for fmt in ("model", *formats):
        disk = statistics.fmean(file_bytes(f, fmt) for f in facts)
        memory = statistics.fmean(f.quantized(fmt).nbytes for f in facts)
        out[fmt] = {"file_bytes": disk, "memory_bytes": memory}
    for fmt in out:
        out[fmt]["file_ratio"] = out["model"]["file_bytes"] / out[fmt]["file_bytes"]
        out[fmt]["memory_ratio"] = out["model"]["memory_bytes"] / out[fmt]["memory_bytes"]
    out["model"]["tokens_per_fact"] = statistics.fmean(f.n_tokens for f in facts)
    return out


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """First-token and answer figures of one (format, slice) group of rows."""
    from inferscale.eval.metrics import token_f1

    kls = [r["kl"] for r in rows]
    answered = [r for r in rows if "kv_answer" in r]
    gold = [r for r in answered if r.get("gold")]
    out: dict[str, Any] = {
        "n": len(rows),
        "kl_mean": statistics.fmean(kls),
        "kl_median": statistics.median(kls),
        "kl_max": max(kls),
        "top1_agreement": statistics.fmean(float(r["top1_agree"]) for r in rows),
        "n_answered": len(answered),
    }
    if answered:
        out["answers_identical"] = statistics.fmean(float(r["kv_answer"] == r["prompt_answer"]) for r in answered)
        out["f1_vs_reference"] = statistics.fmean(token_f1(r["kv_answer"], r["prompt_answer"]) for r in answered)
    if gold:
        out["f1_gold"] = statistics.fmean(token_f1(r["kv_answer"], r["gold"]) for r in gold)
        out["f1_gold_reference"] = statistics.fmean(token_f1(r["prompt_answer"], r["gold"]) for r in gold)
    return out


def measure_dtype(dtype: str, slices: list[Any], args: argparse.Namespace) -> dict[str, Any]:
    """Every figure for one model dtype."""
    from inferscale.config import EngineConfig, KVConfig
    from inferscale.engines.hf import load_causal_lm
    from inferscale.engines.transformers import TransformersEngine
    from inferscale.eval.fidelity import SYSTEM_PROMPTS, FactCache, FidelitySetting, run_fidelity
    from inferscale.eval.fidelity_cases import FidelitySlice

    config = EngineConfig(model=args.model, dtype=dtype, device="cpu")
    _, model, tokenizer = load_causal_lm(config, None)
    engines = {"default": TransformersEngine(config, SYSTEM_PROMPTS["default"], model=model, tokenizer=tokenizer)}
    reference = FidelitySetting.from_kv(KVConfig(), name="model")
    settings = [reference.model_copy(update={"storage_format": fmt, "name": fmt}) for fmt in args.formats]
    if not args.no_control:
        settings.append(reference.model_copy(update={"encode_alone": True, "name": CONTROL}))
    caches: dict[str, FactCache] = {}
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for part in slices:
        n = len(part.cases) if part.name == "demo" or args.answer_questions is None else args.answer_questions
        for cases, generate in ((part.cases[:n], True), (part.cases[n:], False)):
            if cases:
                rows += run_fidelity(
                    engines,
                    [FidelitySlice(part.name, cases)],
                    settings,
                    max_new_tokens=args.max_new_tokens,
                    generate=generate,
                    progress=lambda line: print(f"  {dtype} {line}", flush=True),
                    reference=reference,
                    caches=caches,
                )
    wall_s = time.perf_counter() - t0
    results: dict[str, Any] = {}
    for part in [*(s.name for s in slices), "all"]:
        group = [r for r in rows if part in ("all", r["slice"])]
        results[part] = {s.label: summary([r for r in group if r["setting"] == s.label]) for s in settings}
    facts = caches["default"].encoded()
    return {"dtype": dtype, "wall_s": round(wall_s, 1), "sizes": sizes(facts, args.formats), "results": results}


def print_tables(runs: Sequence[dict[str, Any]]) -> None:
    """One table of sizes and one of fidelity per dtype."""
    for run in runs:
        print(f"\n{run['dtype']}: bytes per memory ({run['sizes']['model']['tokens_per_fact']:.1f} tokens per fact)")
        print(f"{'format':12s} {'file B':>10s} {'x smaller':>9s} {'memory B':>10s} {'x smaller':>9s}")
        for fmt, s in run["sizes"].items():
            print(
                f"{fmt:12s} {s['file_bytes']:10.0f} {s['file_ratio']:9.2f} {s['memory_bytes']:10.0f} "
                f"{s['memory_ratio']:9.2f}"
            )
        print(f"\n{run['dtype']}: 8-bit K/V against {run['dtype']} K/V (KL in nats; answers greedy)")
        header = f"{'slice':10s} {'format':12s} {'n':>3s} {'KL mean':>9s} {'KL med':>9s} {'KL max':>9s} {'top1':>5s}"
        print(header + f" {'answered':>8s} {'identical':>9s} {'F1 ref':>6s} {'F1 gold':>7s} {'ref gold':>8s}")
        for part, by_format in run["results"].items():
            for fmt, r in by_format.items():
                print(
                    f"{part:10s} {fmt:12s} {r['n']:3d} {r['kl_mean']:9.5f} {r['kl_median']:9.5f} {r['kl_max']:9.5f} "
                    f"{r['top1_agreement']:5.2f} {r['n_answered']:8d} {r.get('answers_identical', float('nan')):9.2f} "
                    f"{r.get('f1_vs_reference', float('nan')):6.3f} {r.get('f1_gold', float('nan')):7.3f} "
                    f"{r.get('f1_gold_reference', float('nan')):8.3f}"
                )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--locomo", type=Path, help="a LoCoMo file (e.g. ../shared/data/locomo/locomo10.json)")
    parser.add_argument("--conversation", default="conv-26", help="LoCoMo sample id (default conv-26)")
    parser.add_argument("--questions", type=int, default=40, help="LoCoMo questions of categories 1-4 (default 40)")
    parser.add_argument(
        "--answer-questions", type=int, default=None, help="LoCoMo questions also answered (default: all)"
    )
    parser.add_argument("-k", type=int, default=10, help="memories per question (default 10)")
    parser.add_argument("--no-demo", action="store_true", help="leave out the bundled demo's questions")
    parser.add_argument("--dtypes", default="bfloat16", help="comma-separated model dtypes (default bfloat16)")
    parser.add_argument("--formats", default=",".join(FORMATS), help="comma-separated 8-bit formats")
    parser.add_argument("--no-control", action="store_true", help="leave out the control (K/V encoded alone)")
    parser.add_argument("--model", default=None, help="a model folder (default: the embedded SmolLM2-135M)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="answer budget in tokens (default 32)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default torch's)")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    args.formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    if args.locomo is None and args.no_demo:
        parser.error("nothing to run: give --locomo and/or leave the demo in")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from inferscale.eval.fidelity_cases import demo_cases, locomo_cases
    from inferscale.retrieval.embedder import SentenceTransformerEmbedder

    if args.threads:
        torch.set_num_threads(args.threads)
    embedder = SentenceTransformerEmbedder(None, "cpu")
    # each memory's context within its own session, as the runs behind docs/architecture.md's 8-bit tables measured
    slices = [] if args.no_demo else [demo_cases(args.k, embedder, across_sessions=False)]
    if args.locomo is not None:
        slices.append(
            locomo_cases(args.locomo, args.conversation, args.questions, args.k, embedder, across_sessions=False)
        )
    runs = [measure_dtype(dtype, slices, args) for dtype in args.dtypes]
    print_tables(runs)
    document = {
        "machine": machine_info(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "runs": runs,
    }
    if args.out is not None:
        write_json(args.out, document)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
