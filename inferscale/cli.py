"""The ``inferscale`` command line."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from rich.console import Console

from inferscale.config import KVConfig


def _demo(args: argparse.Namespace) -> int:
    from inferscale.demo import bundled_script, demo_client, locomo_script, run_demo

    console = Console(stderr=args.json)
    script = locomo_script(args.locomo, args.conversation, args.questions) if args.locomo else bundled_script()
    t0 = time.perf_counter()
    from inferscale.config import inferscale_home

    data_dir = Path(args.data_dir) if args.data_dir else inferscale_home() / "demo"
    client = demo_client(data_dir, args.context_window)
    with console.status("loading models (the first run converts SmolLM2 from GGUF, about a minute)"):
        client.engine.load()  # type: ignore[attr-defined]
    console.print(f"models ready in {time.perf_counter() - t0:.1f} s", style="dim")
    run_demo(script, client, k=args.k, infer=args.infer, as_json=args.json, console=console)
    console.print(f"demo wall time {time.perf_counter() - t0:.1f} s", style="dim")
    client.close()
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``inferscale``."""
    parser = argparse.ArgumentParser(prog="inferscale", description="Memory for LLM agents with KV-injected recall.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="add a conversation, then chat with KV-injected memory vs the prompt baseline")
    demo.add_argument("--json", action="store_true", help="print one JSON object per question on stdout")
    demo.add_argument("-k", type=int, default=5, help="memories retrieved per question (default 5)")
    demo.add_argument(
        "--infer",
        action=argparse.BooleanOptionalAction,
        default=False,
        help=(
            "extract facts with the LLM (--infer) or store each message as it is (default: the embedded 135M "
            "model extracts facts poorly, so the demo stores messages verbatim unless asked)"
        ),
    )
    demo.add_argument(
        "--context-window",
        type=int,
        default=KVConfig.model_fields["context_window"].default,
        help="w: preceding turns each fact is encoded after (default: KVConfig's, %(default)s)",
    )
    demo.add_argument("--locomo", metavar="PATH", help="run on a LoCoMo file instead of the bundled conversation")
    demo.add_argument("--conversation", default="conv-26", help="LoCoMo sample_id (default conv-26)")
    demo.add_argument("--questions", type=int, default=5, help="LoCoMo questions to ask (default 5)")
    demo.add_argument("--data-dir", help="where the demo's database, index and K/V go (default <home>/demo)")
    demo.set_defaults(func=_demo)

    from inferscale.bench.cli import add_bench_parser, add_eval_parser
    from inferscale.serve_cli import add_serve_parser

    add_bench_parser(sub)
    add_eval_parser(sub)
    add_serve_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``inferscale`` console script."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    if not args.verbose:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
