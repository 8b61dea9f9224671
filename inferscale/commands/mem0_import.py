"""``inferscale import-mem0``: move the memories a Mem0 store holds into the local store
(:meth:`MemoryClient.import_memories <inferscale.MemoryClient.import_memories>`).

For a local store only (no ``--host``). It reads Mem0's local Qdrant folder (its default store) or faiss folder (the
vector store's ``path`` setting), a faiss docstore ``<collection>.json``, or a JSON file of Mem0 memories as
``get_all`` returns them (the way out of every other Mem0 vector store); Mem0's files are only read. Scope flags
import only the memories of that scope (ids ANDed, as ``inferscale list``); every record is checked all the same,
and an error names a record by its place in the file. Run it again after an interruption: what it stored is
skipped. ``--history`` reads Mem0's history as well.
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from inferscale.cli_options import add_options, cli, from_args
from inferscale.commands.options import LOCAL_ONLY
from inferscale.commands.run import run_call
from inferscale.mem0_config import DEFAULT_COLLECTION

if TYPE_CHECKING:
    from rich.console import Console

    from inferscale.client import MemoryClient
    from inferscale.commands.client import CommandClient
    from inferscale.commands.options import Common, Parents

__all__ = ["ImportOptions", "add_import_parser"]


@dataclass(frozen=True)
class ImportOptions:
    """``inferscale import-mem0``'s own options."""

    source: str = field(
        metadata=cli(
            "PATH",
            help="Mem0's local Qdrant folder (its default store) or faiss folder (the vector store's path), a faiss "
            "<collection>.json, or a JSON file of Mem0 memories (what Memory.get_all returns)",
        )
    )
    collection: str = field(
        default=DEFAULT_COLLECTION,
        metadata=cli("--collection", metavar="NAME", help="the collection_name, for a folder (default: mem0)"),
    )
    assume_utc: bool = field(
        default=False,
        metadata=cli(
            "--assume-utc",
            action="store_true",
            help="read a time without a zone as UTC (Mem0 keeps a created_at given in metadata as it was given); "
            "by default such a record is refused",
        ),
    )
    history: str | None = field(
        default=None,
        metadata=cli(
            "--history",
            metavar="FILE",
            help="Mem0's history.db (its history_db_path, ~/.mem0/history.db by default), or a JSON list of the rows "
            "Memory.history returns: each memory's history then starts at its ADD in Mem0; by default at one ADD",
        ),
    )
    encode_kv: bool | None = field(
        default=None,
        metadata=cli(
            "--encode-kv",
            action=argparse.BooleanOptionalAction,
            help="encode the memories' K/V now, or on first use with --no-encode-kv (faster for a large store; "
            "prepare-kv encodes them later); default: the store's kv.encode_on_add",
        ),
    )


def _import(args: argparse.Namespace) -> int:
    opts = from_args(ImportOptions, args)

    def call(client: CommandClient, common: Common) -> dict[str, list[dict[str, Any]]]:
        from inferscale.mem0_history import read_mem0_history
        from inferscale.mem0_import import read_mem0_file

        local = cast("MemoryClient", client)  # the parser offers no --host: open_client built the local client
        records = read_mem0_file(opts.source, opts.collection)
        history = read_mem0_history(opts.history) if opts.history is not None else None
        return local.import_memories(
            records, **common.scope.ids(), assume_utc=opts.assume_utc, encode_kv=opts.encode_kv, history=history
        )

    def show(value: dict[str, list[dict[str, Any]]], common: Common, out: Console) -> None:
        from inferscale.commands.output import count

        out.print(f"imported {count(len(value['results']), 'memory', 'memories')} from {opts.source}")
        reasons = Counter(skipped["reason"] for skipped in value["skipped"])
        for reason, n in reasons.items():
            out.print(f"skipped {count(n, 'memory', 'memories')}: {reason} (--json lists their ids)")

    return run_call(args, call, show, "importing (the first call loads the models)", creates_store=True)


def add_import_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], parents: Parents) -> None:
    """Add ``import-mem0`` to the ``inferscale`` subcommand parsers."""
    parser = sub.add_parser(
        "import-mem0",
        parents=parents.local,
        help="move the memories a Mem0 store holds (its faiss folder, or a JSON file of get_all's results) into "
        "this store, with their ids, scopes, metadata and times",
    )
    add_options(parser, ImportOptions).set_defaults(func=_import, **LOCAL_ONLY)
