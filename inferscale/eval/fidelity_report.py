"""The report of ``inferscale eval fidelity``: a table, a JSON document and a plot of KL against added tokens."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferscale.bench.common import machine_info, write_json_and_plot
from inferscale.bench.report import figure, report_table
from inferscale.eval.fidelity import SettingSummary

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["fidelity_document", "print_fidelity_table", "write_fidelity_report"]

_COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("n", "n", 0),
    ("KL mean", "kl_mean", 3),
    ("KL median", "kl_median", 3),
    ("top-1 agree", "top1_agreement", 2),
    ("F1 kv~prompt", "f1_kv_vs_prompt", 2),
    ("F1 kv gold", "f1_kv_gold", 2),
    ("F1 prompt gold", "f1_prompt_gold", 2),
    ("budget kv", "kv_budget_hit", 2),
    ("budget prompt", "prompt_budget_hit", 2),
    ("repeat kv", "kv_repeat", 2),
    ("repeat prompt", "prompt_repeat", 2),
    ("added tok", "added_tokens", 1),
    ("added %", "added_fraction", 1),
    ("TTFT kv ms", "ttft_kv_ms", 1),
    ("TTFT prompt ms", "ttft_prompt_ms", 1),
)


def _cell(value: Any, digits: int, key: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if key == "added_fraction":
        return f"{100 * value:.{digits}f}"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def print_fidelity_table(summaries: Sequence[SettingSummary], title: str, console: Console | None = None) -> None:
    """Print one row per summary: setting, slice, system prompt and every figure of :class:`SettingSummary`.

    Raises:
        ConfigError: when rich is not installed (the ``apps`` extra).
    """
    from inferscale.apps_extra import console as make_console

    table = report_table(title, ["setting", "slice", "prompt"], [name for name, _, _ in _COLUMNS], fold_left=True)
    for s in summaries:
        values = asdict(s)
        table.add_row(s.setting, s.slice, s.system_prompt, *(_cell(values[key], d, key) for _, key, d in _COLUMNS))
    (console or make_console()).print(table)


def fidelity_document(
    summaries: Sequence[SettingSummary],
    pooled: Sequence[SettingSummary],
    rows: Sequence[Mapping[str, Any]],
    run: Mapping[str, Any],
) -> dict[str, Any]:
    """The JSON document: the run's settings, where it ran, per-group and pooled summaries, and every row."""
    return {
        "benchmark": "fidelity",
        "run": dict(run),
        "machine": machine_info(),
        "summaries": [asdict(s) for s in summaries],
        "pooled": [asdict(s) for s in pooled],
        "rows": [dict(r) for r in rows],
    }


def _plot(pooled: Sequence[SettingSummary], path: Path) -> None:
    with figure(path, (7.5, 4.8)) as (ax,):
        for s in pooled:
            added = 0.0 if math.isnan(s.added_fraction) else 100 * s.added_fraction
            ax.scatter(added, s.kl_mean, s=40)
            ax.annotate(s.setting, (added, s.kl_mean), fontsize=7, xytext=(4, 3), textcoords="offset points")
        ax.set_xlabel("added prefill tokens (% of memory tokens)")
        ax.set_ylabel("mean first-token KL(prompt ‖ kv), nats")
        ax.set_title("KV-injection fidelity per setting (all slices and system prompts)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)


def write_fidelity_report(
    out_dir: Path, document: Mapping[str, Any], pooled: Sequence[SettingSummary]
) -> tuple[Path, Path]:
    """Write ``out_dir/fidelity.json`` and ``out_dir/fidelity.png``; returns both paths."""
    return write_json_and_plot(out_dir, "fidelity", document, lambda path: _plot(pooled, path))
