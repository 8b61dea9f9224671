"""``inferscale bench ttft``: time to first token versus k, every injection path side by side in one run.

For each k in ``settings.ks`` the same query retrieves the same top-k memories, and each repeat measures, in
turn (interleaved, so that drift on a shared machine hits every cell alike):

- ``prompt``: the k facts' tokens pasted into the prompt and prefilled (the Mem0-style baseline, same engine);
- ``kv:<tier>``: KV injection with the facts' K/V served from one KV store tier. ``device``/``host``: the entries
  are resident in that memory tier (``host`` on CPU; on CUDA they are first demoted from the device tier to the
  host tier). ``disk``: the memory tiers are emptied before the call, so every fact is read from its safetensors
  file (warm in the OS page cache after the first repeat). A tier the store does not have is skipped, and the
  tier that actually answered each lookup is recorded from the store's hit counters (``served``);
- ``query``: the query alone (k = 0, nothing retrieved), the lower bound.

TTFT is :attr:`inferscale.types.Timings.ttft_ms` of ``MemoryClient.chat`` (retrieval + KV load and assembly +
prefill to the first token), in ms; the median and p95 over repeats are reported with the assembly and prefill
parts. Outputs: a rich table, ``ttft_vs_k.json`` and ``ttft_vs_k.png`` in ``settings.out_dir``, and the ratios
of the [kv] issue: assembly(kv, k_max) / TTFT(prompt, 5), TTFT(kv, k_max) / TTFT(kv, 5) and
TTFT(kv, k_max) / TTFT(query alone); next to them, the KV-mode query prefill's FLOP ratio between the same two
k (:mod:`inferscale.bench.flops`), the growth of the prefill part of TTFT wherever it is compute-bound.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferscale.bench.common import check_engine, machine_info, percentile, synthetic_facts
from inferscale.bench.kv_tiers import available_tiers, hit_delta, hits, make_resident, stage
from inferscale.bench.settings import DEFAULT_KS, DEFAULT_QUERY, TTFTSettings
from inferscale.bench.ttft_report import TIER_ORDER, TTFTCell, TTFTReport, compute_ratios, print_report, write_outputs
from inferscale.errors import ConfigError

if TYPE_CHECKING:
    from rich.console import Console

    from inferscale.client import MemoryClient
    from inferscale.engines.base import Engine
    from inferscale.retrieval import Embedder
    from inferscale.types import ChatMode

__all__ = [
    "DEFAULT_KS",
    "DEFAULT_QUERY",
    "TTFTCell",
    "TTFTReport",
    "TTFTSettings",
    "available_tiers",
    "compute_ratios",
    "percentile",
    "print_report",
    "run_ttft_bench",
    "synthetic_facts",
    "write_outputs",
]

USER_ID = "bench"
"""Scope of the benchmark's memories (a throwaway database in a temporary folder)."""


# ---------------------------------------------------------------------------------------------------- running


def _make_client(
    settings: TTFTSettings, data_dir: Path, engine: Engine | None, embedder: Embedder | None
) -> MemoryClient:
    from inferscale.client import MemoryClient
    from inferscale.config import EngineConfig, KVConfig, MemoryConfig

    kv = KVConfig() if settings.recompute is None else KVConfig(recompute=settings.recompute)
    config = MemoryConfig(
        data_dir=str(data_dir),
        kv=kv,
        engine=EngineConfig(
            provider=settings.engine,
            model=settings.model,
            dtype=settings.dtype,
            device=settings.device,
            num_threads=settings.num_threads if settings.num_threads is not None else "auto",
        ),
    )
    return MemoryClient(config, engine=engine, embedder=embedder)  # without an engine, it builds the configured one


