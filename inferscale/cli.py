"""The ``inferscale`` command line: ``add | search | list | delete | history | chat | serve | keys | bench | eval |
demo``.

The memory and key commands live in :mod:`inferscale.commands` (their shared options declared once, as parent
parsers); ``serve`` in :mod:`inferscale.serve_cli`; ``bench`` and ``eval`` in :mod:`inferscale.bench.cli`. An
:class:`~inferscale.errors.InferScaleError` a command raises is printed as one red line ``error: <message>`` on
stderr, with exit code 2 for bad input and 1 for any other failure (:func:`inferscale.apps_extra.exit_code`); Ctrl-C
exits with 130.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from inferscale.cli_options import add_logging_options, add_options, from_args, log_level


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
    try:
        client = demo_client(data_dir, opts.context_window, opts.chain_block, opts.memory_layout)
    except InferScaleError as exc:
        return fail(exc)
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
    from inferscale.commands.chat import add_chat_parser
    from inferscale.commands.export import add_export_parser
    from inferscale.commands.keys import add_keys_parser
    from inferscale.commands.mem0_import import add_import_parser
    from inferscale.commands.memory import add_memory_parsers
    from inferscale.commands.options import parents
    from inferscale.commands.prepare import add_prepare_parser
    from inferscale.commands.prune import add_prune_parser
    from inferscale.demo import DemoOptions
    from inferscale.serve_cli import add_serve_parser

    parser = argparse.ArgumentParser(prog="inferscale", description="Memory for LLM agents with KV-injected recall.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    shared = parents()
    add_memory_parsers(sub, shared)
    add_chat_parser(sub, shared)
    add_prepare_parser(sub, shared)
    add_prune_parser(sub, shared)
    add_import_parser(sub, shared)
    add_export_parser(sub, shared)
    add_serve_parser(sub)
    add_keys_parser(sub, shared)
    add_bench_parser(sub)
    add_eval_parser(sub)
    demo = sub.add_parser("demo", help="add a conversation, then chat with KV-injected memory vs the prompt baseline")
    add_options(demo, DemoOptions).set_defaults(func=_demo)
    add_logging_options(parser)
    return parser


SIGPIPE_EXIT = 141
"""The exit code after the reader of stdout went away (``inferscale chat ... | head``): 128 + SIGPIPE, as a shell
reports a program that SIGPIPE ended."""


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``inferscale`` console script.

    When the reader of stdout goes away (``| head``), the rest of the output is dropped and the exit code is
    :data:`SIGPIPE_EXIT`, with no traceback: stdout is pointed at ``os.devnull`` so that Python's own flush at exit
    cannot fail again (the recipe of the Python docs, "Note on SIGPIPE" in :mod:`signal`). (argparse's ``--help``
    drops a failed write itself and exits 0.) Ctrl-C exits with 130 and no traceback, also while the modules load.
    """
    try:
        try:
            return _main(argv)
        finally:  # flush here, where a closed pipe is caught, not at interpreter exit
            sys.stdout.flush()
    except KeyboardInterrupt:  # Ctrl-C while the parser's modules load (seconds: torch), as after: no traceback
        return 130
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return SIGPIPE_EXIT


def _main(argv: list[str] | None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    level = log_level(args)
    logging.basicConfig(level=level.upper())
    if level not in ("debug", "info"):
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    from inferscale.apps_extra import fail
    from inferscale.errors import InferScaleError

    try:
        return int(args.func(args))
    except InferScaleError as exc:
        return fail(exc)
    except KeyboardInterrupt:  # Ctrl-C (e.g. during a streamed answer): the shell's code for SIGINT, no traceback
        return 130


if __name__ == "__main__":
    sys.exit(main())
