"""``inferscale chat QUERY``: answer a question with the scope's memories (KV-injected, or pasted with
``--mode prompt``), whole or streamed.

Human output: the answer on stdout (with ``--stream``, each piece as it is generated), then the memories used and
the timings on stderr. ``--json``: the :class:`~inferscale.types.ChatResult` as one JSON object; with ``--stream``
one JSON line per :class:`~inferscale.types.ChatChunk` (``{"delta", "result"}``; ``result`` only on the last).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from inferscale.cli_options import add_options, cli, from_args, positive_int
from inferscale.commands.options import Common, Parents, SelectOptions
from inferscale.commands.run import opened, run_call
from inferscale.types import ChatMode

if TYPE_CHECKING:
    from rich.console import Console

    from inferscale.commands.client import CommandClient
    from inferscale.types import ChatResult

__all__ = ["ChatArguments", "ChatOptions", "add_chat_parser"]

_BUSY = "retrieving and prefilling (the first call loads the models)"


class ChatArguments(TypedDict):
    """The keyword arguments of ``MemoryClient.chat`` the command sets, besides the scope and ``stream``."""

    filters: dict[str, Any] | None
    limit: int | None
    mode: ChatMode
    max_new_tokens: int | None
    temperature: float | None
    seed: int | None


@dataclass(frozen=True)
class ChatOptions:
    """``inferscale chat``'s own options (with ``--filters`` and ``--limit``)."""

    query: str = field(metadata=cli("QUERY", help="the question"))
    mode: ChatMode = field(
        default="kv",
        metadata=cli("--mode", help="kv: inject the memories' K/V; prompt: paste them into the prompt (default kv)"),
    )
    stream: bool = field(
        default=False, metadata=cli("--stream", action="store_true", help="print the answer as it is generated")
    )
    max_new_tokens: int | None = field(
        default=None,
        metadata=cli(
            "--max-new-tokens", type=positive_int, metavar="N", help="answer budget in tokens (default: the engine's)"
        ),
    )
    temperature: float | None = field(
        default=None, metadata=cli("--temperature", metavar="T", help="sampling temperature (default 0: greedy)")
    )
    seed: int | None = field(
        default=None, metadata=cli("--seed", metavar="N", help="sampling seed, for repeatable samples")
    )

    def arguments(self, select: SelectOptions) -> ChatArguments:
        """The keyword arguments of ``MemoryClient.chat`` these options and ``select`` give (scope ids aside)."""
        return ChatArguments(
            filters=select.filters,
            limit=select.limit,
            mode=self.mode,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            seed=self.seed,
        )


def _report(result: ChatResult, err: Console) -> None:
    """The memories a chat used and its timings, dim, on stderr."""
    from inferscale.commands.output import count, terminal_safe

    for memory in result.memories:
        err.print(f"  • {terminal_safe(memory)}", style="dim", markup=False, highlight=False)
    used = count(len(result.memory_ids), "memory", "memories")
    err.print(
        f"{result.mode} · {used} · TTFT {result.timings.ttft_ms:.0f} ms · "
        f"{result.generated_tokens} tokens ({result.finish_reason}) in {result.timings.total_ms:.0f} ms",
        style="dim",
        highlight=False,
    )


def _whole(args: argparse.Namespace, opts: ChatOptions, select: SelectOptions) -> int:
    def call(client: CommandClient, common: Common) -> ChatResult:
        return client.chat(opts.query, **common.scope.ids(), **opts.arguments(select))

    def show(result: ChatResult, common: Common, out: Console) -> None:
        from inferscale.commands.output import stderr, terminal_safe

        out.print(terminal_safe(result.answer), markup=False, highlight=False)
        _report(result, stderr())

    return run_call(args, call, show, _BUSY)


def _streamed(args: argparse.Namespace, opts: ChatOptions, select: SelectOptions) -> int:
    """The answer piece by piece as it is generated: a spinner until the first piece, then each piece as it comes
    (a JSON line per chunk with ``--json``), then the memories used and the timings."""
    from inferscale.commands.output import print_json, stderr, terminal_safe, working

    result: ChatResult | None = None
    with opened(args) as (client, common):
        as_json = common.output.as_json
        with working(None if as_json else _BUSY):  # until the first piece of the answer
            chunks = client.chat(opts.query, **common.scope.ids(), **opts.arguments(select), stream=True)
            first = next(chunks, None)
        for chunk in itertools.chain(() if first is None else (first,), chunks):
            if as_json:
                print_json(chunk)
            else:
                sys.stdout.write(terminal_safe(chunk.delta))
                sys.stdout.flush()
            result = chunk.result or result
    if not as_json:
        sys.stdout.write("\n")
        if result is not None:
            _report(result, stderr())
    return 0


def _chat(args: argparse.Namespace) -> int:
    opts = from_args(ChatOptions, args)
    select = from_args(SelectOptions, args)
    return _streamed(args, opts, select) if opts.stream else _whole(args, opts, select)


def add_chat_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], parents: Parents) -> None:
    """Add ``chat`` to the ``inferscale`` subcommand parsers."""
    chat = sub.add_parser(
        "chat", parents=parents.memory + parents.select, help="answer a question with the scope's memories"
    )
    add_options(chat, ChatOptions).set_defaults(func=_chat)
