"""The ``inferscale serve`` subcommand: the memory REST API and an OpenAI-compatible chat server whose answers use
KV-injected memory, on the transformers engine in process (default) or on vLLM."""

from __future__ import annotations

import argparse
import logging
from typing import TypeVar, get_args

from inferscale.cli_options import add_logging_options, given_log_level, integer, log_level, number
from inferscale.config import DType, MemoryLayout
from inferscale.server.key_checks import DEFAULT_FAILED_KEY_CHECK_BURST, DEFAULT_FAILED_KEY_CHECKS_PER_S
from inferscale.server.options import DEFAULT_MAX_REQUEST_BYTES, DEFAULT_SHUTDOWN_GRACE_S, MAX_PORT

ENGINE_FLAGS: dict[str, tuple[str, ...]] = {
    "transformers": ("device", "max_request_bytes"),
    "vllm": ("max_model_len", "kv_cache_bytes"),
}
"""The flags (argparse destinations) only one engine reads; setting one for the other engine is refused."""


def add_serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``serve`` on the ``inferscale`` subcommand parsers; returns its parser."""
    serve = sub.add_parser(
        "serve", help="memory REST API + OpenAI-compatible chat server with KV-injected memory (docs/server.md)"
    )
    serve.add_argument(
        "--engine",
        choices=["transformers", "vllm"],
        default="transformers",
        help="transformers: the InferScale server in process (default); vllm: vLLM's server with the memory "
        "middleware (docs/vllm.md)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=integer, default=8000, help="listen port (default 8000)")
    serve.add_argument(
        "--config",
        metavar="FILE",
        help="a JSON file of the memory client's config, as MemoryClient(config=...) takes it (our fields or Mem0's "
        "shape: the extraction llm, embedder, kv settings, system prompt, ...); the flags given override it",
    )
    serve.add_argument("--data-dir", help="memory database, index and K/V folder (default <home>/data)")
    serve.add_argument("--db-url", help="memory database URL, API keys included (default <data-dir>/memory.db)")
    serve.add_argument("--model", help="model folder (default: the embedded SmolLM2-135M-Instruct)")
    serve.add_argument(
        "--dtype",
        choices=list(get_args(DType)),
        help="weights and K/V dtype (default auto: bfloat16 where the hardware runs it faster, else float32)",
    )
    serve.add_argument("--device", help="transformers engine only: cpu, cuda, cuda:N or auto (default)")
    serve.add_argument("--limit", type=integer, help="memories retrieved per chat request (default 5)")
    serve.add_argument(
        "--max-request-bytes",
        type=integer,
        help=f"transformers engine only: largest request body (default {DEFAULT_MAX_REQUEST_BYTES:,} bytes)",
    )
    serve.add_argument("--max-model-len", type=integer, help="vLLM only: context limit in tokens (default 4096)")
    serve.add_argument("--kv-cache-bytes", type=integer, help="vLLM only: paged KV cache size in bytes (default 2 GiB)")
    serve.add_argument("--served-model-name", help="model name clients send (default: the folder name)")
    serve.add_argument(
        "--recompute",
        metavar="POLICY",
        help="kv.recompute: memory tokens prefilled again per request, e.g. tail:16 (default none; vLLM serves "
        "none and tail:N)",
    )
    serve.add_argument(
        "--memory-layout",
        choices=list(get_args(MemoryLayout)),
        help="memory_layout: the order of each chat's retrieved memories: score (best first, the default) or added "
        "(oldest first)",
    )
    serve.add_argument(
        "--shutdown-grace",
        type=number,
        metavar="SECONDS",
        help="on SIGTERM or Ctrl-C, how long the shutdown may take: running requests finish within it (then they "
        "are cancelled), and the background K/V encoder works for what is left, plus the chunk it is encoding "
        f"(default {DEFAULT_SHUTDOWN_GRACE_S:g}; at most 86400; 0 cancels and stops at once)",
    )
    serve.add_argument(
        "--failed-key-checks-per-s",
        type=number,
        metavar="N",
        help="API key checks that may fail per second, once the burst is spent; past it a key the server has not "
        f"verified before gets 429 at once (default {DEFAULT_FAILED_KEY_CHECKS_PER_S:g})",
    )
    serve.add_argument(
        "--failed-key-check-burst",
        type=integer,
        metavar="N",
        help=f"API key checks that may fail back to back (default {DEFAULT_FAILED_KEY_CHECK_BURST})",
    )
    serve.set_defaults(func=run_serve)
    return serve


def run_serve(args: argparse.Namespace) -> int:
    """Start the server (blocks until interrupted); returns the exit status, with ``error: <reason>`` on stderr as
    every command prints it (:func:`~inferscale.apps_extra.fail`): 2 when the options are refused (a flag of the other
    engine, a public host with no API key, the ``server`` extra not installed, ...), 1 when the server cannot start (a
    database it cannot reach)."""
    from inferscale.apps_extra import fail
    from inferscale.engines.availability import check_server
    from inferscale.errors import InferScaleError

    try:
        check_engine_flags(args)
        check_port_free(args.host, args.port)
        check_server()  # both servers: vLLM's imports the memory middleware's errors (asgi-correlation-id) too
        if args.engine == "vllm":
            _serve_vllm(args)
        else:
            _serve_transformers(args)
    except InferScaleError as exc:
        return fail(exc)
    return 0


def check_engine_flags(args: argparse.Namespace) -> None:
    """Refuse a flag the chosen engine would ignore (:data:`ENGINE_FLAGS`).

    Raises:
        ConfigError: naming the flag, its engine and the chosen one.
    """
    from inferscale.errors import ConfigError

    for engine, flags in ENGINE_FLAGS.items():
        if engine == args.engine:
            continue
        given = [f"--{flag.replace('_', '-')}" for flag in flags if getattr(args, flag, None) is not None]
        if given:
            raise ConfigError(
                f"--engine {args.engine} does not use {', '.join(given)} (--engine {engine} only); "
                f"leave {'it' if len(given) == 1 else 'them'} out"
            )


def check_port_free(host: str, port: int) -> None:
    """Refuse a ``host:port`` this process cannot listen on (another process has the port, or the host is no address
    of this machine) before the model loads: the server would find it only after loading the model, and exit with
    uvicorn's status 3. A bind taken and released at once, with ``SO_REUSEADDR`` as uvicorn sets it, so a port left
    in ``TIME_WAIT`` passes.

    Raises:
        ConfigError: naming the address and the system's reason.
    """
    import errno
    import socket

    from inferscale.errors import ConfigError

    if not 0 <= port <= MAX_PORT:
        return  # the server's options refuse it, naming the range
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:  # in use; an address this machine does not have or cannot resolve
            advice = (
                "another process has the port: stop it, or give another --port"
                if error.errno == errno.EADDRINUSE
                else "give an address of this machine (--host)"
            )
            raise ConfigError(f"cannot listen on {host}:{port}: {error.strerror or error}; {advice}") from None
        except (TypeError, ValueError, UnicodeError) as error:  # a NUL in the host, a name IDNA cannot encode
            raise ConfigError(f"cannot listen on {host!r}: {error}; give an address of this machine (--host)") from None


T = TypeVar("T")


def _or(given: T | None, default: T) -> T:
    """A flag's value when it was given, else the options' own default."""
    return default if given is None else given


def _serve_transformers(args: argparse.Namespace) -> None:
    from inferscale.server.options import ServerOptions
    from inferscale.server.run import serve_transformers

    defaults = ServerOptions()
    serve_transformers(
        ServerOptions(
            host=args.host,
            port=args.port,
            data_dir=args.data_dir,
            db_url=args.db_url,
            model=args.model,
            dtype=args.dtype,
            chat_limit=args.limit,
            served_model_name=args.served_model_name,
            recompute=args.recompute,
            memory_layout=args.memory_layout,
            device=args.device,
            max_request_bytes=_or(args.max_request_bytes, defaults.max_request_bytes),
            shutdown_grace_s=_or(args.shutdown_grace, defaults.shutdown_grace_s),
            failed_key_checks_per_s=_or(args.failed_key_checks_per_s, defaults.failed_key_checks_per_s),
            failed_key_check_burst=_or(args.failed_key_check_burst, defaults.failed_key_check_burst),
            config_file=args.config,
            log_level=_or(given_log_level(args), defaults.log_level),
        )
    )


def _serve_vllm(args: argparse.Namespace) -> None:
    from inferscale.engines.availability import check_engine

    check_engine("vllm")  # before the import below, which needs vLLM: a missing one is a ConfigError, not a traceback
    from inferscale.server.vllm_memory import ServeOptions, serve

    defaults = ServeOptions()
    if args.config is not None:  # the file's vLLM limits, where no flag gives them
        from inferscale.mem0_config import config_from_file

        engine = config_from_file(args.config).engine
        defaults = ServeOptions(
            max_model_len=engine.max_model_len or defaults.max_model_len,
            kv_cache_bytes=engine.kv_cache_bytes or defaults.kv_cache_bytes,
        )
    serve(
        ServeOptions(
            host=args.host,
            port=args.port,
            data_dir=args.data_dir,
            db_url=args.db_url,
            model=args.model,
            dtype=args.dtype,
            served_model_name=args.served_model_name,
            recompute=args.recompute,
            memory_layout=args.memory_layout,
            limit=_or(args.limit, defaults.limit),
            max_model_len=_or(args.max_model_len, defaults.max_model_len),
            kv_cache_bytes=_or(args.kv_cache_bytes, defaults.kv_cache_bytes),
            shutdown_grace_s=_or(args.shutdown_grace, defaults.shutdown_grace_s),
            failed_key_checks_per_s=_or(args.failed_key_checks_per_s, defaults.failed_key_checks_per_s),
            failed_key_check_burst=_or(args.failed_key_check_burst, defaults.failed_key_check_burst),
            config_file=args.config,
            log_level=_or(given_log_level(args), defaults.log_level),
        )
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m inferscale.serve_cli serve ...`` (the same as ``inferscale serve`` once wired into the CLI)."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = argparse.ArgumentParser(prog="inferscale")
    add_serve_parser(parser.add_subparsers(dest="command", required=True))
    add_logging_options(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=log_level(args).upper())
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
