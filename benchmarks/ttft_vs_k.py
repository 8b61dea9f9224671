"""TTFT versus k, prompt injection vs KV injection vs the query alone, measured side by side in one run.

    .venv/bin/python benchmarks/ttft_vs_k.py [--dtype bfloat16] [--repeats 5] [--ks 0 5 10 20 30 50]

Memories: the user turns of the bundled demo conversation plus generated facts, so that k=50 has 50 distinct
memories. Every (k, mode) cell retrieves the same memories; TTFT is measured inside ``MemoryClient.chat``
(retrieval + KV load/assembly + prefill to the first token). Prints median and p95 in ms and the ratios.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from inferscale import MemoryClient, MemoryConfig
from inferscale.config import EngineConfig

PEOPLE = ["Daniel", "Clara", "Raj", "Ines", "Tomas", "Leila", "Marco", "Yuki", "Ana", "Pedro"]
THINGS = ["jazz records", "sourdough bread", "trail running", "old maps", "green tea", "board games"]


def synthetic_facts(n: int) -> list[str]:
    """``n`` distinct short facts about people, things and dates."""
    facts = []
    for i in range(n):
        person, thing = PEOPLE[i % len(PEOPLE)], THINGS[(i // len(PEOPLE)) % len(THINGS)]
        facts.append(f"{person} started collecting {thing} on day {i + 1} of the project, and shares them often.")
    return facts


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ks", type=int, nargs="+", default=[0, 5, 10, 20, 30, 50])
    args = parser.parse_args()

    client = MemoryClient(
        MemoryConfig(data_dir=tempfile.mkdtemp(prefix="inferscale-bench-"), engine=EngineConfig(dtype=args.dtype))
    )
    t0 = time.perf_counter()
    facts = synthetic_facts(max(args.ks))
    client.add([{"role": "user", "content": f} for f in facts], user_id="bench", infer=False)
    print(f"added and encoded {len(facts)} memories in {time.perf_counter() - t0:.1f} s ({args.dtype})")
    query = "Who collects old maps?"
    for _ in range(2):  # warm-up of both paths
        client.chat(query, user_id="bench", limit=5, mode="kv", max_new_tokens=1)
        client.chat(query, user_id="bench", limit=5, mode="prompt", max_new_tokens=1)

    header = f"{'k':>3} {'mem tok':>7} | {'prompt p50':>10} {'p95':>7} | {'kv p50':>7} {'p95':>7} {'assembly':>8}"
    print(header + " | speedup")
    for k in args.ks:
        cells: dict[str, list[float]] = {"kv": [], "prompt": [], "assembly": []}
        tokens = 0
        for _ in range(args.repeats):
            for mode in ("prompt", "kv"):
                r = client.chat(query, user_id="bench", limit=k, mode=mode, max_new_tokens=1)  # type: ignore[arg-type]
                cells[mode].append(r.timings.ttft_ms)
                tokens = r.memory_tokens
                if mode == "kv":
                    cells["assembly"].append(r.timings.kv_assembly_ms)
        p50 = {m: statistics.median(v) for m, v in cells.items()}
        print(
            f"{k:>3} {tokens:>7} | {p50['prompt']:>10.1f} {percentile(cells['prompt'], 0.95):>7.1f} | "
            f"{p50['kv']:>7.1f} {percentile(cells['kv'], 0.95):>7.1f} {p50['assembly']:>8.1f} | "
            f"{p50['prompt'] / p50['kv']:>5.2f}x"
        )
    client.close()


if __name__ == "__main__":
    main()
