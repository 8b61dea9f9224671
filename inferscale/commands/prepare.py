"""``inferscale prepare-kv``: encode now the K/V that chats would encode on first use (``MemoryClient.prepare_kv``).

For a local store only: after a change of model, dtype or ``kv`` settings, or on a data dir written by an older
version, run it where the store is (a server's too, with its ``--data-dir``/``--db-url``) before serving chats.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Any, cast

from inferscale.cli_options import from_args
from inferscale.commands.options import RemoteOptions
from inferscale.commands.run import run_call
from inferscale.errors import InvalidInputError

if TYPE_CHECKING:
    from rich.console import Console

    from inferscale.client import MemoryClient
    from inferscale.commands.client import CommandClient
    from inferscale.commands.options import Common, Parents

__all__ = ["add_prepare_parser"]


def _prepare(args: argparse.Namespace) -> int:
    if from_args(RemoteOptions, args).host is not None:
        raise InvalidInputError(
            "prepare-kv encodes into a local store: run it with that store's --data-dir/--db-url, not --host"
        )

    def call(client: CommandClient, common: Common) -> dict[str, Any]:
        local = cast("MemoryClient", client)  # no --host: open_client built the local client
        return dataclasses.asdict(local.prepare_kv(**common.scope.ids()))

    def show(value: dict[str, Any], common: Common, out: Console) -> None:
        from inferscale.commands.output import count

        ids = common.scope.ids()
        whose = common.scope.describe() if any(ids.values()) else "every scope"
        looked = count(value["memories"], "memory", "memories")
        out.print(f"encoded the K/V of {count(value['encoded'], 'memory', 'memories')} ({looked} of {whose})")
        if value["left"]:
            out.print(
                f"left {count(len(value['left']), 'memory', 'memories')} without K/V (too long for the model's "
                f"context with its context turns, or changed meanwhile): {', '.join(value['left'])}"
            )

    return run_call(args, call, show, "encoding (the first call loads the model)")


def add_prepare_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], parents: Parents) -> None:
    """Add ``prepare-kv`` to the ``inferscale`` subcommand parsers."""
    prepare = sub.add_parser(
        "prepare-kv",
        parents=parents.memory,
        help="encode now the K/V chats would encode on first use (the scope's memories; every memory without a "
        "scope flag)",
    )
    prepare.set_defaults(func=_prepare)
