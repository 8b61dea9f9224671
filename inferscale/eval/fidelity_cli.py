"""``inferscale eval fidelity``: the command line of :mod:`inferscale.eval.fidelity`."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.console import Console

from inferscale.errors import ConfigError, InferScaleError

__all__ = ["STANDARD_SETTINGS", "add_fidelity_parser", "default_setting"]

STANDARD_SETTINGS: tuple[dict[str, Any], ...] = (
    {"name": "pure injection", "context_window": 0},
    {"name": "s=0.35", "attention_scale": 0.35, "context_window": 0},
    {"name": "buckets 0/128/256/384", "position_buckets": [0, 128, 256, 384], "context_window": 0},
    {"name": "w=5 + selective:10", "recompute": "selective:10", "context_window": 5},
    {"name": "w=5 + structure", "recompute": "structure", "context_window": 5},
)
"""What ``eval fidelity`` measures when no ``--setting`` is given, besides the configured default."""


_TABLE_WIDTH = 220
"""Characters per line of the printed tables."""


def default_setting() -> dict[str, Any]:
    """The setting :class:`inferscale.config.KVConfig`'s defaults serve, as a ``--setting`` object."""
    from inferscale.config import KVConfig
    from inferscale.eval.fidelity import FidelitySetting

    return FidelitySetting.from_kv(KVConfig(), name="default").model_dump()


def _settings(raw: list[str] | None) -> list[Any]:
    from inferscale.eval.fidelity import FidelitySetting

    objects = [json.loads(text) for text in raw] if raw else [default_setting(), *STANDARD_SETTINGS]
    try:
        return [FidelitySetting(**obj) for obj in objects]
    except (ValidationError, TypeError) as exc:
        raise ConfigError(f"invalid --setting: {exc}") from exc


def _slices(args: argparse.Namespace, embedder: Any) -> list[Any]:
    from inferscale.eval.fidelity_cases import demo_cases, load_cases, locomo_cases

    slices = []
    if args.demo:
        slices.append(demo_cases(args.k, embedder))
    for path in args.cases or []:
        slices.append(load_cases(path))
    for conversation in args.conversations if args.locomo else ():
        slices.append(locomo_cases(args.locomo, conversation, args.questions, args.k, embedder))
    if not slices:
        raise ConfigError("nothing to run: give --demo, --cases FILE and/or --locomo PATH")
    return slices


