"""The ``inferscale serve`` subcommand: an OpenAI-compatible server whose chat answers use KV-injected memory."""

from __future__ import annotations

import argparse


def add_serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``serve`` on the ``inferscale`` subcommand parsers; returns its parser."""
    serve = sub.add_parser("serve", help="OpenAI-compatible server answering chats with KV-injected memory")
    serve.add_argument("--engine", choices=["vllm"], default="vllm", help="serving engine (default vllm)")
    serve.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="listen port (default 8000)")
    serve.add_argument("--data-dir", help="memory database, index and K/V folder (default <home>/data)")
    serve.add_argument("--model", help="model folder (default: the embedded SmolLM2-135M-Instruct)")
    serve.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="bfloat16")
    serve.add_argument("--limit", type=int, default=5, help="memories retrieved per request (default 5)")
    serve.add_argument("--max-model-len", type=int, default=4096, help="context limit in tokens (default 4096)")
    serve.add_argument(
        "--kv-cache-bytes", type=int, default=2 << 30, help="vLLM paged KV cache size in bytes (default 2 GiB)"
    )
    serve.add_argument("--served-model-name", help="model name clients send (default: the folder name)")
    serve.set_defaults(func=run_serve)
    return serve


def run_serve(args: argparse.Namespace) -> int:
    """Start the server (blocks until interrupted); returns the exit status."""
    from inferscale.server.vllm_memory import ServeOptions, serve

    serve(
        ServeOptions(
            host=args.host,
            port=args.port,
            data_dir=args.data_dir,
            model=args.model,
            dtype=args.dtype,
            limit=args.limit,
            max_model_len=args.max_model_len,
            kv_cache_bytes=args.kv_cache_bytes,
            served_model_name=args.served_model_name,
        )
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m inferscale.serve_cli serve ...`` (the same as ``inferscale serve`` once wired into the CLI)."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = argparse.ArgumentParser(prog="inferscale")
    add_serve_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
