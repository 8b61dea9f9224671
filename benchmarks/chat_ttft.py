"""TTFT of a three-turn conversation, KV injection versus prompt injection, on each engine, in one run.

For each engine (``transformers`` in process; ``vllm`` when it is installed: run this script from ``.venv-vllm``
to get both), one client stores ``--memories`` synthetic facts for one user, plus the three the conversation asks
about. Then, per repeat, for each k in ``--ks`` and each mode in turn (interleaved, so drift on a shared machine
hits every cell alike), it sends the conversation turn by turn as a growing ``messages`` list: turn t carries the
t user turns and the t-1 scripted assistant replies before it (the same text in both modes), retrieves the top k
memories for its last user message, and decodes one token. TTFT is ``ChatResult.timings.ttft_ms`` (wall-clock
from the call to the first token: retrieval, K/V load and assembly, prefill). vLLM's prefix cache is reset before
every call, so each turn is measured cold in both modes (a prompt-mode conversation could otherwise reuse the
blocks of memory tokens it prefilled in the previous turn).

    OMP_NUM_THREADS=1 VLLM_CPU_NUM_OF_RESERVED_CPU=1 HF_HUB_OFFLINE=1 \\
        .venv-vllm/bin/python benchmarks/chat_ttft.py --engines transformers,vllm --out out/chat_ttft.json

Prints one row per (engine, k, mode, turn) with the median and p95 over repeats, and the prompt/kv ratio per
(engine, k, turn); writes the same as JSON with the machine's description.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from inferscale import MemoryClient
from inferscale.bench.common import check_engine, machine_info, percentile, synthetic_facts, write_json

MEMORIES = ["My dog is a beagle named Biscuit.", "I live in Porto.", "My sister Clara is a teacher in Madrid."]
TURNS = [
    ("What is my dog's name?", "Your dog is called Biscuit."),
    ("Which city do I live in?", "You live in Porto."),
    ("What does my sister Clara do?", None),
]
USER = "bench-user"


def conversation(turn: int) -> list[dict[str, str]]:
    """The messages of turn ``turn`` (1-based): every earlier user turn with its scripted reply, then this turn."""
    messages: list[dict[str, str]] = []
    for question, reply in TURNS[: turn - 1]:
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": reply or ""}]
    messages.append({"role": "user", "content": TURNS[turn - 1][0]})
    return messages


def measure_engine(engine: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every (k, mode, turn) cell of one engine: TTFT samples (ms) and the prompt's token counts."""
    data_dir = tempfile.TemporaryDirectory(prefix=f"chat-ttft-{engine}-")
    client = MemoryClient({"data_dir": data_dir.name, "engine": {"provider": engine, "dtype": args.dtype}})
    cells: dict[str, dict[str, Any]] = {}
    try:
        t0 = time.perf_counter()
        client.add(
            [{"role": "user", "content": m} for m in MEMORIES + synthetic_facts(args.memories)],
            user_id=USER,
            infer=False,
        )
        client.wait_for_encoding()  # no background encoding beside the timed chats
        add_s = time.perf_counter() - t0
        for k in args.ks:  # warm-up: loads, encodes any missing K/V, fills the K/V store's host tier
            for mode in ("kv", "prompt"):
                client.chat(messages=conversation(3), user_id=USER, limit=k, mode=mode, max_new_tokens=1)
        for _ in range(args.repeats):
            for k in args.ks:
                for turn in range(1, len(TURNS) + 1):
                    for mode in ("kv", "prompt"):
                        client.engine.reset_prefix_cache()
                        result = client.chat(
                            messages=conversation(turn), user_id=USER, limit=k, mode=mode, max_new_tokens=1
                        )
                        cell = cells.setdefault(
                            f"{k}/{mode}/{turn}",
                            {"k": k, "mode": mode, "turn": turn, "ttft_ms": [], "prompt_tokens": result.prompt_tokens},
                        )
                        cell["ttft_ms"].append(result.timings.ttft_ms)
                        cell["memory_tokens"] = result.memory_tokens
    finally:
        client.close()
        data_dir.cleanup()
    for cell in cells.values():
        cell["median_ms"] = statistics.median(cell["ttft_ms"])
        cell["p95_ms"] = percentile(cell["ttft_ms"], 95)
    return {"engine": engine, "add_s": add_s, "cells": list(cells.values())}


def ratios(run: dict[str, Any]) -> list[dict[str, Any]]:
    """TTFT(prompt) / TTFT(kv) per (k, turn), from the medians."""
    by = {(c["k"], c["mode"], c["turn"]): c["median_ms"] for c in run["cells"]}
    return [
        {"k": k, "turn": turn, "prompt_over_kv": by[(k, "prompt", turn)] / by[(k, "kv", turn)]}
        for (k, mode, turn) in sorted(by)
        if mode == "kv"
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engines", default="transformers", help="comma-separated: transformers,vllm")
    parser.add_argument("--ks", default="5,20", help="memories injected per turn (comma-separated)")
    parser.add_argument("--memories", type=int, default=60, help="synthetic memories stored besides the three")
    parser.add_argument("--repeats", type=int, default=5, help="measurements per cell")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    args.ks = [int(k) for k in args.ks.split(",")]
    for engine in args.engines:
        check_engine(engine)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runs = [measure_engine(engine, args) for engine in args.engines]
    print(f"{'engine':12s} {'k':>3s} {'turn':>4s} {'mode':6s} {'prompt tok':>10s} {'median ms':>10s} {'p95 ms':>8s}")
    for run in runs:
        for c in sorted(run["cells"], key=lambda c: (c["k"], c["turn"], c["mode"])):
            print(
                f"{run['engine']:12s} {c['k']:3d} {c['turn']:4d} {c['mode']:6s} {c['prompt_tokens']:10d} "
                f"{c['median_ms']:10.1f} {c['p95_ms']:8.1f}"
            )
        for r in ratios(run):
            print(f"{run['engine']:12s} k={r['k']:<3d} turn {r['turn']}: prompt/kv TTFT = {r['prompt_over_kv']:.2f}x")
    document = {
        "machine": machine_info(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "runs": [{**run, "ratios": ratios(run)} for run in runs],
    }
    if args.out is not None:
        write_json(args.out, document)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
