"""Scoped search at 10k, 100k and 1M memories: cost against the total number of memories.

    .venv/bin/python benchmarks/scale.py --out out/scale.json --plot out/scale.png
    .venv/bin/python benchmarks/scale.py --totals 10000,100000 --users 1000,10000 --no-approximate   # quicker

For each total (each in a fresh Python process, so its resident memory is its own):

- **data**: ``total`` synthetic memories spread uniformly over ``users`` users, written in random user order (a
  user's rows lie spread over the table, as when users write in turn). Their vectors are random unit 384-d vectors
  around 512 random topic centres (cosine about 0.5 within a topic, like sentence embeddings); a query is a stored
  vector of the user mixed with noise (cosine about 0.8 to it). Rows are inserted in bulk with SQLAlchemy core into
  the real schema (a SQLite file made by ``MemoryStore``): inserting a million through ``client.add`` would take
  hours with the embedder and is not what is measured. The vectors go through ``VectorIndex.add`` with the rows'
  text hashes as labels and are saved where the client looks for its index.
- **scoped search, end to end**: ``MemoryClient.search(query, user_id=..., limit=10)`` of a random user, with an
  embedder that returns the query's precomputed vector (so no model time is counted): the SQL scope read, the
  label check, the index search and the records' read. Also each part alone: the SQL scope read
  (``MemoryStore.versions``), the index's exact per-scope path, and the previous path (a flat FAISS scan of every
  vector restricted by an ``IDSelectorBatch``, on FAISS's default threads) on the same vectors, and that scan on
  one thread (:mod:`inferscale.retrieval.threads`).
- **approximate path** (``--no-approximate`` skips it): the IVF build time, and recall@10 and latency of unscoped
  searches and of searches in a large scope (10% of the users) against the exact flat scan.
- **add**: ``client.add(infer=False)`` with K/V encoding off. Background encoding (issue #16, item 1) is not merged:
  ``add_background_p50_ms`` / ``add_background_p95_ms`` stay ``null``.
- resident memory (``VmRSS``, peak ``VmHWM``) and build times.

Then a real-text sample (``--real-n`` LoCoMo observations, one user per conversation) through the real embedder
(all-MiniLM-L6-v2): add through the client, and search end to end with LoCoMo questions, embedding included. The
fact K/V bytes per memory in bf16 are computed from these texts' SmolLM2-135M token counts and the model's shape
(2 x layers x KV heads x head dim x 2 bytes per token).

Timings are wall times on a shared machine: the JSON records ``os.getloadavg()`` before and after each part.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from sqlalchemy import insert

from inferscale import MemoryClient
from inferscale.bench.common import write_json
from inferscale.config import KVConfig, MemoryConfig
from inferscale.retrieval import VectorIndex, index_file
from inferscale.retrieval.embedder import embedder_identity
from inferscale.retrieval.threads import one_thread
from inferscale.scope import Scope
from inferscale.storage import MemoryStore
from inferscale.storage.models import MemoryRow

DIM = 384
TOPICS = 512
LOCOMO = Path("/work/shared/data/locomo/locomo10.json")
TARGET_P95_MS = 20.0
TARGET_P50_GROWTH = 2.0


# ---------------------------------------------------------------------------------------------------- helpers


def unit(x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` scaled to L2 norm 1 (float32)."""
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def clustered(rng: np.random.Generator, n: int, chunk: int = 100_000) -> np.ndarray:
    """float32 ``[n, DIM]`` unit vectors around :data:`TOPICS` random centres."""
    centres = unit(rng.standard_normal((TOPICS, DIM), dtype=np.float32))
    out = np.empty((n, DIM), dtype=np.float32)
    for start in range(0, n, chunk):
        end = min(n, start + chunk)
        noise = unit(rng.standard_normal((end - start, DIM), dtype=np.float32))
        out[start:end] = unit(0.7 * centres[rng.integers(0, TOPICS, end - start)] + 0.7 * noise)
    return out


