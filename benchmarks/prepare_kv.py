"""What ``prepare_kv`` saves the first chats after a settings change, side by side in one run.

The bundled demo conversation (``inferscale demo``'s: 20 messages, one ``add(infer=False)`` per session) is stored
and encoded once under the default settings. The data dir is then copied twice and both copies are opened with a
changed setting (``--storage-format``, default ``int8``: every stored K/V becomes a miss, as after a change of
model, dtype or ``kv`` settings):

- *cold*: the demo's questions are chatted at once, so each chat encodes the misses it retrieves on its path;
- *prepared*: ``prepare_kv()`` runs first (timed), then the same chats.

Both copies share one engine and embedder (loaded and warmed before anything is timed), and the questions alternate
between them (cold first, then prepared, question by question), so drift on a shared machine hits both alike.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/prepare_kv.py --max-new-tokens 8 --out out/prepare_kv.json

Prints per question the TTFT (ms) cold and prepared, their medians and ratio, and prepare_kv's wall time and
report; writes the same as JSON with the machine (CPU, ISA, dtype).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from inferscale import MemoryClient, MemoryConfig
from inferscale.bench.common import machine_info, write_json
from inferscale.config import KVConfig
from inferscale.demo import DemoScript, bundled_script
from inferscale.engines.hf.dtype import loaded_dtype
from inferscale.formats import StorageFormat


def _store(script: DemoScript, data_dir: Path) -> MemoryClient:
    """A client on ``data_dir`` holding the script's sessions, every K/V encoded (default settings)."""
    client = MemoryClient(MemoryConfig(data_dir=str(data_dir), kv=KVConfig(encode_on_add="eager")))
    for _, messages in script.sessions:
        client.add(messages, user_id=script.user_id, infer=False)
    return client


def measure(script: DemoScript, work: Path, storage_format: StorageFormat, max_new_tokens: int) -> dict[str, Any]:
    """TTFTs (ms) of the script's questions on a cold and a prepared copy of one data dir, and prepare_kv's time."""
    first = _store(script, work / "stored")
    engine, embedder = first.engine, first.embedder
    first.chat(script.questions[0].question, user_id=script.user_id, max_new_tokens=1)  # warm-up, default settings
    first.close()
    clients = {}
    for name in ("cold", "prepared"):
        shutil.copytree(work / "stored", work / name)
        config = MemoryConfig(data_dir=str(work / name), kv=KVConfig(storage_format=storage_format))
        clients[name] = MemoryClient(config, engine=engine, embedder=embedder)
        clients[name].search("warm-up", user_id=script.user_id)  # opens the database and the index
    t0 = time.perf_counter()
    report = clients["prepared"].prepare_kv()
    prepare_s = time.perf_counter() - t0
    ttft: dict[str, list[float]] = {"cold": [], "prepared": []}
    for question in script.questions:
        for name in ("cold", "prepared"):
            result = clients[name].chat(question.question, user_id=script.user_id, max_new_tokens=max_new_tokens)
            ttft[name].append(result.timings.ttft_ms)
    for client in clients.values():
        client.close()
    cold, prepared = statistics.median(ttft["cold"]), statistics.median(ttft["prepared"])
    return {
        "storage_format": storage_format,
        "questions": [q.question for q in script.questions],
        "ttft_ms": ttft,
        "median_ttft_ms": {"cold": cold, "prepared": prepared},
        "cold_over_prepared": cold / prepared,
        "prepare_kv": {"seconds": prepare_s, "memories": report.memories, "encoded": report.encoded},
        "dtype": loaded_dtype(engine.model),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--storage-format", default="int8", choices=["float8_e4m3", "int8"])
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="inferscale-prepare-kv-") as tmp:
        result = measure(bundled_script(), Path(tmp), args.storage_format, args.max_new_tokens)
    result["machine"] = machine_info()
    for question, cold, prepared in zip(
        result["questions"], result["ttft_ms"]["cold"], result["ttft_ms"]["prepared"], strict=True
    ):
        print(f"{cold:8.1f} ms cold  {prepared:8.1f} ms prepared  {question}")
    median = result["median_ttft_ms"]
    print(
        f"median TTFT: cold {median['cold']:.1f} ms, prepared {median['prepared']:.1f} ms "
        f"({result['cold_over_prepared']:.2f}x); prepare_kv: {result['prepare_kv']['encoded']} of "
        f"{result['prepare_kv']['memories']} memories in {result['prepare_kv']['seconds']:.1f} s "
        f"({result['dtype']})"
    )
    if args.out:
        write_json(args.out, result)


if __name__ == "__main__":
    main()