def run_ttft_bench(
    settings: TTFTSettings,
    *,
    engine: Engine | None = None,
    embedder: Embedder | None = None,
    facts: Sequence[str] | None = None,
    console: Console | None = None,
) -> TTFTReport:
    """Measure every cell, write ``ttft_vs_k.json`` and ``ttft_vs_k.png`` and return the report.

    Args:
        settings: see :class:`TTFTSettings`.
        engine, embedder: already loaded models to use instead of building them from the settings (tests); a
            given engine serves with its own serving settings (``settings.recompute`` applies to a built one).
        facts: the memories to store (at least ``max(ks)``); default :func:`synthetic_facts`.
        console: where progress goes (default: stderr).

    Raises:
        ConfigError: for ``--engine vllm`` without the vLLM engine, or too few facts for the largest k.
    """
    from inferscale.apps_extra import console as make_console

    check_engine(settings.engine)
    console = console or make_console(stderr=True)
    k_max = max(settings.ks)
    memories = list(facts) if facts is not None else synthetic_facts(k_max)
    if len(memories) < k_max:
        raise ConfigError(f"{len(memories)} facts given, but k goes up to {k_max}")
    with tempfile.TemporaryDirectory(prefix="inferscale-ttft-") as tmp:
        data_dir = settings.data_dir or Path(tmp)
        client = _make_client(settings, data_dir, engine, embedder)
        try:
            report = _measure(client, settings, memories, console)
        finally:
            client.close()  # also closes an engine the client built (vLLM: its process and staging folder)
    write_outputs(report, settings.out_dir)
    return report


def _measure(client: MemoryClient, settings: TTFTSettings, memories: list[str], console: Console) -> TTFTReport:
    t0 = time.perf_counter()
    load_start = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None
    with console.status("loading the model"):
        client.engine.load()
    client.add([{"role": "user", "content": m} for m in memories], user_id=USER_ID, infer=False)
    client.wait_for_encoding()  # no background encoding beside the timed chats
    console.print(f"stored and encoded {len(memories)} memories in {time.perf_counter() - t0:.1f} s", style="dim")

    store = client.kv_store
    have = available_tiers(store)
    wanted = list(settings.tiers) if settings.tiers is not None else list(TIER_ORDER)
    skipped: dict[str, str] = {}
    tiers: list[str | None] = []
    for name in wanted:
        if name in have:
            tiers.append(name)
        elif name == "device" and settings.tiers is None:
            continue  # no device tier without CUDA: nothing to report
        else:
            skipped[name] = f"the KV store has no {name} tier (tiers: {', '.join(have)})"
    if not tiers:
        tiers = [None]  # still measure KV injection, from whatever tier serves it
    query = settings.query

    engine = client.engine
    cold = settings.prefix_cache == "cold" and settings.engine == "vllm"  # the transformers engine has no prefix cache
    from inferscale.scope import Scope

    scope = Scope(user_id=USER_ID).key()

    def chat(k: int, mode: ChatMode) -> Any:
        if cold:  # untimed: forget earlier repeats, keep this user's system prefix (prompt mode)
            engine.reset_prefix_cache()
            engine.generate_prompt("Hello.", [], 1, cache_scope=scope)
        return client.chat(query, user_id=USER_ID, limit=k, mode=mode, max_new_tokens=1)

    for _ in range(settings.warmup):  # untimed: kernels, allocator and caches of both paths at the largest k
        chat(max(settings.ks), "prompt")
        chat(max(settings.ks), "kv")
        chat(0, "prompt")

    cells: list[TTFTCell] = []
    query_cell = TTFTCell(k=0, mode="query")
    by_k: dict[int, list[TTFTCell]] = {}
    for k in settings.ks:
        by_k[k] = [TTFTCell(k=k, mode="prompt")] + [TTFTCell(k=k, mode="kv", tier=t) for t in tiers]
    total = settings.repeats * (len(settings.ks) * (1 + len(tiers)) + 1)
    done = 0
    with console.status("measuring") as status:
        for rep in range(settings.repeats):
            _record(query_cell, chat(0, "prompt"), None)
            for k in settings.ks:
                prompt_cell, *kv_cells = by_k[k]
                reference = chat(k, "prompt")
                _record(prompt_cell, reference, reference.memory_ids)
                for cell in kv_cells:
                    if cell.tier is not None:
                        if cell.tier != "disk":
                            make_resident(client, reference.memory_ids)
                        stage(store, cell.tier)
                    before = hits(store)
                    result = chat(k, "kv")
                    for name, n in hit_delta(hits(store), before).items():
                        cell.served[name] = cell.served.get(name, 0) + n
                    _record(cell, result, reference.memory_ids)
                done += 1 + len(kv_cells)
                status.update(f"measuring: repeat {rep + 1}/{settings.repeats}, k={k} ({done}/{total} calls)")
    cells.append(query_cell)
    for k in settings.ks:
        cells.extend(by_k[k])
    report = TTFTReport(
        settings=_settings_dict(settings),
        machine=machine_info(),
        cells=cells,
        skipped=skipped,
    )
    # the policy the KV cells were served with, as the engine holds it (a given engine keeps its own)
    report.settings["recompute"] = str(client.engine.serving.recompute)
    report.machine["model"] = _model_name(client)
    from inferscale.engines.hf.dtype import loaded_dtype

    report.machine["model_dtype"] = loaded_dtype(client.engine.model)
    report.machine["load_avg_1m_at_start"] = load_start
    report.ratios = compute_ratios(report)
    report.ratios.update(_flop_ratios(client, report, query))
    return report