def _run(args: argparse.Namespace) -> int:
    import torch

    from inferscale.config import EngineConfig
    from inferscale.engines.hf import load_causal_lm
    from inferscale.engines.transformers import TransformersEngine
    from inferscale.eval.fidelity import SYSTEM_PROMPTS, calibrate_scale, run_fidelity, summarize_rows
    from inferscale.eval.fidelity_report import fidelity_document, print_fidelity_table, write_fidelity_report
    from inferscale.retrieval.embedder import SentenceTransformerEmbedder

    console = Console(stderr=True)
    try:
        settings = _settings(args.setting)
        unknown = [p for p in args.system_prompts if p not in SYSTEM_PROMPTS]
        if unknown:
            raise ConfigError(f"unknown system prompt(s) {unknown}; choose from {sorted(SYSTEM_PROMPTS)}")
        if args.threads:
            torch.set_num_threads(args.threads)
        slices = _slices(args, SentenceTransformerEmbedder(None, "cpu"))
        config = EngineConfig(model=args.model, dtype=args.dtype, device=args.device)
        _, model, tokenizer = load_causal_lm(config, None)
        engines = {
            name: TransformersEngine(config, SYSTEM_PROMPTS[name], model=model, tokenizer=tokenizer)
            for name in args.system_prompts
        }
        t0 = time.perf_counter()
        out = Path(args.out)
        if args.calibrate:
            result = calibrate_scale(engines, slices, settings[0])
            console.print(
                f"calibrated s={result.scale:g}: held-out KL {result.held_out_kl:.3f} (s=1: "
                f"{result.held_out_kl_unscaled:.3f}) on {result.n_held_out} cases; calibration KL per s: "
                + ", ".join(f"{s:g}: {kl:.3f}" for s, kl in result.calibration_kl.items())
            )
            out.mkdir(parents=True, exist_ok=True)
            (out / "calibration.json").write_text(
                json.dumps(
                    {**result.__dict__, "calibration_kl": {str(k): v for k, v in result.calibration_kl.items()}},
                    indent=2,
                )
                + "\n",
                encoding="utf-8",
            )
            print(json.dumps({"attention_scale": result.scale}))
            return 0
        with console.status("measuring") as status:
            rows = run_fidelity(
                engines,
                slices,
                settings,
                max_new_tokens=args.max_new_tokens,
                generate=not args.first_token_only,
                progress=status.update,
            )
    except (InferScaleError, ValueError) as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    summaries = summarize_rows(rows)
    pooled = summarize_rows(rows, by=("setting",))
    run = {
        "slices": [s.name for s in slices],
        "k": args.k,
        "system_prompts": list(args.system_prompts),
        "settings": [s.model_dump() for s in settings],
        "model": args.model or "SmolLM2-135M-Instruct (embedded)",
        "dtype": args.dtype,
        "max_new_tokens": args.max_new_tokens,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    json_path, png_path = write_fidelity_report(out, fidelity_document(summaries, pooled, rows, run), pooled)
    wide = Console(width=_TABLE_WIDTH)  # 18 columns: narrower terminals would fold every cell
    print_fidelity_table(summaries, "KV-injection fidelity per setting, slice and system prompt", wide)
    print_fidelity_table(pooled, "Pooled over slices and system prompts", wide)
    console.print(f"wrote {json_path} and {png_path} ({run['wall_s']} s)", style="dim")
    return 0


def add_fidelity_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``eval fidelity`` to the ``eval`` subparsers; returns its parser."""
    from inferscale.eval.fidelity import SYSTEM_PROMPTS

    parser = subparsers.add_parser(
        "fidelity",
        help="KV injection vs pasted memories per serving setting: KL, agreement, answer F1, cost",
        description=(
            "Answer fixed (memories, question) cases with the memories pasted (prompt mode) and injected as K/V under "
            "each setting, at several system prompts, and report first-token KL(prompt || kv), top-1 agreement, F1 "
            "between the answers and against gold, budget-hit and repeat rates, added prefill tokens and TTFT. "
            'A setting is a JSON object: {"name", "attention_scale", "temperature", "recompute", "position_buckets"}.'
        ),
    )
    parser.add_argument("--demo", action="store_true", help="run the bundled demo conversation and its questions")
    parser.add_argument(
        "--cases", action="append", metavar="FILE", help='a JSON list of {"memories": [...], "question": ...}'
    )
    parser.add_argument("--locomo", metavar="PATH", help="a LoCoMo file (e.g. ../shared/data/locomo/locomo10.json)")
    parser.add_argument(
        "--conversations",
        type=lambda text: tuple(t for t in text.split(",") if t),
        default=("conv-26",),
        help="LoCoMo sample ids, comma-separated (default conv-26)",
    )
    parser.add_argument(
        "--questions", type=int, default=40, help="LoCoMo questions of categories 1-4 per conversation (default 40)"
    )
    parser.add_argument(
        "-k", "--k", type=int, default=10, help="memories per question for retrieved slices (default 10)"
    )
    parser.add_argument(
        "--system-prompts",
        type=lambda text: tuple(t for t in text.split(",") if t),
        default=tuple(SYSTEM_PROMPTS),
        help=f"comma-separated, from {', '.join(SYSTEM_PROMPTS)} (default all)",
    )
    parser.add_argument(
        "--setting",
        action="append",
        metavar="JSON",
        help="a setting to measure (repeatable; default: the configured default and a standard set)",
    )
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="pick the attention scale s for this model on half the cases and report it on the other half "
        "(the first --setting gives the other fields)",
    )
    parser.add_argument("--first-token-only", action="store_true", help="measure KL and agreement only (no answers)")
    parser.add_argument("--model", help="model folder or name (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default cpu)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="answer budget in tokens (default 32)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--out", default="out/eval/fidelity", help="output folder (default out/eval/fidelity)")
    parser.set_defaults(func=_run)
    return parser