def near(rng: np.random.Generator, vectors: np.ndarray) -> np.ndarray:
    """Queries near ``vectors`` (float32 ``[q, DIM]``): cosine about 0.8 to each."""
    return unit(0.8 * vectors + 0.6 * unit(rng.standard_normal(vectors.shape, dtype=np.float32)))


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(wall time of ``fn()`` in ms, its result)."""
    start = time.perf_counter()
    out = fn()
    return (time.perf_counter() - start) * 1e3, out


def percentiles(ms: Sequence[float]) -> dict[str, float]:
    """p50, p95 and the largest of ``ms``, rounded to µs."""
    return {
        "p50_ms": round(float(np.percentile(ms, 50)), 3),
        "p95_ms": round(float(np.percentile(ms, 95)), 3),
        "max_ms": round(float(np.max(ms)), 3),
    }


def memory_kb() -> dict[str, int]:
    """This process's resident memory now (``VmRSS``) and at its peak (``VmHWM``), in KiB (Linux)."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0])
    return {"rss_mib": fields.get("VmRSS", 0) // 1024, "peak_rss_mib": fields.get("VmHWM", 0) // 1024}


def load() -> list[float]:
    """The 1, 5 and 15-minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]


def recall_at(got: list[list[int]], want: list[list[int]]) -> float:
    """Mean share of each reference list found in the matching result list."""
    return float(np.mean([len(set(g) & set(w)) / max(1, len(w)) for g, w in zip(got, want, strict=True)]))


class QueryEmbedder:
    """An embedder that returns registered vectors for known texts (queries) and a text-seeded random unit vector
    for any other text (the benchmark's adds), so no model time is measured."""

    def __init__(self) -> None:
        self.known: dict[str, np.ndarray] = {}

    @property
    def dim(self) -> int:
        return DIM

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        rows = []
        for text in texts:
            vector = self.known.get(text)
            if vector is None:
                seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
                vector = unit(np.random.default_rng(seed).standard_normal(DIM, dtype=np.float32))
            rows.append(vector)
        return np.stack(rows) if rows else np.zeros((0, DIM), dtype=np.float32)


def fill_database(url: str, user_of: np.ndarray, batch: int = 20_000) -> list[str]:
    """Insert one row per entry of ``user_of`` (user numbers) into the real schema, in bulk (SQLAlchemy core);
    returns the rows' text hashes, in ``pk`` order (1, 2, ...)."""
    store = MemoryStore(url)
    now = datetime.now(UTC)
    hashes: list[str] = []
    with store.engine.begin() as conn:
        for start in range(0, len(user_of), batch):
            rows = []
            for i in range(start, min(len(user_of), start + batch)):
                text = f"memory {i}: user {user_of[i]} noted fact number {i} about topic {i % 97}"
                digest = hashlib.sha256(text.encode()).hexdigest()
                hashes.append(digest)
                rows.append(
                    {
                        "id": str(uuid.UUID(int=i + 1, version=4)),
                        "text": text,
                        "hash": digest,
                        "user_id": f"user-{user_of[i]}",
                        "metadata_": {},
                        "context": [],
                        "created_at": now,
                        "updated_at": now,
                    }
                )
            conn.execute(insert(MemoryRow), rows)
    store.close()
    return hashes


# ---------------------------------------------------------------------------------------------------- one total


def measure_total(total: int, users: int, queries: int, approximate: bool, seed: int = 0) -> dict[str, Any]:
    """Every figure of one total (see the module doc)."""
    rng = np.random.default_rng(seed)
    report: dict[str, Any] = {"total": total, "users": users, "load_before": load()}
    folder = Path(tempfile.mkdtemp(prefix="inferscale-scale-"))
    url = f"sqlite:///{folder / 'memory.db'}"
    index_path = folder / "memory.faiss"

    ms, vectors = timed(lambda: clustered(rng, total))
    report["generate_ms"] = round(ms)
    user_of = rng.integers(0, users, total)
    ms, hashes = timed(lambda: fill_database(url, user_of))
    report["sql_insert_ms"] = round(ms)
    ids = np.arange(1, total + 1, dtype=np.int64)

    # The vectors stand for QueryEmbedder's (the client's embedder below): the index says so, or the client would
    # check a sample against that embedder, find other vectors and embed every memory again.
    index = VectorIndex(DIM, index_path, embedder=embedder_identity(QueryEmbedder()))
    start = time.perf_counter()
    index.add(ids, vectors, labels=hashes)
    report["index_build_ms"] = round((time.perf_counter() - start) * 1e3, 1)
    ms, _ = timed(index.save)
    report["index_save_ms"] = round(ms)
    report["index_file_mib"] = index_path.stat().st_size >> 20
    report["vectors_mib_per_copy"] = (total * DIM * 4) >> 20
    picked = rng.choice(total, queries, replace=False)  # one stored memory per query, of a random user
    query_vectors = near(rng, vectors[picked])
    unscoped_queries = near(rng, vectors[rng.choice(total, 50, replace=False)])
    del index, vectors, hashes  # what remains is the client's own (and the benchmark's small arrays)
    report["memory_after_build"] = memory_kb()

    embedder = QueryEmbedder()
    for j, vector in enumerate(query_vectors):
        embedder.known[f"query {j}"] = vector
    config = MemoryConfig(
        db_url=url, index_path=str(index_path), data_dir=str(folder), kv=KVConfig(encode_on_add=False)
    )
    client = MemoryClient(config, embedder=embedder)
    ms, _ = timed(lambda: client.search("query 0", user_id=f"user-{user_of[picked[0]]}", limit=10))
    report["first_search_ms"] = round(ms)  # opens the index file and reconciles it with SQL
    report["memory_after_open"] = memory_kb()

    scope_sizes, end_to_end, sql, exact = [], [], [], []
    index = client.derived.open_index()
    for j, row in enumerate(picked):
        user = f"user-{user_of[row]}"
        ms, hits = timed(lambda user=user, j=j: client.search(f"query {j}", user_id=user, limit=10))
        end_to_end.append(ms)
        assert hits["results"] and all(h["user_id"] == user for h in hits["results"])
        ms, versions = timed(lambda user=user: client.db.versions(Scope(user_id=user)))
        sql.append(ms)
        scope_sizes.append(len(versions))
        ms, _ = timed(lambda j=j, v=versions: index.search(query_vectors[j], 10, allowed_ids=v.vector_ids))
        exact.append(ms)
    report["scope_size_mean"] = round(float(np.mean(scope_sizes)), 1)
    report["scoped_search_end_to_end"] = percentiles(end_to_end)
    report["scoped_sql_scope_read"] = percentiles(sql)
    report["scoped_index_exact_path"] = percentiles(exact)

    flat = faiss.deserialize_index(index_file.read(index_path).index)  # the exact store, read again
    previous, scanned = [], []
    for j, row in enumerate(picked[: min(queries, 100)]):
        allowed = client.db.versions(Scope(user_id=f"user-{user_of[row]}")).vector_ids
        previous.append(timed(lambda j=j, a=allowed: flat_search(flat, query_vectors[j], a))[0])
        with one_thread():
            scanned.append(timed(lambda j=j, a=allowed: flat_search(flat, query_vectors[j], a))[0])
    report["scoped_index_previous_path"] = percentiles(previous)
    report["scoped_index_flat_scan_one_thread"] = percentiles(scanned)

    adds = []
    for j in range(30):
        user = f"user-{user_of[picked[j]]}"
        ms, _ = timed(lambda j=j, user=user: client.add(f"a new fact {j} for {user}", user_id=user, infer=False))
        adds.append(ms)
    report["add_no_kv_encoding"] = percentiles(adds)
    report["add_background_p50_ms"] = None  # background K/V encoding (issue #16 item 1) is not merged
    report["add_background_p95_ms"] = None

    if approximate:
        report["approximate"] = measure_approximate(index, flat, unscoped_queries, user_of)
    client.close()
    report["memory_at_end"] = memory_kb()
    report["load_after"] = load()
    for path in sorted(folder.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    folder.rmdir()
    return report


def flat_search(flat: faiss.IndexIDMap2, query: np.ndarray, allowed: np.ndarray | None) -> list[int]:
    """The previous search path (as ``VectorIndex.search`` ran before per-scope search): a FAISS flat scan of every
    vector, restricted to ``allowed`` (int64 ``[m]``) by an ``IDSelectorBatch``; the top-10 ids."""
    if allowed is None:
        _, found = flat.search(query[None, :], 10)
    else:
        params = faiss.SearchParameters()
        selector = faiss.IDSelectorBatch(allowed)
        params.sel = selector
        _, found = flat.search(query[None, :], 10, params=params)
    return [int(i) for i in found[0] if i >= 0]


def measure_approximate(
    index: VectorIndex, flat: faiss.IndexIDMap2, queries: np.ndarray, user_of: np.ndarray
) -> dict[str, Any]:
    """IVF build time; recall@10 and latency of unscoped and large-scope searches against the exact flat scan."""
    out: dict[str, Any] = {}
    before = memory_kb()["rss_mib"]
    ms, _ = timed(index.build_approximate)
    out["build_ms"] = round(ms)
    out["nlist"] = index.approximate_lists
    out["nprobe"] = index.search_config.ivf_nprobe
    out["rss_added_mib"] = memory_kb()["rss_mib"] - before
    large_users = np.unique(user_of)[::10]
    large = np.flatnonzero(np.isin(user_of, large_users)).astype(np.int64) + 1  # a 10% scope (e.g. an agent's)
    out["large_scope_size"] = int(large.size)
    for name, allowed in (("unscoped", None), ("large_scope", large)):
        got, want, fast, slow = [], [], [], []
        for query in queries:
            ms, hits = timed(lambda q=query, a=allowed: index.search(q, 10, allowed_ids=a))
            fast.append(ms)
            got.append([i for i, _ in hits])
            with one_thread():
                ms, exact = timed(lambda q=query, a=allowed: flat_search(flat, q, a))
            slow.append(ms)
            want.append(exact)
        out[name] = {"recall_at_10": round(recall_at(got, want), 4), "approximate": percentiles(fast)}
        out[name]["exact_scan_one_thread"] = percentiles(slow)
    return out


# ---------------------------------------------------------------------------------------------------- real text


def real_text(n: int, queries: int, seed: int = 0) -> dict[str, Any]:
    """LoCoMo observations through the real embedder and the client; fact K/V bytes per memory (bf16)."""
    from transformers import AutoConfig, AutoTokenizer

    from inferscale.models.defaults import default_llm_path
    from inferscale.retrieval import SentenceTransformerEmbedder

    data = json.loads(LOCOMO.read_text(encoding="utf-8"))
    facts = [
        (conv["sample_id"], fact)
        for conv in data
        for session in conv["observation"].values()
        for speaker_facts in session.values()
        for fact, _ in speaker_facts
    ]
    rng = np.random.default_rng(seed)
    facts = [facts[i] for i in sorted(rng.choice(len(facts), min(n, len(facts)), replace=False))]
    questions = [(conv["sample_id"], qa["question"]) for conv in data for qa in conv["qa"]]
    questions = [questions[i] for i in rng.choice(len(questions), queries, replace=False)]
    report: dict[str, Any] = {"memories": len(facts), "users": len({u for u, _ in facts}), "load_before": load()}

    embedder = SentenceTransformerEmbedder()
    with tempfile.TemporaryDirectory(prefix="inferscale-scale-text-") as folder:
        config = MemoryConfig(data_dir=folder, kv=KVConfig(encode_on_add=False))
        with MemoryClient(config, embedder=embedder) as client:
            embedder.embed(["warm up"])
            adds = [timed(lambda u=u, f=f: client.add(f, user_id=u, infer=False))[0] for u, f in facts]
            report["add_no_kv_encoding"] = percentiles(adds)
            searches, embeds = [], []
            for user, question in questions:
                ms, _ = timed(lambda u=user, q=question: client.search(q, user_id=u, limit=10))
                searches.append(ms)
                embeds.append(timed(lambda q=question: embedder.embed([q]))[0])
            report["scoped_search_end_to_end"] = percentiles(searches)
            report["query_embedding"] = percentiles(embeds)

    model = default_llm_path()
    shape = AutoConfig.from_pretrained(model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokens = [len(tokenizer(f, add_special_tokens=False)["input_ids"]) for _, f in facts]
    per_token = 2 * shape.num_hidden_layers * shape.num_key_value_heads * shape.head_dim * 2  # K and V, bf16
    report["kv"] = {
        "model": "SmolLM2-135M-Instruct",
        "bytes_per_token_bf16": per_token,
        "fact_tokens_mean": round(float(np.mean(tokens)), 1),
        "bytes_per_memory_bf16": round(float(np.mean(tokens)) * per_token),
    }
    report["load_after"] = load()
    return report


# ---------------------------------------------------------------------------------------------------- driver


def plot(results: list[dict[str, Any]], path: Path) -> None:
    """Search cost (p50 and p95) and resident memory against the total number of memories."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    totals = [r["total"] for r in results]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    series = [
        ("scoped_search_end_to_end", "scoped search, client end to end"),
        ("scoped_sql_scope_read", "SQL scope read"),
        ("scoped_index_exact_path", "index: exact per-scope path"),
        ("scoped_index_previous_path", "index: previous path (flat scan, IDSelectorBatch)"),
        ("scoped_index_flat_scan_one_thread", "index: flat scan, one thread"),
    ]
    for key, label in series:
        (line,) = left.plot(totals, [r[key]["p50_ms"] for r in results], marker="o", label=f"{label} (p50)")
        left.plot(totals, [r[key]["p95_ms"] for r in results], marker="x", ls="--", color=line.get_color())
    left.axhline(TARGET_P95_MS, color="grey", lw=0.8, ls=":", label=f"target p95 {TARGET_P95_MS:g} ms")
    left.set(xscale="log", yscale="log", xlabel="total memories", ylabel="ms (solid p50, dashed p95)")
    left.set_title("Scoped search of one user")
    left.legend(fontsize=7)
    right.plot(totals, [r["memory_after_open"]["rss_mib"] for r in results], marker="o", label="RSS after open")
    right.plot(totals, [r["index_build_ms"] / 1e3 for r in results], marker="s", label="index build (s)")
    if all("approximate" in r for r in results):
        right.plot(totals, [r["approximate"]["build_ms"] / 1e3 for r in results], marker="^", label="IVF build (s)")
    right.set(xscale="log", yscale="log", xlabel="total memories", title="Memory (MiB) and build time (s)")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--totals", default="10000,100000,1000000", help="total memories, comma-separated")
    parser.add_argument("--users", default="1000,10000,10000", help="users for each total, comma-separated")
    parser.add_argument("--queries", type=int, default=300, help="scoped searches per total")
    parser.add_argument("--no-approximate", action="store_true", help="skip the IVF build and recall")
    parser.add_argument("--real-n", type=int, default=1000, help="LoCoMo observations embedded for real (0: skip)")
    parser.add_argument("--out", type=Path, default=Path("out/scale.json"))
    parser.add_argument("--plot", type=Path, default=Path("out/scale.png"))
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure one "total:users" and print JSON
    args = parser.parse_args(argv)
    if args.one:
        total, users = (int(x) for x in args.one.split(":"))
        print(json.dumps(measure_total(total, users, args.queries, not args.no_approximate)))
        return 0
    totals = [int(x) for x in args.totals.split(",")]
    users = [int(x) for x in args.users.split(",")]
    if len(users) != len(totals):
        parser.error("--users needs one number per total")
    results = []
    for total, count in zip(totals, users, strict=True):
        command = [sys.executable, __file__, "--one", f"{total}:{count}", "--queries", str(args.queries)]
        command += ["--no-approximate"] if args.no_approximate else []
        done = subprocess.run(command, check=True, capture_output=True, text=True)
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        row = results[-1]
        print(
            f"{total:>9,} memories / {count:,} users: scoped search p50 {row['scoped_search_end_to_end']['p50_ms']} "
            f"ms, p95 {row['scoped_search_end_to_end']['p95_ms']} ms (load {row['load_after']})",
            flush=True,
        )
    document: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "load_at_start": load()}, "totals": results}
    first, last = results[0], results[-1]
    document["done_when"] = {
        "p95_ms_at_largest": last["scoped_search_end_to_end"]["p95_ms"],
        "p95_target_ms": TARGET_P95_MS,
        "p50_growth_first_to_largest": round(
            last["scoped_search_end_to_end"]["p50_ms"] / first["scoped_search_end_to_end"]["p50_ms"], 2
        ),
        "p50_growth_target": TARGET_P50_GROWTH,
    }
    if args.real_n > 0:
        document["real_text"] = real_text(args.real_n, queries=100)
    write_json(args.out, document)
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    plot(results, args.plot)
    print(json.dumps(document["done_when"]))
    print(f"wrote {args.out} and {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