def _flop_ratios(client: MemoryClient, report: TTFTReport, query: str) -> dict[str, float | None]:
    """``prefill_flops_kv_k{k_max}_over_k{k_small}``: the KV-mode prefill's FLOPs at k_max over those at k_small
    (:mod:`inferscale.bench.flops`): what the query prefill's share of TTFT grows by where prefill is
    compute-bound (retrieval and assembly, which also grow with k, are not in it). The memory tokens a
    ``kv.recompute`` policy prefills again count as prefilled: ``r`` of them make the prefill ``q + r`` tokens after
    ``P + S - r`` cached ones (exact for ``tail:n``; the other policies' tokens sit earlier in the segment and
    attend to fewer keys, and ``selective:r`` counts its probe of the query among them, so their FLOPs are
    over-counted). Empty when the FLOP model does not cover the
    architecture."""
    from inferscale.bench.flops import prefill_cost

    engine = client.engine
    positive = sorted({c.k for c in report.cells if c.mode == "kv" and c.k > 0})
    if not positive:
        return {}
    try:
        cost = prefill_cost(engine.model)
    except ValueError:
        return {}
    k_max, k_small = max(positive), 5 if 5 in positive else min(positive)
    prefix, q = len(engine.system_prefix_ids()), len(engine.query_token_ids(query))

    def kv_flops(k: int) -> float | None:
        prompt = report.cell(k, "prompt")
        kv = next((c for c in report.cells if c.mode == "kv" and c.k == k), None)
        if prompt is None or kv is None:
            return None
        recomputed = min(kv.recomputed_tokens, prompt.memory_tokens)
        return cost.flops(q + recomputed, prefix + prompt.memory_tokens - recomputed)

    big, small = kv_flops(k_max), kv_flops(k_small)
    if big is None or small is None:
        return {}
    return {f"prefill_flops_kv_k{k_max}_over_k{k_small}": round(big / small, 4)}


def _model_name(client: MemoryClient) -> str:
    path = client.engine.model.config.name_or_path
    return Path(str(path)).name if path else (client.config.engine.model or "SmolLM2-135M-Instruct (embedded)")


def _record(cell: TTFTCell, result: Any, reference_ids: list[str] | None) -> None:
    t = result.timings
    cell.ttft_ms.append(t.ttft_ms)
    cell.assembly_ms.append(t.kv_assembly_ms)
    cell.prefill_ms.append(t.prefill_ms)
    cell.retrieval_ms.append(t.retrieval_ms)
    cell.memory_tokens = result.memory_tokens
    cell.recomputed_tokens = result.recomputed_tokens
    if reference_ids is not None and list(result.memory_ids) != list(reference_ids):
        cell.same_memories = False


def _settings_dict(settings: TTFTSettings) -> dict[str, Any]:
    return {
        "ks": list(settings.ks),
        "repeats": settings.repeats,
        "engine": settings.engine,
        "dtype": settings.dtype,
        "device": settings.device,
        "model": settings.model,
        "tiers": list(settings.tiers) if settings.tiers is not None else None,
        "query": settings.query,
        "warmup": settings.warmup,
        "prefix_cache": settings.prefix_cache,
    }
