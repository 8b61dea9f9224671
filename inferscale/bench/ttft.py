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
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from rich.console import Console
from rich.table import Table

from inferscale.bench.common import check_engine, machine_info, percentile, write_json_and_plot
from inferscale.errors import ConfigError

if TYPE_CHECKING:
    from inferscale.client import MemoryClient
    from inferscale.engines.base import Engine
    from inferscale.retrieval import Embedder

__all__ = [
    "DEFAULT_KS",
    "DEFAULT_QUERY",
    "TTFTCell",
    "TTFTReport",
    "TTFTSettings",
    "available_tiers",
    "percentile",
    "print_report",
    "run_ttft_bench",
    "synthetic_facts",
]

DEFAULT_KS: tuple[int, ...] = (0, 5, 10, 20, 30, 50)
"""Memory counts of the paper's TTFT figure."""

DEFAULT_QUERY = "Which of my friends collects old maps, and since when?"
"""The query of every call (any query works: the same one retrieves the same top-k at every k)."""

USER_ID = "bench"
"""Scope of the benchmark's memories (a throwaway database in a temporary folder)."""

TIER_ORDER: tuple[str, ...] = ("device", "host", "disk")
"""KV store tiers the benchmark knows how to stage, fastest first."""

_PEOPLE = ("Daniel", "Clara", "Raj", "Ines", "Tomas", "Leila", "Marco", "Yuki", "Ana", "Pedro", "Noor", "Felix")
_HOBBIES = (
    "old maps",
    "jazz records",
    "sourdough baking",
    "trail running",
    "green tea",
    "board games",
    "film cameras",
    "origami",
)
_PLACES = ("Porto", "Lyon", "Kyoto", "Austin", "Nairobi", "Oslo", "Lima", "Hanoi", "Tbilisi")
_MONTHS = ("January", "March", "May", "July", "September", "November")


