"""``inferscale eval fidelity``: the command line of :mod:`inferscale.eval.fidelity`."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from inferscale.cli_options import (
    DEVICE_OPTION,
    DTYPE_OPTION,
    MODEL_OPTION,
    THREADS_OPTION,
    add_options,
    cli,
    from_args,
    name_list,
    output_folder,
    positive_int,
    quoted,
)
from inferscale.config import DType, MemoryConfig, MemoryLayout
from inferscale.errors import ConfigError, InferScaleError
from inferscale.eval.system_prompts import SYSTEM_PROMPTS
from inferscale.json_text import loads_json
from inferscale.validation_text import describe_errors

__all__ = ["SETTING_FIELDS", "STANDARD_SETTINGS", "FidelityOptions", "add_fidelity_parser", "default_setting"]

STANDARD_SETTINGS: tuple[dict[str, Any], ...] = (
    {"name": "pure injection", "context_window": 0},
    {"name": "s=0.35", "attention_scale": 0.35, "context_window": 0},
    {"name": "buckets 0/128/256/384", "position_buckets": [0, 128, 256, 384], "context_window": 0},
    {"name": "w=5 + selective:10", "recompute": "selective:10", "context_window": 5},
    {"name": "w=5 + structure", "recompute": "structure", "context_window": 5},
    {"name": "w=5 + tail:16", "recompute": "tail:16", "context_window": 5},
    {"name": "control: prompt, memories reversed", "serve_as": "prompt", "memory_order": "reversed"},
)
"""What ``eval fidelity`` measures when no ``--setting`` is given, besides the configured default."""

SETTING_FIELDS: tuple[str, ...] = (
    "name",
    "attention_scale",
    "temperature",
    "recompute",
    "position_buckets",
    "context_window",
    "storage_format",
    "first_memory_context_free",
    "encode_alone",
    "serve_as",
    "memory_order",
)
"""The fields of a ``--setting`` object (:class:`inferscale.eval.fidelity.FidelitySetting`'s), named in the help
without importing it (and torch) when the CLI starts."""


_TABLE_WIDTH = 220
"""Characters per line of the printed tables."""


@dataclass(frozen=True)
class FidelityOptions:
    """What ``inferscale eval fidelity`` runs; each field is its command-line option (flag and help in its metadata).

    Attributes:
        demo: run the bundled demo conversation.
        cases: JSON case files (``[{"memories": [...], "question": ...}, ...]``).
        locomo: a LoCoMo file; ``conversations``: its sample ids; ``questions``: questions per conversation.
        k: memories per question for retrieved slices.
        memory_layout: the order a retrieved slice's memories are laid out in, in both modes
            (:func:`inferscale.eval.fidelity_cases.retrieve_cases`); a cases file keeps its own.
        session_contexts: a retrieved slice's memories get the turns before them in their own session only as
            context, as the runs before run 23 measured, instead of what ``add`` records (earlier sessions' last
            memories first; :func:`inferscale.eval.fidelity_cases.memories_with_contexts`).
        system_prompts: names from :data:`inferscale.eval.system_prompts.SYSTEM_PROMPTS`.
        setting: settings to measure, as JSON objects (``None``: the default and :data:`STANDARD_SETTINGS`).
        calibrate: pick the attention scale on half the cases, report it on the other half.
        first_token_only: measure KL and agreement only.
        model, dtype, device: the chat model.
        max_new_tokens: answer budget (tokens).
        num_threads: torch CPU threads (``None``: torch's default).
        out_dir: output folder.
    """

    demo: bool = field(
        default=False,
        metadata=cli("--demo", action="store_true", help="run the bundled demo conversation and its questions"),
    )
    cases: tuple[str, ...] | None = field(
        default=None,
        metadata=cli(
            "--cases", action="append", metavar="FILE", help='a JSON list of {"memories": [...], "question": ...}'
        ),
    )
    locomo: str | None = field(
        default=None,
        metadata=cli("--locomo", metavar="PATH", help="a LoCoMo file (e.g. ../shared/data/locomo/locomo10.json)"),
    )
    conversations: tuple[str, ...] = field(
        default=("conv-26",),
        metadata=cli("--conversations", type=name_list, help="LoCoMo sample ids, comma-separated (default conv-26)"),
    )
    questions: int = field(
        default=40,
        metadata=cli(
            "--questions", type=positive_int, help="LoCoMo questions of categories 1-4 per conversation (default 40)"
        ),
    )
    k: int = field(
        default=10,
        metadata=cli("-k", "--k", type=positive_int, help="memories per question for retrieved slices (default 10)"),
    )
    memory_layout: MemoryLayout = field(
        default=MemoryConfig.model_fields["memory_layout"].default,
        metadata=cli(
            "--memory-layout",
            help="order of a retrieved slice's memories in both modes, as MemoryConfig.memory_layout: by retrieval "
            "score, best first, or as the conversation stored them, oldest first (default %(default)s; a --cases "
            "file keeps its order)",
        ),
    )
    session_contexts: bool = field(
        default=False,
        metadata=cli(
            "--session-contexts",
            action="store_true",
            help="give a retrieved slice's memories only the turns of their own session as context, as the runs "
            "before run 23 did (default: what add records, earlier sessions' last memories first)",
        ),
    )
    system_prompts: tuple[str, ...] = field(
        default=tuple(SYSTEM_PROMPTS),
        metadata=cli(
            "--system-prompts", type=name_list, help=f"comma-separated, from {', '.join(SYSTEM_PROMPTS)} (default all)"
        ),
    )
    setting: tuple[str, ...] | None = field(
        default=None,
        metadata=cli(
            "--setting",
            action="append",
            metavar="JSON",
            help="a setting to measure (repeatable; default: the configured default and a standard set)",
        ),
    )
    calibrate: bool = field(
        default=False,
        metadata=cli(
            "--calibrate",
            action="store_true",
            help="pick the attention scale s for this model on half the cases and report it on the other half "
            "(the first --setting gives the other fields)",
        ),
    )
    first_token_only: bool = field(
        default=False,
        metadata=cli("--first-token-only", action="store_true", help="measure KL and agreement only (no answers)"),
    )
    model: str | None = field(default=None, metadata=MODEL_OPTION)
    dtype: DType = field(default="float32", metadata=DTYPE_OPTION)
    device: str = field(default="cpu", metadata=DEVICE_OPTION)
    max_new_tokens: int = field(
        default=32, metadata=cli("--max-new-tokens", type=positive_int, help="answer budget in tokens (default 32)")
    )
    num_threads: int | None = field(default=None, metadata=THREADS_OPTION)
    out_dir: Path = field(
        default=Path("out/eval/fidelity"),
        metadata=cli("--out", type=output_folder, help="output folder (default out/eval/fidelity)"),
    )


def default_setting() -> dict[str, Any]:
    """The setting :class:`inferscale.config.KVConfig`'s defaults serve, as a ``--setting`` object."""
    from inferscale.config import KVConfig
    from inferscale.eval.fidelity import FidelitySetting

    return FidelitySetting.from_kv(KVConfig(), name="default").model_dump()


def _settings(raw: tuple[str, ...] | None) -> list[Any]:
    """The ``--setting`` objects as settings (default: the configured default and :data:`STANDARD_SETTINGS`).

    Raises:
        ConfigError: for text that is not a JSON object, an invalid field (each named, with its value), or two
            settings with the same label (their rows would be pooled as one).
    """
    from inferscale.eval.fidelity import FidelitySetting

    objects = [_setting_object(text) for text in raw] if raw else [default_setting(), *STANDARD_SETTINGS]
    settings = []
    for obj in objects:
        try:
            settings.append(FidelitySetting(**obj))
        except ValidationError as exc:
            problems = describe_errors(exc.errors(), lambda loc: loc or "setting")
            raise ConfigError(f"invalid --setting {quoted(json.dumps(obj))}: {problems}") from exc
    labels = [s.label for s in settings]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ConfigError(f'two --setting objects share the label {repeated[0]!r}: give each its own "name"')
    return settings


def _setting_object(text: str) -> dict[str, Any]:
    try:
        obj = loads_json(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--setting {quoted(text)} is not JSON ({exc.msg} at character {exc.pos})") from exc
    if not isinstance(obj, dict):
        raise ConfigError(f'--setting {quoted(text)} must be a JSON object, e.g. \'{{"recompute": "tail:16"}}\'')
    return obj


def _slices(opts: FidelityOptions, embedder: Any) -> list[Any]:
    from inferscale.eval.fidelity_cases import demo_cases, load_cases, locomo_cases

    retrieved = opts.demo or opts.locomo
    if opts.memory_layout != FidelityOptions.memory_layout and not retrieved:
        raise ConfigError("--memory-layout orders retrieved slices (--demo, --locomo); a --cases file keeps its order")
    if opts.session_contexts and not retrieved:
        raise ConfigError(
            "--session-contexts builds retrieved slices' contexts (--demo, --locomo); a --cases file gives its own"
        )
    across = not opts.session_contexts
    slices = []
    if opts.demo:
        slices.append(demo_cases(opts.k, embedder, opts.memory_layout, across_sessions=across))
    for path in opts.cases or ():
        slices.append(load_cases(path))
    if opts.locomo:
        for conversation in opts.conversations:
            slices.append(
                locomo_cases(
                    opts.locomo,
                    conversation,
                    opts.questions,
                    opts.k,
                    embedder,
                    opts.memory_layout,
                    across_sessions=across,
                )
            )
    if not slices:
        raise ConfigError("nothing to run: give --demo, --cases FILE and/or --locomo PATH")
    return slices


def _run(args: argparse.Namespace) -> int:
    import torch

    from inferscale.apps_extra import console as make_console
    from inferscale.apps_extra import fail
    from inferscale.config import EngineConfig
    from inferscale.engines.hf import load_causal_lm
    from inferscale.engines.transformers import TransformersEngine
    from inferscale.eval.fidelity import calibrate_scale, run_fidelity, summarize_rows
    from inferscale.eval.fidelity_report import fidelity_document, print_fidelity_table, write_fidelity_report
    from inferscale.retrieval.embedder import SentenceTransformerEmbedder

    opts = from_args(FidelityOptions, args)
    try:
        console = make_console(stderr=True)
        settings = _settings(opts.setting)
        unknown = [p for p in opts.system_prompts if p not in SYSTEM_PROMPTS]
        if unknown:
            raise ConfigError(f"unknown system prompt(s) {unknown}; choose from {sorted(SYSTEM_PROMPTS)}")
        if opts.num_threads:
            torch.set_num_threads(opts.num_threads)
        slices = _slices(opts, SentenceTransformerEmbedder(None, "cpu"))
        config = EngineConfig(model=opts.model, dtype=opts.dtype, device=opts.device)
        _, model, tokenizer = load_causal_lm(config, None)
        engines = {
            name: TransformersEngine(config, SYSTEM_PROMPTS[name], model=model, tokenizer=tokenizer)
            for name in opts.system_prompts
        }
        t0 = time.perf_counter()
        out = opts.out_dir
        if opts.calibrate:
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
                max_new_tokens=opts.max_new_tokens,
                generate=not opts.first_token_only,
                progress=status.update,
            )
    except (InferScaleError, ValueError) as exc:
        return fail(exc)
    summaries = summarize_rows(rows)
    pooled = summarize_rows(rows, by=("setting",))
    run = {
        "slices": [s.name for s in slices],
        "k": opts.k,
        "memory_layout": opts.memory_layout,
        "session_contexts": opts.session_contexts,
        "system_prompts": list(opts.system_prompts),
        "settings": [s.model_dump() for s in settings],
        "model": opts.model or "SmolLM2-135M-Instruct (embedded)",
        "dtype": opts.dtype,
        "max_new_tokens": opts.max_new_tokens,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    json_path, png_path = write_fidelity_report(out, fidelity_document(summaries, pooled, rows, run), pooled)
    wide = make_console(width=_TABLE_WIDTH)  # 18 columns: narrower terminals would fold every cell
    print_fidelity_table(summaries, "KV-injection fidelity per setting, slice and system prompt", wide)
    print_fidelity_table(pooled, "Pooled over slices and system prompts", wide)
    console.print(f"wrote {json_path} and {png_path} ({run['wall_s']} s)", style="dim")
    return 0


def add_fidelity_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``eval fidelity`` to the ``eval`` subparsers; returns its parser."""
    parser = subparsers.add_parser(
        "fidelity",
        help="KV injection vs pasted memories per serving setting: KL, agreement, answer F1, cost",
        description=(
            "Answer fixed (memories, question) cases with the memories pasted (prompt mode) and injected as K/V under "
            "each setting, at several system prompts, and report first-token KL(prompt || kv), top-1 agreement, F1 "
            "between the answers and against gold, budget-hit and repeat rates, added prefill tokens and TTFT. "
            f"A setting is a JSON object with any of the fields {{{', '.join(map(json.dumps, SETTING_FIELDS))}}}; "
            "a field left out takes the product's default (KVConfig's: {} is the default, "
            '{"context_window": 0} pure injection); '
            '{"serve_as": "prompt", "memory_order": "reversed"} is the control: prompt mode against itself with '
            "the memories in the opposite order."
        ),
    )
    add_options(parser, FidelityOptions).set_defaults(func=_run)
    return parser
