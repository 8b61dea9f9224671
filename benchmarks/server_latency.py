"""The server's cost, in one run: add and search latency through ``inferscale serve`` at 1 and N concurrent remote
clients on loopback, and chat TTFT through the server against the same chat in process.

It starts ``inferscale serve --engine transformers`` as a child process on a free loopback port, on a fresh data
directory, with one admin key (so every request is authenticated as in production), and stores ``--memories``
synthetic facts for one user through the server. Then:

- **add / search**: for each concurrency c in ``--concurrency``, c async remote clients each send ``--calls``
  ``add(text, infer=False)`` calls back to back, a fresh fact each time; once every add has returned, each sends
  ``--calls`` ``search(query, limit=5)`` calls. Latency is the client-side wall clock per call (ms), over every call
  of every client. The same calls from one in-process :class:`MemoryClient` give the baseline without HTTP;
- **chat TTFT**: ``--repeats`` times, interleaved, the same streamed question with ``limit=k``, through the server
  and in process on a local :class:`MemoryClient` holding the same ``--memories`` facts (plus the adds each side
  measured, so the server holds more rows; both inject k memories): the wall clock from calling
  ``chat(stream=True)`` to the first answer text, measured the same way on both sides. Each stream is read to its
  end before the other side starts, so neither process computes while the other is measured.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/server_latency.py --out out/server_latency.json

Prints p50/p95 per (call, concurrency) and the TTFT medians with their ratio; ``--out`` writes them as JSON with
the machine's description.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from inferscale import AsyncMemoryClient, MemoryClient
from inferscale.bench.common import machine_info, percentile, synthetic_facts, write_json
from inferscale.remote.health import wait_until_healthy

USER = "bench-user"
QUESTION = "Where did my friend Clara take up jazz records?"
STARTUP_TIMEOUT_S = 300.0
"""How long the server may take to answer /health (seconds): it loads the models first."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def create_admin_key(data_dir: str) -> str:
    """An admin key in the data directory's key store, made with the CLI as an operator would."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "inferscale.cli",
            "keys",
            "create",
            "bench",
            "--admin",
            "--data-dir",
            data_dir,
            "--json",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return str(json.loads(out.stdout)["key"])


@contextmanager
def running_server(data_dir: str, dtype: str) -> Iterator[str]:
    """``inferscale serve`` on a free loopback port, until the block ends; yields its base URL."""
    port = free_port()
    command = [sys.executable, "-m", "inferscale.cli", "serve", "--engine", "transformers"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--data-dir", data_dir, "--dtype", dtype]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(base_url, process=server, timeout_s=STARTUP_TIMEOUT_S, interval_s=0.25)
        yield base_url
    finally:
        server.terminate()
        server.wait(timeout=60)


async def call_latencies(host: str, api_key: str, concurrency: int, calls: int, offset: int) -> dict[str, list[float]]:
    """``calls`` adds from each of ``concurrency`` remote clients at once, then ``calls`` searches from each; ms per
    call."""
    clients = [AsyncMemoryClient(host=host, api_key=api_key) for _ in range(concurrency)]
    facts = synthetic_facts(offset + concurrency * calls)[offset:]
    latencies: dict[str, list[float]] = {"add": [], "search": []}

    async def adds(index: int, client: Any) -> None:
        for j in range(calls):
            t0 = time.perf_counter()
            await client.add(facts[index * calls + j], user_id=USER, infer=False)
            latencies["add"].append((time.perf_counter() - t0) * 1000.0)

    async def searches(client: Any) -> None:
        for _ in range(calls):
            t0 = time.perf_counter()
            await client.search(QUESTION, user_id=USER, limit=5)
            latencies["search"].append((time.perf_counter() - t0) * 1000.0)

    try:  # two phases, so that no search waits behind another client's add
        await asyncio.gather(*(adds(i, c) for i, c in enumerate(clients)))
        await asyncio.gather(*(searches(c) for c in clients))
    finally:
        for client in clients:
            await client.close()
    return latencies


def local_call_latencies(local: MemoryClient, calls: int, offset: int) -> dict[str, list[float]]:
    """The same adds and searches as one remote client, on the in-process client; ms per call."""
    facts = synthetic_facts(offset + calls)[offset:]
    latencies: dict[str, list[float]] = {"add": [], "search": []}
    for fact in facts:
        t0 = time.perf_counter()
        local.add(fact, user_id=USER, infer=False)
        latencies["add"].append((time.perf_counter() - t0) * 1000.0)
    for _ in range(calls):
        t0 = time.perf_counter()
        local.search(QUESTION, user_id=USER, limit=5)
        latencies["search"].append((time.perf_counter() - t0) * 1000.0)
    return latencies


def ttft_ms(client: Any, k: int) -> float:
    """Wall clock from calling ``chat(stream=True)`` to its first answer text (ms), the same on either client.

    The stream is read to its end before returning, so the side measured next finds the other one idle.
    """
    t0 = time.perf_counter()
    first: float | None = None
    for chunk in client.chat(QUESTION, user_id=USER, limit=k, stream=True, max_new_tokens=8):
        if chunk.delta and first is None:
            first = (time.perf_counter() - t0) * 1000.0
    if first is None:
        raise RuntimeError("the streamed answer had no text")
    return first


def summary(samples: list[float]) -> dict[str, float]:
    """p50, p95 and mean of ``samples`` (ms)."""
    return {"p50_ms": percentile(samples, 50), "p95_ms": percentile(samples, 95), "mean_ms": statistics.fmean(samples)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement of the module docstring, in one run."""
    facts = synthetic_facts(args.memories)
    with (
        tempfile.TemporaryDirectory(prefix="server-bench-") as served_dir,
        tempfile.TemporaryDirectory(prefix="server-bench-local-") as local_dir,
    ):
        api_key = create_admin_key(served_dir)
        local = MemoryClient({"data_dir": local_dir, "engine": {"dtype": args.dtype}})
        with running_server(served_dir, args.dtype) as host:
            remote = MemoryClient(host=host, api_key=api_key)
            messages = [{"role": "user", "content": f} for f in facts]
            remote.add(messages, user_id=USER, infer=False)
            local.add(messages, user_id=USER, infer=False)
            calls: dict[str, Any] = {}
            offset = args.memories
            for concurrency in args.concurrency:
                samples = asyncio.run(call_latencies(host, api_key, concurrency, args.calls, offset))
                offset += concurrency * args.calls
                for name, values in samples.items():
                    row = {"call": name, "concurrency": concurrency, "in_process": False, **summary(values)}
                    calls[f"{name}@{concurrency}"] = row
            for name, values in local_call_latencies(local, args.calls, args.memories).items():
                calls[f"{name}@in-process"] = {"call": name, "concurrency": 1, "in_process": True, **summary(values)}
            for _ in range(2):  # warm-up: K/V encoded and loaded on both sides
                ttft_ms(remote, args.k)
                ttft_ms(local, args.k)
            served, in_process = [], []
            for _ in range(args.repeats):
                served.append(ttft_ms(remote, args.k))
                in_process.append(ttft_ms(local, args.k))
            remote.close()
        local.close()
    ttft = {"k": args.k, "server": summary(served), "in_process": summary(in_process)}
    ttft["server_over_in_process"] = ttft["server"]["p50_ms"] / ttft["in_process"]["p50_ms"]
    settings = {name: str(value) if isinstance(value, Path) else value for name, value in vars(args).items()}
    return {"machine": machine_info(), "args": settings, "calls": list(calls.values()), "chat_ttft": ttft}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--memories", type=int, default=100, help="facts stored before measuring (default 100)")
    parser.add_argument("--concurrency", default="1,16", help="concurrent clients, comma-separated (default 1,16)")
    parser.add_argument("--calls", type=int, default=10, help="adds and searches per client (default 10)")
    parser.add_argument("--k", type=int, default=10, help="memories injected per chat (default 10)")
    parser.add_argument("--repeats", type=int, default=10, help="chat TTFT samples per side (default 10)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    return args


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = parse_args(argv)
    result = run(args)
    print(f"{'call':8s} {'clients':>10s} {'p50 ms':>8s} {'p95 ms':>8s}")
    for row in result["calls"]:
        clients = "in process" if row["in_process"] else str(row["concurrency"])
        print(f"{row['call']:8s} {clients:>10s} {row['p50_ms']:8.1f} {row['p95_ms']:8.1f}")
    ttft = result["chat_ttft"]
    print(
        f"chat TTFT k={ttft['k']}: server p50 {ttft['server']['p50_ms']:.1f} ms, in process p50 "
        f"{ttft['in_process']['p50_ms']:.1f} ms, ratio {ttft['server_over_in_process']:.2f}"
    )
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
