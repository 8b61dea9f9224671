"""The ``inferscale`` command line."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from inferscale.cli_options import add_options, from_args


def _demo(args: argparse.Namespace) -> int:
    from inferscale.apps_extra import console as make_console
    from inferscale.apps_extra import fail
    from inferscale.config import inferscale_home
    from inferscale.demo import DemoOptions, bundled_script, demo_client, locomo_script, run_demo
    from inferscale.errors import InferScaleError

    opts = from_args(DemoOptions, args)
    try:
        console = make_console(stderr=opts.as_json)
        script = locomo_script(opts.locomo, opts.conversation, opts.questions) if opts.locomo else bundled_script()
    except InferScaleError as exc:
        return fail(exc)
    t0 = time.perf_counter()
    data_dir = Path(opts.data_dir) if opts.data_dir else inferscale_home() / "demo"
    client = demo_client(data_dir, opts.context_window)
    with console.status("loading models (the first run converts SmolLM2 from GGUF, about a minute)"):
        client.engine.load()
    console.print(f"models ready in {time.perf_counter() - t0:.1f} s", style="dim")
    run_demo(script, client, k=opts.k, infer=opts.infer, as_json=opts.as_json, console=console)
    console.print(f"demo wall time {time.perf_counter() - t0:.1f} s", style="dim")
    client.close()
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``inferscale``."""
    from inferscale.bench.cli import add_bench_parser, add_eval_parser
    from inferscale.demo import DemoOptions
    from inferscale.serve_cli import add_serve_parser

    parser = argparse.ArgumentParser(prog="inferscale", description="Memory for LLM agents with KV-injected recall.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="add a conversation, then chat with KV-injected memory vs the prompt baseline")
    add_options(demo, DemoOptions).set_defaults(func=_demo)
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
