"""KV assembly from each store tier versus the prefill of the query alone, on SmolLM2 (bf16 by default).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/kv_assembly.py [--dtype bfloat16] [--repeats 5] [--ks 5 10 20 50 100]

For each k and each tier (host, disk, and device when CUDA is present) it times, as the median of the repeats:

- load: ``store.get`` of k facts served by that tier (checked with the store's per-tier hit counters);
- assemble: :func:`inferscale.kv.assemble` of those facts after the engine's cached system prefix;
- TTFT(kv): load + ``engine.generate_kv(query, facts, max_new_tokens=0)`` (assembly, cache, query prefill);
- the ratios of load + assemble and of TTFT(kv) to the prefill of the query alone (no memories).

Per k it also reports the batched encoding throughput (facts/s, :class:`FactEncoder` through
``engine.encode_facts``) and TTFT of prompt injection (the same fact tokens prefilled). The disk tier is read
through a fresh store object each repeat, so every fact comes from its file; the files were just written, so the
OS page cache is warm (cold-cache reads are not measured).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

from inferscale.config import EngineConfig, MemoryConfig
from inferscale.engines.transformers import TransformersEngine
from inferscale.kv import EncodeRequest, FactKV, KVKey, KVStore, assemble

PEOPLE = ["Daniel", "Clara", "Raj", "Ines", "Tomas", "Leila", "Marco", "Yuki", "Ana", "Pedro"]
THINGS = ["jazz records", "sourdough bread", "trail running", "old maps", "green tea", "board games"]
QUERY = "Who collects old maps?"
ENCODING_KEY = "w=0;prefix=system;v1"
T = TypeVar("T")


def synthetic_facts(n: int) -> list[str]:
    """``n`` distinct short facts (about 20 tokens each)."""
    return [
        f"{PEOPLE[i % len(PEOPLE)]} started collecting {THINGS[(i // len(PEOPLE)) % len(THINGS)]} on day {i + 1} "
        "of the project, and shares them often."
        for i in range(n)
    ]


def timed_ms(fn: Callable[[], T], device: torch.device) -> tuple[float, T]:
    """(wall time of ``fn()`` in ms, its result), synchronising CUDA before and after."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) * 1000.0, out


