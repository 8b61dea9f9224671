"""The report of ``inferscale bench ttft``: the measured cells, the [kv] issue's ratios, and their table, JSON
document and plot (``ttft_vs_k.json``, ``ttft_vs_k.png``)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from inferscale.bench.common import percentile, write_json_and_plot
from inferscale.bench.report import figure, percentile_lines, print_ratios, print_written, report_table
from inferscale.bench.settings import TIER_ORDER

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["TIER_ORDER", "TTFTCell", "TTFTReport", "compute_ratios", "plot_report", "print_report", "write_outputs"]


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


@dataclass
class TTFTCell:
    """The samples of one (k, path) cell, all in ms.

    Attributes:
        k: memories retrieved per call.
        mode: ``"prompt"``, ``"kv"`` or ``"query"`` (the query alone).
        tier: the KV store tier staged for ``"kv"`` cells, else ``None``.
        ttft_ms, assembly_ms, prefill_ms, retrieval_ms: one sample per repeat (ms).
        memory_tokens: tokens of the memory segment (tokens).
        recomputed_tokens: memory tokens prefilled again at serve time (``kv.recompute``), last call (tokens).
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
    recomputed_tokens: int = 0
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
            "recomputed_tokens": self.recomputed_tokens,
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
    """Median TTFT (ms) versus k per path, with p50..p95 shaded and the query alone as a dashed line.

    Raises:
        ConfigError: when matplotlib is not installed (the ``apps`` extra).
    """
    with figure(path, (7.0, 4.5)) as (ax,):
        for name in ["prompt", *report.kv_names]:
            cells = sorted((c for c in report.cells if c.name == name), key=lambda c: c.k)
            if not cells:
                continue
            label = "prompt injection" if name == "prompt" else f"KV injection ({name[3:] or 'kv'} tier)"
            xs = [c.k for c in cells]
            percentile_lines(ax, xs, [c.p50() for c in cells], [c.p95() for c in cells], label, p95_as="band")
        query = report.cell(0, "query")
        if query is not None:
            ax.axhline(query.p50(), color="grey", linestyle="--", label="query alone")
        model = report.machine.get("model", "")
        ax.set_title(f"TTFT vs k ({model}, {_dtype_label(report)}, {report.settings['repeats']} repeats)")
        ax.set_xlabel("k (memories retrieved)")
        ax.set_ylabel("TTFT, median (ms); shaded to p95")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend()


def _dtype_label(report: TTFTReport) -> str:
    """The dtype the model ran in, as configured and as loaded: ``"float32"``, or ``"auto → float32"``."""
    configured, loaded = report.settings["dtype"], report.machine.get("model_dtype")
    return f"{configured} → {loaded}" if loaded and loaded != configured else str(configured)


def print_report(report: TTFTReport, console: Console | None = None) -> None:
    """Print the TTFT table (median and p95, ms), the skipped tiers and the ratios.

    Raises:
        ConfigError: when rich is not installed (the ``apps`` extra).
    """
    from inferscale.apps_extra import console as make_console

    console = console or make_console()
    kv_names = report.kv_names
    machine = report.machine
    title = (
        f"TTFT vs k in ms, median / p95 over {report.settings['repeats']} repeats (asm: KV load + assembly "
        f"median) · {machine.get('model')} "
        f"{_dtype_label(report)} on {machine.get('cuda') or machine.get('processor')} "
        f"({machine.get('cpu_isa')}), {machine.get('torch_threads')} threads"
        f" · kv.recompute={report.settings['recompute']}"
    )
    columns = ["k", "mem tok", "prompt"]
    for name in kv_names:
        columns += [name, f"asm {name[3:]}"]
    if kv_names:
        columns.append(f"prompt/{kv_names[0]}")
    table = report_table(title, [], columns)
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
    print_ratios(report.ratios, console)
    print_written(report.json_path, report.png_path, console)


def _pair(cell: TTFTCell | None) -> str:
    return f"{cell.p50():.1f} / {cell.p95():.1f}" if cell is not None and cell.ttft_ms else ""
