"""Search latency beside long model calls, in one run: what a server's search waits for while chats generate.

One in-process :class:`AsyncMemoryClient` (the object ``inferscale serve`` serves) holds ``--memories`` synthetic
facts of one user, their K/V prepared. Then, on one event loop:

- **idle**: ``--searches`` ``search(query, limit=5)`` calls, one after another;
- **beside chats**: the same searches while ``--chats`` tasks each run ``chat(question, limit=k,
  max_new_tokens=--tokens)`` back to back, as concurrent users of one server would. The searches start once every
  chat task has begun its first chat.

Latency is the wall clock per search (ms). A search embeds its query and scans the index (milliseconds); before
model work had threads of its own, it queued on the loop's default executor behind the generating chats.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/search_beside_chats.py --out out/search_beside_chats.json

Prints p50/p95 of both phases and their ratio; ``--out`` writes them as JSON with the machine's description.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from inferscale import AsyncMemoryClient
from inferscale.bench.common import machine_info, percentile, synthetic_facts, write_json

USER = "bench-user"
QUESTION = "Where did my friend Clara take up jazz records?"


def summary(samples: list[float]) -> dict[str, float]:
    """p50, p95 and mean of ``samples`` (ms)."""
    return {"p50_ms": percentile(samples, 50), "p95_ms": percentile(samples, 95), "mean_ms": statistics.fmean(samples)}


async def search_latencies(client: AsyncMemoryClient, searches: int) -> list[float]:
    """``searches`` searches one after another; ms each."""
    latencies = []
    for _ in range(searches):
        t0 = time.perf_counter()
        await client.search(QUESTION, user_id=USER, limit=5)
        latencies.append((time.perf_counter() - t0) * 1000.0)
    return latencies


async def measure(args: argparse.Namespace, data_dir: str) -> dict[str, Any]:
    """Both phases of the module docstring on one client."""
    async with AsyncMemoryClient({"data_dir": data_dir, "engine": {"dtype": args.dtype}}) as client:
        facts = synthetic_facts(args.memories)
        await client.add([{"role": "user", "content": f} for f in facts], user_id=USER, infer=False)
        await client.prepare_kv(user_id=USER)
        await client.chat(QUESTION, user_id=USER, limit=args.k, max_new_tokens=args.tokens)  # warm-up
        await search_latencies(client, 3)
        idle = await search_latencies(client, args.searches)

        stop = asyncio.Event()
        started = 0
        chats_done = 0

        async def chat_loop() -> None:
            nonlocal started, chats_done
            started += 1
            while not stop.is_set():
                await client.chat(QUESTION, user_id=USER, limit=args.k, max_new_tokens=args.tokens)
                chats_done += 1

        chatting = [asyncio.ensure_future(chat_loop()) for _ in range(args.chats)]
        while started < args.chats:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # every chat has asked for its thread
        t0, done_before = time.perf_counter(), chats_done
        busy = await search_latencies(client, args.searches)
        window_s, done_during = time.perf_counter() - t0, chats_done - done_before
        stop.set()
        await asyncio.gather(*chatting)
    return {
        "idle": summary(idle),
        "beside_chats": summary(busy),
        "p50_ratio": percentile(busy, 50) / percentile(idle, 50),
        "chats_completed_during_searches": done_during,
        "search_window_s": window_s,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement of the module docstring, in one run."""
    with tempfile.TemporaryDirectory(prefix="search-beside-chats-") as data_dir:
        result = asyncio.run(measure(args, data_dir))
    settings = {name: str(value) if isinstance(value, Path) else value for name, value in vars(args).items()}
    return {"machine": machine_info(), "args": settings, **result}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--memories", type=int, default=100, help="facts stored before measuring (default 100)")
    parser.add_argument("--searches", type=int, default=20, help="searches per phase (default 20)")
    parser.add_argument("--chats", type=int, default=8, help="concurrent chat tasks (default 8)")
    parser.add_argument("--tokens", type=int, default=32, help="max_new_tokens per chat (default 32)")
    parser.add_argument("--k", type=int, default=5, help="memories injected per chat (default 5)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    result = run(args)
    for phase in ("idle", "beside_chats"):
        row = result[phase]
        print(f"search {phase:>12}: p50 {row['p50_ms']:8.1f} ms   p95 {row['p95_ms']:8.1f} ms")
    print(f"p50 beside chats / idle: {result['p50_ratio']:.1f}x ({result['chats_completed_during_searches']} chats)")
    if args.out is not None:
        write_json(args.out, result)


if __name__ == "__main__":
    main()