def synthetic_facts(n: int) -> list[str]:
    """``n`` distinct one-sentence facts (about 20 tokens each) about friends, hobbies, places and dates.

    Deterministic: the same ``n`` gives the same list, and the first ``m`` facts of ``synthetic_facts(n)`` equal
    ``synthetic_facts(m)``.
    """
    facts: list[str] = []
    for i in range(n):
        person = _PEOPLE[i % len(_PEOPLE)]
        hobby = _HOBBIES[(i // len(_PEOPLE)) % len(_HOBBIES)]
        place = _PLACES[(i * 7) % len(_PLACES)]
        month = _MONTHS[(i * 5) % len(_MONTHS)]
        facts.append(f"My friend {person} took up {hobby} in {place} in {month} {2015 + i % 9}, memory number {i + 1}.")
    return facts


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


@dataclass(frozen=True)
class TTFTSettings:
    """What ``inferscale bench ttft`` measures and where it writes.

    Attributes:
        ks: memory counts k (the facts retrieved per call), each >= 0.
        repeats: timed calls per cell (>= 1); medians and p95 are taken over them.
        engine: ``"transformers"`` or ``"vllm"`` (the latter needs ``inferscale.engines.vllm``).
        dtype: model dtype (``"bfloat16"``, ``"float16"``, ``"float32"``).
        device: ``"auto"``, ``"cpu"``, ``"cuda"``...
        model: model folder or name; ``None`` = the embedded SmolLM2-135M-Instruct.
        tiers: KV store tiers to measure; ``None`` = every tier the store has (device, host, disk).
        query: the query text.
        warmup: untimed rounds (every path once per round) before measuring.
        num_threads: torch CPU threads; ``None`` keeps torch's default (``OMP_NUM_THREADS``).
        out_dir: folder for ``ttft_vs_k.json`` and ``ttft_vs_k.png`` (created).
        data_dir: folder for the throwaway database and KV files; ``None`` = a new temporary folder.
        prefix_cache: vLLM only. ``"cold"`` empties vLLM's prefix cache before every timed call and then prefills
            the system prefix alone, as a running server would have it, so a repeat of the same request is
            computed (prompt) or injected (KV) again; ``"warm"`` keeps the cache, so repeats of a request are
            served from it. The transformers engine keeps nothing between requests (each builds its cache on the
            shared system prefix), so this changes nothing there.
    """

    ks: tuple[int, ...] = DEFAULT_KS
    repeats: int = 5
    engine: Literal["transformers", "vllm"] = "transformers"
    dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    device: str = "auto"
    model: str | None = None
    tiers: tuple[str, ...] | None = None
    query: str = DEFAULT_QUERY
    warmup: int = 2
    num_threads: int | None = None
    out_dir: Path = Path("out/bench/ttft")
    data_dir: Path | None = None
    prefix_cache: Literal["cold", "warm"] = "cold"

    def __post_init__(self) -> None:
        if not self.ks or any(k < 0 for k in self.ks):
            raise ConfigError(f"ks must be non-empty and >= 0, got {self.ks!r}")
        if self.repeats < 1:
            raise ConfigError(f"repeats must be >= 1, got {self.repeats}")
        if self.warmup < 0:
            raise ConfigError(f"warmup must be >= 0, got {self.warmup}")
        if self.prefix_cache not in ("cold", "warm"):
            raise ConfigError(f"prefix_cache must be 'cold' or 'warm', got {self.prefix_cache!r}")
        if self.tiers is not None and (unknown := set(self.tiers) - set(TIER_ORDER)):
            raise ConfigError(f"unknown KV tiers {sorted(unknown)}; choose from {list(TIER_ORDER)}")


@dataclass
class TTFTCell:
    """The samples of one (k, path) cell, all in ms.

    Attributes:
        k: memories retrieved per call.
        mode: ``"prompt"``, ``"kv"`` or ``"query"`` (the query alone).
        tier: the KV store tier staged for ``"kv"`` cells, else ``None``.
        ttft_ms, assembly_ms, prefill_ms, retrieval_ms: one sample per repeat (ms).
        memory_tokens: tokens of the memory segment (tokens).
        served: lookups answered per tier over all repeats, from the store's hit counters (``"miss"``: encoded).
        same_memories: whether every call of this cell used the memory ids of the k-cell's prompt call.
    """

    k: int
    mode: str
    tier: str | None = None
    ttft_ms: list[float] = field(default_factory=list)
    assembly_ms: list[float] = field(default_factory=list)
    prefill_ms: list[float] = field(default_factory=list)
    retrieval_ms: list[float] = field(default_factory=list)
    memory_tokens: int = 0
    served: dict[str, int] = field(default_factory=dict)
    same_memories: bool = True

    @property
    def name(self) -> str:
        """``"prompt"``, ``"query"`` or ``"kv:<tier>"``."""
        return f"kv:{self.tier}" if self.mode == "kv" and self.tier else self.mode

    def p50(self) -> float:
        """Median TTFT (ms)."""
        return _median(self.ttft_ms)

    def p95(self) -> float:
        """95th percentile TTFT (ms)."""
        return percentile(self.ttft_ms, 95)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary and raw samples."""
        return {
            "k": self.k,
            "mode": self.mode,
            "tier": self.tier,
            "name": self.name,
            "n": len(self.ttft_ms),
            "ttft_p50_ms": round(self.p50(), 3),
            "ttft_p95_ms": round(self.p95(), 3),
            "ttft_mean_ms": round(float(np.mean(self.ttft_ms)), 3) if self.ttft_ms else None,
            "assembly_p50_ms": round(_median(self.assembly_ms), 3),
            "prefill_p50_ms": round(_median(self.prefill_ms), 3),
            "retrieval_p50_ms": round(_median(self.retrieval_ms), 3),
            "memory_tokens": self.memory_tokens,
            "served": dict(self.served),
            "same_memories": self.same_memories,
            "ttft_ms": [round(v, 3) for v in self.ttft_ms],
            "assembly_ms": [round(v, 3) for v in self.assembly_ms],
            "prefill_ms": [round(v, 3) for v in self.prefill_ms],
        }


@dataclass
class TTFTReport:
    """Everything one run measured.

    Attributes:
        settings: what was asked (JSON-ready).
        machine: where it ran (CPU, threads, load average, torch, CUDA device).
        cells: one per (k, path), plus the ``query`` cell.
        skipped: tiers that were asked for or expected but could not be staged, with the reason.
        ratios: the [kv] issue's ratios (see :func:`compute_ratios`).
        json_path, png_path: the files written (``None`` before :func:`write_outputs`).
    """

    settings: dict[str, Any]
    machine: dict[str, Any]
    cells: list[TTFTCell]
    skipped: dict[str, str]
    ratios: dict[str, float | None] = field(default_factory=dict)
    json_path: Path | None = None
    png_path: Path | None = None

    def cell(self, k: int, name: str) -> TTFTCell | None:
        """The cell of ``name`` (``"prompt"``, ``"kv:host"``, ``"query"``...) at ``k``, or ``None``."""
        return next((c for c in self.cells if c.k == k and c.name == name), None)

    @property
    def kv_names(self) -> list[str]:
        """The KV cell names measured, fastest tier first."""
        names = {c.name for c in self.cells if c.mode == "kv"}
        return sorted(names, key=lambda n: TIER_ORDER.index(n[3:]) if n[3:] in TIER_ORDER else len(TIER_ORDER))

    def to_dict(self) -> dict[str, Any]:
        """The JSON document written to ``ttft_vs_k.json``."""
        return {
            "benchmark": "ttft_vs_k",
            "settings": self.settings,
            "machine": self.machine,
            "skipped_tiers": self.skipped,
            "ratios": self.ratios,
            "cells": [c.to_dict() for c in self.cells],
        }


# ---------------------------------------------------------------------------------------------------- KV tiers


def _kv_store(client: MemoryClient) -> Any | None:
    """The client's tiered KV store, or ``None`` when it cannot be reached."""
    manager = client.fact_kv
    return getattr(manager, "store", None) or getattr(manager, "_store", None)


def available_tiers(store: Any) -> list[str]:
    """Names of the tiers of ``store`` this benchmark can stage (device, host, disk), fastest first."""
    tiers = getattr(store, "tiers", None)
    if tiers is None:
        return []
    names = {getattr(t, "name", None) for t in tiers}
    return [name for name in TIER_ORDER if name in names]


def _stage(store: Any, tier: str) -> None:
    """Arrange for the next lookups to be answered by ``tier``.

    ``device``: nothing (entries are promoted to the top memory tier by every hit). ``host``: move every entry
    of the tiers above the host tier down into it. ``disk``: empty every memory tier (entries stay on disk).
    """
    tiers = {t.name: t for t in store.tiers}
    if tier == "host":
        host = tiers["host"]
        for name in TIER_ORDER[: TIER_ORDER.index("host")]:
            upper = tiers.get(name)
            if upper is None:
                continue
            snapshot = upper.keys()  # a KVTier method returning a list, not a dict view
            for key in snapshot:
                fact = upper.pop(key)
                if fact is not None:
                    host.put(key, fact)  # evicted entries are still on disk
    elif tier == "disk":
        for name in ("device", "host"):
            if name in tiers:
                tiers[name].clear()


def _make_resident(client: MemoryClient, memory_ids: Sequence[str]) -> None:
    """Look the memories' K/V up once (untimed), which promotes disk-only entries to the top memory tier."""
    records = [client.db.get(memory_id) for memory_id in memory_ids]
    client.fact_kv.ensure([r for r in records if r is not None])


def _hits(store: Any) -> dict[str, int]:
    stats = getattr(store, "stats", None)
    if stats is None:
        return {}
    s = stats()
    out = {str(k): int(v) for k, v in s.hits.items()}
    out["miss"] = int(s.misses)
    return out


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


# ---------------------------------------------------------------------------------------------------- running


def _make_client(
    settings: TTFTSettings, data_dir: Path, engine: Engine | None, embedder: Embedder | None
) -> MemoryClient:
    from inferscale.client import MemoryClient
    from inferscale.config import EngineConfig, MemoryConfig

    config = MemoryConfig(
        data_dir=str(data_dir),
        engine=EngineConfig(
            provider=settings.engine,
            model=settings.model,
            dtype=settings.dtype,
            device=settings.device,
            num_threads=settings.num_threads,
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
        engine, embedder: already loaded models to use instead of building them from the settings (tests).
        facts: the memories to store (at least ``max(ks)``); default :func:`synthetic_facts`.
        console: where progress goes (default: stderr).

    Raises:
        ConfigError: for ``--engine vllm`` without the vLLM engine, or too few facts for the largest k.
    """
    check_engine(settings.engine)
    console = console or Console(stderr=True)
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
            client.close()
            close_engine = getattr(client.engine, "close", None) if engine is None else None
            if callable(close_engine):
                close_engine()  # an engine the client built (vLLM) owns a process and a staging folder
    write_outputs(report, settings.out_dir)
    return report


def _measure(client: MemoryClient, settings: TTFTSettings, memories: list[str], console: Console) -> TTFTReport:
    t0 = time.perf_counter()
    load_start = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None
    with console.status("loading the model"):
        load = getattr(client.engine, "load", None)
        if callable(load):
            load()
    client.add([{"role": "user", "content": m} for m in memories], user_id=USER_ID, infer=False)
    console.print(f"stored and encoded {len(memories)} memories in {time.perf_counter() - t0:.1f} s", style="dim")

    store = _kv_store(client)
    have = available_tiers(store)
    wanted = list(settings.tiers) if settings.tiers is not None else list(TIER_ORDER)
    skipped: dict[str, str] = {}
    tiers: list[str | None] = []
    for name in wanted:
        if name in have:
            tiers.append(name)
        elif name == "device" and settings.tiers is None:
            continue  # no device tier without CUDA: nothing to report
        elif store is None or not have:
            skipped[name] = "the KV store does not expose its tiers"
        else:
            skipped[name] = f"the KV store has no {name} tier (tiers: {', '.join(have)})"
    if not tiers:
        tiers = [None]  # still measure KV injection, from whatever tier serves it
    query = settings.query

    reset = getattr(client.engine, "reset_prefix_cache", None)
    cold = settings.prefix_cache == "cold" and callable(reset)
    from inferscale.scope import Scope

    scope = Scope(user_id=USER_ID).key()

    def chat(k: int, mode: str) -> Any:
        if cold:  # untimed: forget earlier repeats, keep this user's system prefix cached (prompt mode)
            reset()
            client.engine.generate_prompt("Hello.", [], 1, cache_scope=scope)
        return client.chat(query, user_id=USER_ID, limit=k, mode=mode, max_new_tokens=1)  # type: ignore[arg-type]

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
                    if store is not None and cell.tier is not None:
                        if cell.tier != "disk":
                            _make_resident(client, reference.memory_ids)
                        _stage(store, cell.tier)
                    before = _hits(store) if store is not None else {}
                    result = chat(k, "kv")
                    if store is not None:
                        for name, n in _delta(_hits(store), before).items():
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
    report.machine["model"] = _model_name(client)
    report.machine["load_avg_1m_at_start"] = load_start
    report.ratios = compute_ratios(report)
    report.ratios.update(_flop_ratios(client, report, query))
    return report


def _flop_ratios(client: MemoryClient, report: TTFTReport, query: str) -> dict[str, float | None]:
    """``prefill_flops_kv_k{k_max}_over_k{k_small}``: the KV-mode prefill's FLOPs at k_max over those at k_small
    (:mod:`inferscale.bench.flops`): what the query prefill's share of TTFT grows by where prefill is
    compute-bound (retrieval and assembly, which also grow with k, are not in it). Empty when the engine does not
    expose a transformers model."""
    from inferscale.bench.flops import prefill_cost

    engine: Any = client.engine
    positive = sorted({c.k for c in report.cells if c.mode == "kv" and c.k > 0})
    model = getattr(engine, "model", None)
    if not positive or model is None:
        return {}
    try:
        cost = prefill_cost(model)
    except ValueError:
        return {}
    k_max, k_small = max(positive), 5 if 5 in positive else min(positive)
    prefix, q = len(engine.system_prefix_ids()), len(engine.query_token_ids(query))
    big, small = report.cell(k_max, "prompt"), report.cell(k_small, "prompt")
    if big is None or small is None:
        return {}
    ratio = cost.flops(q, prefix + big.memory_tokens) / cost.flops(q, prefix + small.memory_tokens)
    return {f"prefill_flops_kv_k{k_max}_over_k{k_small}": round(ratio, 4)}


def _model_name(client: MemoryClient) -> str:
    model = getattr(client.engine, "model", None)
    path = getattr(getattr(model, "config", None), "_name_or_path", None)
    return Path(str(path)).name if path else (client.config.engine.model or "SmolLM2-135M-Instruct (embedded)")


def _record(cell: TTFTCell, result: Any, reference_ids: list[str] | None) -> None:
    t = result.timings
    cell.ttft_ms.append(t.ttft_ms)
    cell.assembly_ms.append(t.kv_assembly_ms)
    cell.prefill_ms.append(t.prefill_ms)
    cell.retrieval_ms.append(t.retrieval_ms)
    cell.memory_tokens = result.memory_tokens
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


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not np.isfinite(a) or not np.isfinite(b) or b <= 0:
        return None
    return round(a / b, 4)


def compute_ratios(report: TTFTReport) -> dict[str, float | None]:
    """The [kv] issue's ratios, on medians, for each KV tier measured (``<tier>`` in each name).

    With ``k_max = max(ks)`` and ``k_small = 5`` (else the smallest k > 0):

    - ``assembly_kv_<tier>_k{k_max}_over_ttft_prompt_k{k_small}``: KV load + assembly at k_max over the prompt
      path's whole TTFT at k_small;
    - ``ttft_kv_<tier>_k{k_max}_over_k{k_small}``: how KV-injection TTFT grows with k;
    - ``ttft_kv_<tier>_k{k_max}_over_query``: KV-injection TTFT at k_max over the query alone;
    - ``speedup_prompt_over_kv_<tier>_k{k_max}``: prompt TTFT over KV TTFT at k_max.
    """
    ks = sorted({c.k for c in report.cells if c.mode != "query"})
    positive = [k for k in ks if k > 0]
    if not positive:
        return {}
    k_max = max(positive)
    k_small = 5 if 5 in positive else min(positive)
    query = report.cell(0, "query")
    prompt_small = report.cell(k_small, "prompt")
    prompt_max = report.cell(k_max, "prompt")
    out: dict[str, float | None] = {}
    for name in report.kv_names:
        tag = name.replace(":", "_")
        big = report.cell(k_max, name)
        small = report.cell(k_small, name)
        if big is None:
            continue
        out[f"assembly_{tag}_k{k_max}_over_ttft_prompt_k{k_small}"] = _ratio(
            _median(big.assembly_ms), prompt_small.p50() if prompt_small else None
        )
        out[f"ttft_{tag}_k{k_max}_over_k{k_small}"] = _ratio(big.p50(), small.p50() if small else None)
        out[f"ttft_{tag}_k{k_max}_over_query"] = _ratio(big.p50(), query.p50() if query else None)
        out[f"speedup_prompt_over_{tag}_k{k_max}"] = _ratio(prompt_max.p50() if prompt_max else None, big.p50())
    return out


# ---------------------------------------------------------------------------------------------------- outputs


def write_outputs(report: TTFTReport, out_dir: Path) -> None:
    """Write ``ttft_vs_k.json`` and ``ttft_vs_k.png`` into ``out_dir`` (created) and set their paths."""
    report.json_path, report.png_path = write_json_and_plot(
        out_dir, "ttft_vs_k", report.to_dict(), lambda path: plot_report(report, path)
    )


def plot_report(report: TTFTReport, path: Path) -> None:
    """Median TTFT (ms) versus k per path, with p50..p95 shaded and the query alone as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 4.5), dpi=120)
    names = ["prompt", *report.kv_names]
    for name in names:
        cells = sorted((c for c in report.cells if c.name == name), key=lambda c: c.k)
        if not cells:
            continue
        xs = [c.k for c in cells]
        p50 = [c.p50() for c in cells]
        p95 = [c.p95() for c in cells]
        label = "prompt injection" if name == "prompt" else f"KV injection ({name[3:] or 'kv'} tier)"
        (line,) = ax.plot(xs, p50, marker="o", label=label)
        ax.fill_between(xs, p50, p95, color=line.get_color(), alpha=0.15)
    query = report.cell(0, "query")
    if query is not None:
        ax.axhline(query.p50(), color="grey", linestyle="--", label="query alone")
    model = report.machine.get("model", "")
    ax.set_title(f"TTFT vs k ({model}, {report.settings['dtype']}, {report.settings['repeats']} repeats)")
    ax.set_xlabel("k (memories retrieved)")
    ax.set_ylabel("TTFT, median (ms); shaded to p95")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def print_report(report: TTFTReport, console: Console | None = None) -> None:
    """Print the TTFT table (median and p95, ms), the skipped tiers and the ratios."""
    console = console or Console()
    kv_names = report.kv_names
    machine = report.machine
    title = (
        f"TTFT vs k in ms, median / p95 over {report.settings['repeats']} repeats (asm: KV load + assembly "
        f"median) · {machine.get('model')} "
        f"{report.settings['dtype']} on {machine.get('cuda') or machine.get('processor')}, "
        f"{machine.get('torch_threads')} threads"
    )
    table = Table(title=title)
    table.add_column("k", justify="right")
    table.add_column("mem tok", justify="right")
    table.add_column("prompt", justify="right")
    for name in kv_names:
        table.add_column(name, justify="right")
        table.add_column(f"asm {name[3:]}", justify="right")
    if kv_names:
        table.add_column(f"prompt/{kv_names[0]}", justify="right")
    query = report.cell(0, "query")
    if query is not None:
        row = ["query", "0", f"{query.p50():.1f} / {query.p95():.1f}"]
        row += ["", ""] * len(kv_names) + ([""] if kv_names else [])
        table.add_row(*row)
    for k in sorted({c.k for c in report.cells if c.mode != "query"}):
        prompt = report.cell(k, "prompt")
        row = [str(k), str(prompt.memory_tokens if prompt else ""), _pair(prompt)]
        for name in kv_names:
            cell = report.cell(k, name)
            row += [_pair(cell), f"{_median(cell.assembly_ms):.1f}" if cell else ""]
        if kv_names:
            first = report.cell(k, kv_names[0])
            ratio = _ratio(prompt.p50() if prompt else None, first.p50() if first else None)
            row.append(f"{ratio:.2f}×" if ratio is not None else "")
        table.add_row(*row)
    console.print(table)
    for name, reason in report.skipped.items():
        console.print(f"skipped KV tier {name}: {reason}", style="yellow")
    for cell in report.cells:
        if not cell.same_memories:
            console.print(f"warning: {cell.name} at k={cell.k} did not always use the same memories", style="red")
        unexpected = {t for t in cell.served if t not in (cell.tier, "miss")} if cell.tier else set()
        if unexpected or cell.served.get("miss"):
            console.print(f"note: {cell.name} at k={cell.k} was served by {cell.served}", style="yellow")
    for name, value in report.ratios.items():
        console.print(f"{name} = {value if value is not None else 'n/a'}")
    if report.json_path is not None:
        console.print(f"wrote {report.json_path} and {report.png_path}", style="dim")


def _pair(cell: TTFTCell | None) -> str:
    return f"{cell.p50():.1f} / {cell.p95():.1f}" if cell is not None and cell.ttft_ms else ""
