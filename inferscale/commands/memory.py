"""``inferscale add | search | list | delete | history``: the memory API from the command line.

Each command makes one client call, with the scope flags as ``user_id``/``agent_id``/``run_id``, and prints its
return value: as JSON with ``--json`` (exactly that value, nothing else on stdout), else as a rich table. Errors
the client raises are printed by ``inferscale.cli.main`` as one line (exit 2 for bad input, 1 otherwise).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inferscale.cli_options import add_options, cli, from_args
from inferscale.commands.options import Common, Parents, SelectOptions, json_object
from inferscale.commands.run import run_call
from inferscale.errors import InvalidInputError

if TYPE_CHECKING:
    from rich.console import Console

    from inferscale.commands.client import CommandClient

__all__ = ["AddOptions", "DeleteOptions", "HistoryOptions", "SearchOptions", "add_memory_parsers"]


@dataclass(frozen=True)
class AddOptions:
    """``inferscale add``'s own options."""

    text: str = field(metadata=cli("TEXT", help="what to remember: one user message"))
    infer: bool = field(
        default=True,
        metadata=cli(
            "--infer",
            action=argparse.BooleanOptionalAction,
            help="extract facts with the LLM (default, as MemoryClient.add) or store the text as it is",
        ),
    )
    metadata: dict[str, Any] | None = field(
        default=None,
        metadata=cli("--metadata", type=json_object, metavar="JSON", help='a JSON object, e.g. \'{"topic": "pets"}\''),
    )
    prompt: str | None = field(
        default=None,
        metadata=cli(
            "--prompt",
            metavar="TEXT",
            help="custom instructions for this extraction (MemoryClient.add's prompt; needs --infer)",
        ),
    )


@dataclass(frozen=True)
class SearchOptions:
    """``inferscale search``'s own options (with ``--filters`` and ``--limit``)."""

    query: str = field(metadata=cli("QUERY", help="the text to match"))
    threshold: float | None = field(
        default=None, metadata=cli("--threshold", metavar="SCORE", help="drop results scoring below it (cosine)")
    )


@dataclass(frozen=True)
class DeleteOptions:
    """``inferscale delete``'s own options: one memory, or every memory of the scope."""

    memory_id: str | None = field(default=None, metadata=cli("ID", nargs="?", help="the memory to delete"))
    every: bool = field(
        default=False,
        metadata=cli("--all", action="store_true", help="delete every memory of the scope (needs a scope flag)"),
    )


@dataclass(frozen=True)
class HistoryOptions:
    """``inferscale history``'s own options."""

    memory_id: str = field(metadata=cli("ID", help="the memory whose changes to show"))


# ---------------------------------------------------------------------------------------------------- add


def _add(args: argparse.Namespace) -> int:
    opts = from_args(AddOptions, args)

    def call(client: CommandClient, common: Common) -> dict[str, list[dict[str, Any]]]:
        return client.add(opts.text, **common.scope.ids(), metadata=opts.metadata, infer=opts.infer, prompt=opts.prompt)

    def show(value: dict[str, list[dict[str, Any]]], common: Common, out: Console) -> None:
        from inferscale.commands.output import changes_table, count

        changes = value["results"]
        if not changes:
            out.print(f"nothing changed for {common.scope.describe()}: it is already remembered")
            return
        out.print(changes_table(changes, f"{count(len(changes), 'change', 'changes')} for {common.scope.describe()}"))

    verb = "extracting facts" if opts.infer else "adding"
    return run_call(args, call, show, f"{verb} (the first call loads the models)", creates_store=True)


# ---------------------------------------------------------------------------------------------------- search, list


Found = dict[str, list[dict[str, Any]]]
"""What ``search`` and ``get_all`` return: ``{"results": [memory dict, ...]}``."""


def _show_found(about: str = "") -> Callable[[Found, Common, Console], None]:
    """How ``search`` and ``list`` show their memories: a table titled ``"3 memories of user=alice<about>"``."""

    def show(value: Found, common: Common, out: Console) -> None:
        from inferscale.commands.output import count, memories_table

        found = value["results"]
        title = f"{count(len(found), 'memory', 'memories')} of {common.scope.describe()}{about}"
        out.print(memories_table(found, title, out.width))

    return show


def _search(args: argparse.Namespace) -> int:
    opts = from_args(SearchOptions, args)
    select = from_args(SelectOptions, args)

    def call(client: CommandClient, common: Common) -> Found:
        return client.search(
            opts.query, **common.scope.ids(), filters=select.filters, limit=select.limit, threshold=opts.threshold
        )

    return run_call(args, call, _show_found(f" for {opts.query!r}"), "searching (the first call loads the embedder)")


def _list(args: argparse.Namespace) -> int:
    select = from_args(SelectOptions, args)

    def call(client: CommandClient, common: Common) -> Found:
        return client.get_all(**common.scope.ids(), filters=select.filters, limit=select.limit)

    return run_call(args, call, _show_found(), "reading")


# ---------------------------------------------------------------------------------------------------- delete, history


def _delete(args: argparse.Namespace) -> int:
    opts = from_args(DeleteOptions, args)
    if (opts.memory_id is None) == (not opts.every):
        raise InvalidInputError("give a memory ID to delete one memory, or --all (with a scope flag) for all of them")

    def call(client: CommandClient, common: Common) -> dict[str, Any]:
        if opts.memory_id is not None:
            return client.delete(opts.memory_id, **common.scope.ids())
        return client.delete_all(**common.scope.ids())  # raises ScopeError without a scope: never "everything"

    def show(value: dict[str, Any], common: Common, out: Console) -> None:
        if opts.memory_id is not None:
            out.print(f"deleted memory {opts.memory_id}")
        else:
            from inferscale.commands.output import count

            out.print(f"deleted {count(value['deleted'], 'memory', 'memories')} of {common.scope.describe()}")

    return run_call(args, call, show, "deleting")


def _history(args: argparse.Namespace) -> int:
    opts = from_args(HistoryOptions, args)

    def call(client: CommandClient, common: Common) -> list[dict[str, Any]]:
        return client.history(opts.memory_id, **common.scope.ids())

    def show(value: list[dict[str, Any]], common: Common, out: Console) -> None:
        from inferscale.commands.output import count, history_table

        out.print(history_table(value, f"{count(len(value), 'change', 'changes')} to memory {opts.memory_id}"))

    return run_call(args, call, show, "reading")


# ---------------------------------------------------------------------------------------------------- parsers


def add_memory_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser], parents: Parents) -> None:
    """Add ``add``, ``search``, ``list``, ``delete`` and ``history`` to the ``inferscale`` subcommand parsers."""
    add = sub.add_parser(
        "add", parents=parents.memory, help="remember a message (the LLM extracts facts; --no-infer stores it as is)"
    )
    add_options(add, AddOptions).set_defaults(func=_add)
    search = sub.add_parser(
        "search", parents=parents.memory + parents.select, help="the scope's memories most similar to a query"
    )
    add_options(search, SearchOptions).set_defaults(func=_search)
    listing = sub.add_parser("list", parents=parents.memory + parents.select, help="the scope's memories, oldest first")
    listing.set_defaults(func=_list)
    delete = sub.add_parser(
        "delete", parents=parents.memory, help="delete one memory by id, or every memory of the scope (--all)"
    )
    add_options(delete, DeleteOptions).set_defaults(func=_delete)
    history = sub.add_parser("history", parents=parents.memory, help="every change to one memory, oldest first")
    add_options(history, HistoryOptions).set_defaults(func=_history)
