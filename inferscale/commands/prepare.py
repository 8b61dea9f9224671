"""``inferscale prepare-kv``: encode now the K/V that chats would encode on first use (``MemoryClient.prepare_kv``).

For a local store only (no ``--host``): after a change of model, dtype or ``kv`` settings, or on a data dir written
by an older version, run it before serving chats, with the model and settings the chats will use: the app's config
file (``--config``), or for a server's store the server's own ``--data-dir``/``--db-url``, ``--model`` and
``--dtype``. K/V are keyed by them.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Any, cast

from inferscale.commands.options import LOCAL_ONLY
from inferscale.commands.run import run_call

if TYPE_CHECKING:
    from rich.console import Console

    from inferscale.client import MemoryClient
    from inferscale.commands.client import CommandClient
    from inferscale.commands.options import Common, Parents

__all__ = ["add_prepare_parser"]


def _prepare(args: argparse.Namespace) -> int:
    def call(client: CommandClient, common: Common) -> dict[str, Any]:
        local = cast("MemoryClient", client)  # the parser offers no --host: open_client built the local client
        return dataclasses.asdict(local.prepare_kv(**common.scope.ids()))

    def show(value: dict[str, Any], common: Common, out: Console) -> None:
        from inferscale.commands.output import count

        whose = common.scope.describe(none="every scope")
        looked = count(value["memories"], "memory", "memories")
        out.print(f"encoded the K/V of {count(value['encoded'], 'memory', 'memories')} ({looked} of {whose})")
        if value["left"]:
            out.print(
                f"left {count(len(value['left']), 'memory', 'memories')} without K/V (too long for the model's "
                f"context even without its context turns, or changed meanwhile): {', '.join(value['left'])}"
            )

    return run_call(args, call, show, "encoding (the first call loads the model)")


def add_prepare_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], parents: Parents) -> None:
    """Add ``prepare-kv`` to the ``inferscale`` subcommand parsers."""
    prepare = sub.add_parser(
        "prepare-kv",
        parents=parents.local,
        help="encode now the K/V chats would encode on first use (the scope's memories; every memory without a "
        "scope flag), under this store's model and settings",
    )
    prepare.set_defaults(func=_prepare, **LOCAL_ONLY)