def median_ms(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median wall time of ``repeats`` calls of ``fn`` (ms)."""
    return statistics.median(timed_ms(fn, device)[0] for _ in range(repeats))


def load_all(store: KVStore, keys: list[KVKey]) -> list[FactKV]:
    """Every key's K/V from ``store``, in order.

    Raises:
        KeyError: when a key is missing (the benchmark stored every one).
    """
    facts = []
    for key in keys:
        fact = store.get(key)
        if fact is None:
            raise KeyError(f"{key} is not in the store")
        facts.append(fact)
    return facts


def tier_stores(directory: Path, device: torch.device) -> dict[str, Callable[[], KVStore]]:
    """A factory per tier: the store whose lookups the tier answers (a fresh one per call for disk)."""
    host = KVStore(directory, device=device, device_budget_bytes=0)
    stores: dict[str, Callable[[], KVStore]] = {
        "host": lambda: host,
        "disk": lambda: KVStore(directory, device=device, device_budget_bytes=0),
    }
    if device.type == "cuda":
        gpu = KVStore(directory, device=device, device_budget_bytes=8 << 30)
        stores["device"] = lambda: gpu
    return stores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ks", type=int, nargs="+", default=[5, 10, 20, 50, 100])
    parser.add_argument("--encode-batch-size", type=int, default=16)
    args = parser.parse_args()

    t0 = time.perf_counter()
    engine = TransformersEngine(
        EngineConfig(dtype=args.dtype), MemoryConfig().system_prompt, encode_batch_size=args.encode_batch_size
    ).load()
    device = engine.device
    print(
        f"SmolLM2 {args.dtype} on {device}, torch threads={torch.get_num_threads()}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, loaded in {time.perf_counter() - t0:.1f} s"
    )

    texts = synthetic_facts(max(args.ks))
    prefix_ids = engine.system_prefix_ids()
    requests = [EncodeRequest(fact_ids=engine.fact_token_ids(t), context_ids=prefix_ids) for t in texts]
    keys = [
        KVKey(f"bench-{i}", hashlib.sha256(t.encode()).hexdigest(), engine.fingerprint, ENCODING_KEY)
        for i, t in enumerate(texts)
    ]

    directory = Path(tempfile.mkdtemp(prefix="inferscale-kv-bench-"))
    try:
        writer = KVStore(directory, device=device, device_budget_bytes=0)
        for key, fact in zip(keys, engine.encode_facts(requests), strict=True):
            writer.put(key, fact)
        stores = tier_stores(directory, device)
        for make in stores.values():  # fill the memory tiers (and warm every path once)
            store = make()
            for key in keys:
                store.get(key)
        engine.generate_kv(QUERY, [], max_new_tokens=0)
        engine.generate_prompt(QUERY, [requests[0].fact_ids], max_new_tokens=0)

        query_ms = statistics.median(
            engine.generate_kv(QUERY, [], max_new_tokens=0).prefill_ms for _ in range(args.repeats)
        )
        print(f"prefill of the query alone (system prefix cached): {query_ms:.1f} ms (median of {args.repeats})")

        per_k: dict[int, dict[str, float]] = {}
        rows: list[tuple[int, str, int, float, float, float]] = []
        for k in args.ks:
            subset = requests[:k]
            encode_ms = median_ms(lambda s=subset: engine.encode_facts(s), device, max(1, args.repeats // 2))
            prompt_ms = statistics.median(
                engine.generate_prompt(QUERY, [r.fact_ids for r in subset], max_new_tokens=0).prefill_ms
                for _ in range(args.repeats)
            )
            per_k[k] = {"facts_per_s": k / (encode_ms / 1000.0), "prompt_ttft": prompt_ms}
            for tier, make in stores.items():
                loads, assembles, ttfts, tokens = [], [], [], 0
                for _ in range(args.repeats):
                    store = make()
                    store.reset_stats()
                    load_ms, facts = timed_ms(lambda st=store, wanted=keys[:k]: load_all(st, wanted), device)
                    if store.stats().hits[tier] != k:
                        raise RuntimeError(f"expected {k} hits from the {tier} tier, got {store.stats()}")
                    asm_ms, assembled = timed_ms(
                        lambda f=facts: assemble(engine.prefix_kv, f, engine.rope_table), device
                    )
                    tokens = assembled.memory_tokens
                    gen = engine.generate_kv(QUERY, facts, max_new_tokens=0)
                    loads.append(load_ms)
                    assembles.append(asm_ms)
                    ttfts.append(load_ms + gen.total_ms)
                rows.append(
                    (k, tier, tokens, statistics.median(loads), statistics.median(assembles), statistics.median(ttfts))
                )
    finally:
        shutil.rmtree(directory, ignore_errors=True)

    print(f"\n{'k':>4} {'mem tok':>7} | {'encode facts/s':>14} | {'TTFT prompt ms':>14}")
    for k in args.ks:
        print(
            f"{k:>4} {next(r[2] for r in rows if r[0] == k):>7} | {per_k[k]['facts_per_s']:>14.1f} | "
            f"{per_k[k]['prompt_ttft']:>14.1f}"
        )
    header = (
        f"\n{'k':>4} {'tier':>6} | {'load ms':>8} {'assemble':>8} {'load+asm':>8} | {'TTFT kv':>8} | "
        f"{'(load+asm)/query':>16} {'TTFT kv/query':>13}"
    )
    print(header)
    for k, tier, _tokens, load_ms, asm_ms, ttft_ms in rows:
        print(
            f"{k:>4} {tier:>6} | {load_ms:>8.2f} {asm_ms:>8.2f} {load_ms + asm_ms:>8.2f} | {ttft_ms:>8.1f} | "
            f"{(load_ms + asm_ms) / query_ms:>16.3f} {ttft_ms / query_ms:>13.3f}"
        )

    ks = sorted(args.ks)
    if 5 in ks and 50 in ks:
        print("\nissue 3 'done when' checks, per tier:")
        for tier in stores:
            cell = {k: (load + asm, ttft) for k, t, _, load, asm, ttft in rows if t == tier}
            print(
                f"  {tier:>6}: assembly(k=50) / TTFT prompt(k=5) = {cell[50][0] / per_k[5]['prompt_ttft']:.3f} "
                f"(<= 0.15);  TTFT kv(k=50) / TTFT kv(k=5) = {cell[50][1] / cell[5][1]:.3f} (<= 1.25)"
            )


if __name__ == "__main__":
    main()
