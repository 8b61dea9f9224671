"""This machine's constants for the cost model (``benchmarks/cost_model.py --measure``), each measured in seconds.

- prefill rate of SmolLM2-135M (the embedded model, no download) in float32 and bfloat16, and the FLOP rate it
  reaches (inferscale.bench.flops);
- host memory copy bandwidth (a 256 MiB torch copy);
- a cold sequential read of a 256 MiB file and the latency of a cold 4 KiB read (the file's pages dropped from the
  page cache with ``posix_fadvise(DONTNEED)`` after an fsync; a VM's host may still cache below that);
- the safetensors header of one KV store file (the store's own serialisation);
- FAISS: resident bytes per vector and file bytes per vector of the client's ``VectorIndex``, and its scoped search
  p50 (a 200-id scope) at 10k and 100k vectors;
- SQL bytes per memory (rows, history, a ``kv_entries`` row, indexes), on SQLite and, given a URL, PostgreSQL;
- LoCoMo's mean memory text (UTF-8 bytes, as ``inferscale eval locomo`` stores a turn) and fact-line tokens.

Timings on a shared machine drift: each is a median (or best, for bandwidths) of a few repeats.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from cost_model import Constant

MiB = 1 << 20
PREFILL_TOKENS = 128
SQL_MEMORIES = 2000


def _here(value: float, unit: str, source: str) -> Constant:
    return Constant(float(value), unit, "measured", source)


def _machine() -> str:
    from inferscale.bench.common import machine_info

    info = machine_info()
    return f"{info['processor']} ({info['cpu_isa']}), {info['torch_threads']} threads, load {info.get('load_avg_1m')}"


def measure_prefill() -> dict[str, Constant]:
    """Plain prefill of 128 tokens through SmolLM2-135M in each dtype (the best of 5 after a warm-up: on a shared
    machine the fastest run is the one least slowed by other jobs)."""
    import torch

    from inferscale.bench.flops import prefill_cost
    from inferscale.config import EngineConfig
    from inferscale.engines.hf.loading import load_causal_lm

    rates: dict[str, tuple[float, float]] = {}
    for dtype in ("float32", "bfloat16"):
        _, model, _ = load_causal_lm(EngineConfig(dtype=dtype, device="cpu"), None)
        ids = torch.randint(100, 40_000, (1, PREFILL_TOKENS))
        times = []
        with torch.inference_mode():
            for i in range(6):
                t0 = time.perf_counter()
                model(input_ids=ids, use_cache=False, logits_to_keep=1)
                if i:
                    times.append(time.perf_counter() - t0)
        seconds = min(times)
        rates[dtype] = (PREFILL_TOKENS / seconds, prefill_cost(model).flops(PREFILL_TOKENS, 0) / seconds)
        del model
    best = max(rates, key=lambda d: rates[d][0])
    where = f"SmolLM2-135M, {PREFILL_TOKENS}-token prefill, best of 5; {_machine()}"
    return {
        "cpu_prefill_tokens_per_s": _here(rates[best][0], "tokens/s", f"{where}; the faster dtype ({best})"),
        "cpu_prefill_flops_per_s": _here(rates[best][1], "FLOP/s", "the same forward's FLOPs (bench.flops) / time"),
        "cpu_prefill_tokens_per_s_float32": _here(rates["float32"][0], "tokens/s", f"{where}; float32"),
        "cpu_prefill_tokens_per_s_bfloat16": _here(rates["bfloat16"][0], "tokens/s", f"{where}; bfloat16"),
    }


def measure_host_copy() -> dict[str, Constant]:
    """Bytes/s of a 256 MiB tensor copy in host memory (best of 5)."""
    import torch

    src = torch.ones(256 * MiB, dtype=torch.uint8)
    dst = torch.empty_like(src)
    best = min(_timed(lambda: dst.copy_(src)) for _ in range(5))
    return {"host_copy_bytes_per_s": _here(256 * MiB / best, "B/s", "256 MiB torch copy_, best of 5")}


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _drop_cache(fd: int) -> None:
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def measure_disk(scratch: Path) -> dict[str, Constant]:
    """A cold sequential read of a 256 MiB file (4 MiB reads; median of 3) and the p50 latency of 200 cold random
    4 KiB reads, in ``scratch``."""
    scratch.mkdir(parents=True, exist_ok=True)
    size = 256 * MiB
    with tempfile.NamedTemporaryFile(dir=scratch, prefix="cost-model-disk-") as f:
        f.write(np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8).tobytes())
        f.flush()
        fd = f.fileno()
        buf = bytearray(4 * MiB)
        seq = []
        for _ in range(3):
            _drop_cache(fd)
            t0 = time.perf_counter()
            offset = 0
            while offset < size:
                offset += os.preadv(fd, [buf], offset)
            seq.append(time.perf_counter() - t0)
        _drop_cache(fd)
        rng = np.random.default_rng(1)
        lat = []
        for block in rng.integers(0, size // 4096, 200):
            t0 = time.perf_counter()
            os.pread(fd, 4096, int(block) * 4096)
            lat.append(time.perf_counter() - t0)
    how = "pages dropped by posix_fadvise(DONTNEED) after fsync"
    return {
        "disk_read_bytes_per_s": _here(size / statistics.median(seq), "B/s", f"cold 256 MiB read, median of 3; {how}"),
        "disk_read_latency_s": _here(statistics.median(lat), "s", f"cold 4 KiB random read, p50 of 200; {how}"),
    }


def measure_kv_header() -> dict[str, Constant]:
    """Bytes of a KV store file beyond its K/V and token ids (the safetensors header with the full key)."""
    import torch
    from safetensors.torch import save

    from inferscale.kv.fact import FactKV
    from inferscale.kv.fingerprint import encoding_key
    from inferscale.kv.tiers.base import KVKey
    from inferscale.kv.tiers.serialization import fact_to_payload

    keys = torch.zeros(30, 3, 25, 64, dtype=torch.bfloat16)
    fact = FactKV(keys, keys.clone(), torch.arange(25), encoded_at=37)
    key = KVKey(str(uuid.uuid4()), "a" * 64, "f" * 32, encoding_key("b" * 32, ["a turn"] * 5, 5, 0))
    data = save(*fact_to_payload(key, fact))
    header = len(data) - 2 * keys.numel() * 2 - 25 * 8
    return {"kv_file_header_bytes": _here(header, "B", "safetensors header of a KV store file (its own serialiser)")}


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure_faiss(scratch: Path) -> dict[str, Constant]:
    """``VectorIndex`` (IDMap2 over FlatIP, 384 dims, sha256 labels): resident and file bytes per vector at 100k
    vectors, and search p50 over 100 queries limited to a 200-id scope at 10k and 100k vectors."""
    from inferscale.retrieval.index import VectorIndex

    rng = np.random.default_rng(0)
    index = VectorIndex(384)
    before = _rss()
    p50: dict[int, float] = {}
    for n_from, n_to in ((0, 10_000), (10_000, 100_000)):
        for start in range(n_from, n_to, 10_000):
            v = rng.standard_normal((10_000, 384), dtype=np.float32)
            v /= np.linalg.norm(v, axis=1, keepdims=True)
            index.add(np.arange(start, start + 10_000), v, [f"{i:064x}" for i in range(start, start + 10_000)])
        query = rng.standard_normal(384, dtype=np.float32)
        times = []
        for _ in range(100):
            scope = rng.choice(n_to, 200, replace=False)
            times.append(_timed(lambda q=query, scope=scope: index.search(q, 10, allowed_ids=scope)))
        p50[n_to] = statistics.median(times)
    rss = (_rss() - before) / 100_000
    with tempfile.TemporaryDirectory(dir=scratch) as tmp:
        file = index.save(Path(tmp) / "index.faiss")
        on_disk = sum(p.stat().st_size for p in file.parent.iterdir()) / 100_000
    src = "VectorIndex, 384-dim random unit vectors"
    return {
        "faiss_bytes_per_vector_rss": _here(rss, "B", f"{src}: resident-set growth / 100k vectors"),
        "faiss_bytes_per_vector_file": _here(on_disk, "B", f"{src}: saved files / 100k vectors"),
        "search_p50_s_10k": _here(p50[10_000], "s", f"{src}: search in a 200-id scope, 10k vectors, p50 of 100"),
        "search_p50_s_100k": _here(p50[100_000], "s", f"{src}: search in a 200-id scope, 100k vectors, p50 of 100"),
    }


def locomo_texts(locomo: Path | None) -> list[tuple[str, list[str], dict[str, Any]]]:
    """(memory text, its last five context turns, metadata) for every LoCoMo turn as ``inferscale eval locomo``
    stores it (date prefix, captions); synthetic facts when ``locomo`` is None."""
    if locomo is None:
        from inferscale.bench.common import synthetic_facts

        facts = synthetic_facts(SQL_MEMORIES)
        return [(t, facts[max(0, i - 5) : i], {}) for i, t in enumerate(facts)]
    from inferscale.eval.locomo import date_label, load_locomo
    from inferscale.eval.locomo_eval import memory_text

    out = []
    for conv in load_locomo(locomo):
        for s in conv.sessions:
            texts = [memory_text(t, date_label(s.date_time)) for t in s.turns]
            for i, (turn, text) in enumerate(zip(s.turns, texts, strict=True)):
                meta = {
                    "session": s.index,
                    "session_date": s.date_time.isoformat(timespec="minutes"),
                    "dia_id": turn.dia_id,
                    "dia_ids": [turn.dia_id],
                    "speaker": turn.speaker,
                }
                out.append((text, texts[max(0, i - 5) : i], meta))
    return out


def measure_locomo(locomo: Path) -> dict[str, Constant]:
    """Mean UTF-8 bytes of a LoCoMo memory and mean SmolLM2 tokens of its fact line (``"- {text}\\n"``)."""
    from transformers import AutoTokenizer

    from inferscale.models import default_llm_path

    texts = [t for t, _, _ in locomo_texts(locomo)]
    tokenizer = AutoTokenizer.from_pretrained(default_llm_path())
    tokens = [len(tokenizer(f"- {t.strip()}\n", add_special_tokens=False)["input_ids"]) for t in texts]
    src = f"all {len(texts)} LoCoMo turns as `eval locomo` stores them (date, captions)"
    return {
        "locomo_text_bytes_mean": _here(statistics.mean(len(t.encode()) for t in texts), "B", f"{src}: mean UTF-8"),
        "locomo_fact_tokens_mean": _here(statistics.mean(tokens), "tokens", f"{src}: mean SmolLM2 fact-line tokens"),
    }


def _fill(url: str, rows: list[tuple[str, list[str], dict[str, Any]]]) -> None:
    from inferscale.scope import Scope
    from inferscale.storage.change_sets import ChangeSet, NewMemory
    from inferscale.storage.store import MemoryStore

    with MemoryStore(url) as store:
        for start in range(0, len(rows), 200):
            batch = rows[start : start + 200]
            adds = tuple(NewMemory(t, meta, tuple(ctx)) for t, ctx, meta in batch)
            scope = Scope(user_id=f"user-{start // 200}")
            added = store.apply(ChangeSet(scope, adds=adds, skip_duplicates=False)).added
            for m in added:
                location = f"/home/someone/.cache/inferscale/kv/{m.id}/{uuid.uuid4().hex}.safetensors"
                store.put_kv_entry(m.id, m.hash, "f" * 32, "v3;w=5;prefix=system;gap=0;" + "d" * 32, 25, 1, location)


def measure_sql(locomo: Path | None, pg_url: str | None, scratch: Path) -> dict[str, Constant]:
    """Bytes per memory of the memory store (memories, history, kv_entries, their indexes) after adding 2,000
    memories (LoCoMo turns with their metadata and five context turns, one KV entry each), on SQLite (file size) and,
    given ``pg_url``, PostgreSQL (``pg_total_relation_size`` of a fresh schema's tables)."""
    from sqlalchemy import create_engine, text

    rows = locomo_texts(locomo)[:SQL_MEMORIES]
    what = f"{len(rows)} {'LoCoMo turns' if locomo else 'synthetic facts'}, 5 context turns, 1 kv_entries row each"
    out = {}
    with tempfile.TemporaryDirectory(dir=scratch) as tmp:
        _fill(f"sqlite:///{tmp}/memory.db", rows)
        size = sum(p.stat().st_size for p in Path(tmp).iterdir())
        out["sql_bytes_per_memory_sqlite"] = _here(size / len(rows), "B", f"SQLite file / memories ({what})")
    if pg_url:
        schema = f"cost_model_{uuid.uuid4().hex[:12]}"
        admin = create_engine(pg_url)
        with admin.begin() as conn:
            conn.execute(text(f'create schema "{schema}"'))
        try:
            _fill(f"{pg_url}?options=-csearch_path%3D{schema}", rows)
            with admin.begin() as conn:
                size = conn.execute(
                    text(
                        "select sum(pg_total_relation_size(c.oid)) from pg_class c join pg_namespace n "
                        "on n.oid = c.relnamespace where n.nspname = :s and c.relkind = 'r'"
                    ),
                    {"s": schema},
                ).scalar_one()
        finally:
            with admin.begin() as conn:
                conn.execute(text(f'drop schema "{schema}" cascade'))
            admin.dispose()
        src = f"PostgreSQL pg_total_relation_size (tables, TOAST, indexes) / memories ({what})"
        out["sql_bytes_per_memory_postgresql"] = _here(int(size) / len(rows), "B", src)
    return out


def measure_all(locomo: Path | None, pg_url: str | None, scratch: Path) -> dict[str, Constant]:
    """Every measured constant (the LoCoMo and PostgreSQL ones only when their inputs are given)."""
    scratch.mkdir(parents=True, exist_ok=True)
    out: dict[str, Constant] = {}
    for step in (
        measure_host_copy,
        lambda: measure_disk(scratch),
        measure_kv_header,
        lambda: measure_faiss(scratch),
        lambda: measure_sql(locomo, pg_url, scratch),
        measure_prefill,
    ):
        found = step()
        out.update(found)
        for name, c in found.items():
            print(f"measured {name} = {c.value:.6g} {c.unit}")
    if locomo is not None:
        out.update(measure_locomo(locomo))
    return out
