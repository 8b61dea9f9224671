"""The report of ``inferscale eval locomo``: the summary of the answered rows, as JSON, markdown, a plot and a
printed table."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferscale.bench.report import figure, grouped_bars, report_table
from inferscale.eval.locomo_files import RESULTS_FILE
from inferscale.eval.locomo_settings import ANSWERED_CATEGORIES, LocomoEvalSettings
from inferscale.eval.metrics import STEMMER

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["plot_summary", "print_summary", "summarize", "summary_markdown", "write_summary"]


def _mean(values: Iterable[float | int | bool | None]) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return round(statistics.fmean(kept), 4) if kept else None


def _median(values: Iterable[float | None]) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return round(statistics.median(kept), 2) if kept else None


def _group(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return {
        "n": len(rows),
        "f1_kv": _mean(r["kv"]["f1"] for r in rows),
        "f1_prompt": _mean(r["prompt"]["f1"] for r in rows),
        "bleu1_kv": _mean(r["kv"]["bleu1"] for r in rows),
        "bleu1_prompt": _mean(r["prompt"]["bleu1"] for r in rows),
        "j_kv": _mean(r["kv"]["judge"] for r in rows),
        "j_prompt": _mean(r["prompt"]["judge"] for r in rows),
        "recall_at_k": _mean(r["recall"] for r in rows),
        "exact_match_agreement": _mean(r["exact_match"] for r in rows),
        "kl_mean": _mean(r["kl"] for r in rows),
        "ttft_kv_p50_ms": _median(r["kv"]["ttft_ms"] for r in rows),
        "ttft_prompt_p50_ms": _median(r["prompt"]["ttft_ms"] for r in rows),
        "same_memories": all(r["memory_ids_same"] for r in rows),
    }


def summarize(rows: Sequence[Mapping[str, Any]], settings: LocomoEvalSettings) -> dict[str, Any]:
    """Metrics per numeric category code and overall (means over questions; J and recall over the questions that
    have them; KL in nats, TTFT medians in ms)."""
    by_category = {str(c): _group([r for r in rows if r["category"] == c]) for c in ANSWERED_CATEGORIES}
    settings_dict = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(settings).items()}
    settings_dict.pop("judge_api_key", None)
    return {
        "benchmark": "locomo",
        "settings": settings_dict,
        "stemmer": STEMMER,
        "conversations": sorted({str(r["conversation"]) for r in rows}),
        "categories": {k: v for k, v in by_category.items() if v["n"]},
        "overall": _group(rows) if rows else {"n": 0},
    }


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.{digits}f}"
    return str(value)


_COLUMNS = (
    ("n", "n"),
    ("F1 kv", "f1_kv"),
    ("F1 prompt", "f1_prompt"),
    ("BLEU-1 kv", "bleu1_kv"),
    ("BLEU-1 prompt", "bleu1_prompt"),
    ("J kv", "j_kv"),
    ("J prompt", "j_prompt"),
    ("recall@k", "recall_at_k"),
    ("EM agree", "exact_match_agreement"),
    ("KL mean", "kl_mean"),
    ("TTFT kv p50", "ttft_kv_p50_ms"),
    ("TTFT prompt p50", "ttft_prompt_p50_ms"),
)


def _rows_for_table(summary: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    rows = [(f"cat {c}", g) for c, g in summary["categories"].items()]
    return [*rows, ("all", summary["overall"])]


def _cells(group: Mapping[str, Any]) -> list[str]:
    return [_fmt(group.get(key), 1 if key.startswith("ttft") else 3) for _, key in _COLUMNS]


def summary_markdown(summary: Mapping[str, Any]) -> str:
    """The summary as a markdown table (per category code, then overall) with the run's settings."""
    s = summary["settings"]
    lines = [
        "# LoCoMo: KV injection vs prompt injection",
        "",
        f"Conversations: {', '.join(summary['conversations']) or 'none'}; k={s['k']}, w={s['context_window']}, "
        f"recompute={s['recompute']}, s={s['memory_attention_scale']}, buckets={s['position_buckets']}, "
        f"encode after system prefix: {s['encode_after_system_prefix']}, "
        f"first memory context-free: {s.get('first_memory_context_free', False)}; "
        f"model {s['model'] or 'SmolLM2-135M-Instruct (embedded)'} ({s['dtype']}); stemmer: {summary['stemmer']}.",
        "Category codes: 1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop (LoCoMo's mapping). "
        "KL(prompt ‖ kv) of the first token in nats; TTFT in ms.",
        "",
        "| " + " | ".join(["category", *(name for name, _ in _COLUMNS)]) + " |",
        "|" + "---|" * (len(_COLUMNS) + 1),
    ]
    for label, group in _rows_for_table(summary):
        lines.append("| " + " | ".join([label, *_cells(group)]) + " |")
    return "\n".join(lines) + "\n"


def write_summary(summary: Mapping[str, Any], out_dir: Path) -> dict[str, Path]:
    """Write ``summary.json``, ``summary.md`` and ``summary.png``; returns their paths (and the results file's).

    Raises:
        ConfigError: when matplotlib is not installed (the ``apps`` extra).
    """
    paths = {
        "results": out_dir / RESULTS_FILE,
        "json": out_dir / "summary.json",
        "markdown": out_dir / "summary.md",
        "plot": out_dir / "summary.png",
    }
    paths["json"].write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    paths["markdown"].write_text(summary_markdown(summary), encoding="utf-8")
    plot_summary(summary, paths["plot"])
    return paths


def plot_summary(summary: Mapping[str, Any], path: Path) -> None:
    """Bars per category code: F1 and BLEU-1 of both modes (left); recall@k and exact-match agreement (right).

    Raises:
        ConfigError: when matplotlib is not installed (the ``apps`` extra).
    """
    groups = _rows_for_table(summary)
    labels = [label for label, _ in groups]

    def series(*named: tuple[str, str]) -> list[tuple[str, list[Any]]]:
        return [(name, [g.get(key) for _, g in groups]) for name, key in named]

    with figure(path, (11.0, 4.2), ncols=2) as (left, right):
        grouped_bars(
            left,
            labels,
            series(
                ("F1 kv", "f1_kv"),
                ("F1 prompt", "f1_prompt"),
                ("BLEU-1 kv", "bleu1_kv"),
                ("BLEU-1 prompt", "bleu1_prompt"),
            ),
        )
        left.set_title("Answer quality by category code")
        grouped_bars(
            right, labels, series(("recall@k", "recall_at_k"), ("EM agreement kv/prompt", "exact_match_agreement"))
        )
        right.set_title("Retrieval recall and KV/prompt agreement")
        for ax in (left, right):
            ax.set_ylim(0, 1)
            ax.grid(axis="y", alpha=0.3)
            ax.legend(fontsize=8)


def print_summary(summary: Mapping[str, Any], console: Console | None = None) -> None:
    """Print the summary table (per category code and overall).

    Raises:
        ConfigError: when rich is not installed (the ``apps`` extra).
    """
    from inferscale.apps_extra import console as make_console

    s = summary["settings"]
    table = report_table(
        f"LoCoMo {', '.join(summary['conversations'])}: k={s['k']}, w={s['context_window']}, "
        f"recompute={s['recompute']}, s={s['memory_attention_scale']}, buckets={s['position_buckets']}, "
        f"prefix={s['encode_after_system_prefix']}, first context-free={s.get('first_memory_context_free', False)} "
        "(TTFT ms, KL nats)",
        ["category"],
        [name for name, _ in _COLUMNS],
    )
    for label, group in _rows_for_table(summary):
        table.add_row(label, *_cells(group))
    (console or make_console()).print(table)
