"""``inferscale prune-kv``: remove the stored K/V no chat under this store's model and settings looks up
(``MemoryClient.prune_kv``).

For a local store only (no ``--host``): after a change of model, dtype or ``kv`` settings (``kv.storage_format``
among them), or an upgrade, run ``prepare-kv`` and then this, with the model and settings the chats use: the app's
config file (``--config``), or for a server's store the server's own ``--data-dir``/``--db-url``, ``--model`` and
``--dtype``. Entries under any other key are removed.
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

__all__ = ["add_prune_parser"]


def _prune(args: argparse.Namespace) -> int:
    def call(client: CommandClient, common: Common) -> dict[str, Any]:
        local = cast("MemoryClient", client)  # the parser offers no --host: open_client built the local client
        return dataclasses.asdict(local.prune_kv(**common.scope.ids(), dry_run=args.dry_run))

    def show(value: dict[str, Any], common: Common, out: Console) -> None:
        from inferscale.commands.output import count

        whose = common.scope.describe(none="every scope")
        looked = count(value["memories"], "memory", "memories")
        removed = count(value["entries_removed"], "K/V entry", "K/V entries")
        megabytes = value["bytes_removed"] / 1e6
        verb = "would remove (dry run: nothing removed)" if value["dry_run"] else "removed"
        out.print(f"{verb} {removed}, {megabytes:.1f} MB, that no chat looks up ({looked} of {whose})")

    return run_call(args, call, show, "pruning (the first call loads the model)")


def add_prune_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], parents: Parents) -> None:
    """Add ``prune-kv`` to the ``inferscale`` subcommand parsers."""
    prune = sub.add_parser(
        "prune-kv",
        parents=parents.local,
        help="remove the stored K/V of the scope's memories (every memory without a scope flag) that no chat under "
        "this store's model and settings looks up: entries of another storage format, model or kv setting",
    )
    prune.add_argument(
        "--dry-run", action="store_true", help="remove nothing: report what would be removed (entries, rows, bytes)"
    )
    prune.set_defaults(func=_prune, **LOCAL_ONLY)
