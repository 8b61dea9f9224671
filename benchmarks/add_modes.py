"""``add(infer=False)`` latency under each ``kv.encode_on_add`` mode, on the default models (SmolLM2-135M-Instruct
in the engine's default dtype, MiniLM), in one run.

For each mode (``lazy``, ``eager``, ``background``; interleaved per repeat, each mode first in turn, so drift on a
shared machine hits each alike) a fresh user gets ``--facts`` synthetic facts, one ``add`` call each; the latency is
the wall clock of the call. In background mode the time the queue then takes to drain (``wait_for_encoding``) is
measured too, before the next mode runs. The models are loaded, and one fact encoded, before anything is timed.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/add_modes.py --facts 20 --repeats 3 --out out/add_modes.json

Prints p50 / p95 / mean (ms) per mode and the machine (CPU, ISA, load average before and after); writes the same
as JSON.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from inferscale import MemoryClient, MemoryConfig
from inferscale.bench.common import machine_info, synthetic_facts, write_json
from inferscale.config import EncodeMode, KVConfig
from inferscale.engines.hf.dtype import loaded_dtype

MODES: tuple[EncodeMode, ...] = ("lazy", "eager", "background")


def _summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "n": len(ordered),
        "p50_ms": statistics.median(ordered),
        "p95_ms": ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))],
        "mean_ms": statistics.fmean(ordered),
    }


def measure(facts: list[str], repeats: int, work: Path) -> dict[str, Any]:
    """Add latencies (ms) per mode over ``repeats`` rounds, and the background queue's drain times."""
    first = MemoryClient(MemoryConfig(data_dir=str(work / "warm-up")))
    first.add("I have a beagle named Biscuit.", user_id="warm-up", infer=False, encode_kv=True)  # loads both models
    engine, embedder = first.engine, first.embedder
    clients = {
        mode: MemoryClient(
            MemoryConfig(data_dir=str(work / mode), kv=KVConfig(encode_on_add=mode)), engine=engine, embedder=embedder
        )
        for mode in MODES
    }
    for client in clients.values():
        client.add("warm-up", user_id="warm-up", infer=False, encode_kv=True)  # opens its database and index
        client.wait_for_encoding()
    adds: dict[str, list[float]] = {mode: [] for mode in MODES}
    drains: list[float] = []
    for round_ in range(repeats):
        for mode in MODES[round_ % len(MODES) :] + MODES[: round_ % len(MODES)]:  # each mode first in turn
            client = clients[mode]
            user = f"{mode}-{round_}"
            for fact in facts:
                t0 = time.perf_counter()
                client.add(fact, user_id=user, infer=False)
                adds[mode].append((time.perf_counter() - t0) * 1000.0)
            if mode == "background":
                t0 = time.perf_counter()
                client.wait_for_encoding()
                drains.append((time.perf_counter() - t0) * 1000.0)
    for client in (*clients.values(), first):
        client.close()
    return {
        "dtype": loaded_dtype(engine.model),
        "add": {mode: _summary(samples) for mode, samples in adds.items()},
        "background_drain": _summary(drains),
        "samples_ms": {**adds, "background_drain": drains},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--facts", type=int, default=20, help="facts added per mode and repeat, one add call each")
    p.add_argument("--repeats", type=int, default=1, help="rounds over the three modes")
    p.add_argument("--out", help="JSON results path")
    args = p.parse_args(argv)
    before = machine_info()
    with tempfile.TemporaryDirectory(prefix="add-modes-") as work:
        result = measure(synthetic_facts(args.facts), args.repeats, Path(work))
    result["machine"] = before
    result["load_avg_1m_after"] = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None
    print(f"dtype {result['dtype']}; {before['processor']} ({before['cpu_isa']}), load {before.get('load_avg_1m')}")
    print(f"{'add(infer=False), ms':<32} {'p50':>8} {'p95':>8} {'mean':>8} {'n':>4}")
    rows = [(f"kv.encode_on_add={mode!r}", result["add"][mode]) for mode in MODES]
    rows.append(("background queue drain", result["background_drain"]))
    for name, row in rows:
        print(f"{name:<32} {row['p50_ms']:>8.1f} {row['p95_ms']:>8.1f} {row['mean_ms']:>8.1f} {row['n']:>4}")
    if args.out:
        write_json(Path(args.out), result)
    return result


if __name__ == "__main__":
    main()
