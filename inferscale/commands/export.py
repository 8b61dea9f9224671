"""``inferscale export DIR``: write a local store's memories and their history as JSON, to move the store to another
database (SQLite to PostgreSQL, say) with ``inferscale import-mem0``.

Two files in ``DIR``: ``memories.json``, the memories as ``get_all`` returns them (every scope, or those of the scope
flags), oldest first, and ``history.json``, every row of their ``history()``. ``import-mem0 DIR/memories.json
--history DIR/history.json`` on the other store brings them over with their ids, scopes, metadata, times and
history (``MemoryClient.import_memories``). Deleted memories stay behind, and K/V are not exported: the other store
encodes them again.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from inferscale.arguments import optional_scope
from inferscale.commands.options import LOCAL_ONLY
from inferscale.commands.run import run_call
from inferscale.errors import InferScaleError, InvalidInputError

if TYPE_CHECKING:
    from rich.console import Console

    from inferscale.client import MemoryClient
    from inferscale.commands.client import CommandClient
    from inferscale.commands.options import Common, Parents
    from inferscale.scope import Scope
    from inferscale.storage import MemoryRecord

__all__ = ["EXPORT_FILES", "add_export_parser", "export_store"]

EXPORT_FILES = ("memories.json", "history.json")
"""The files ``inferscale export`` writes: the memories, then their history rows."""


def export_store(client: MemoryClient, scope: Scope | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The memories of ``scope`` in ``client``'s store (every scope's for ``None``), oldest first, as ``get_all``
    returns them, and every row of their history, each memory's oldest first.

    The memories and each one's history are separate reads, so another process may change a memory in between: a
    memory that changed while its history was read is read again (one deleted meanwhile is left out), so that the
    two files agree, as ``import-mem0`` requires. About a millisecond per memory on SQLite.

    Returns:
        ``(memories, history_rows)``.

    Raises:
        InferScaleError: when a memory still changes under three reads in a row (run the export again).
    """
    if scope is not None:
        records = client.db.list(scope)  # the scope as get_all reads it
    else:
        records = sorted(client.db.all_memories(), key=lambda r: (r.created_at, r.id))
    memories: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for record in records:
        pair = _agreeing(client, record)
        if pair is not None:
            memories.append(pair[0])
            rows += pair[1]
    return memories, rows


def _agreeing(client: MemoryClient, listed: MemoryRecord) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """The memory ``listed`` (as the listing read it) and its history rows, read until the memory is the same before
    and after its history was read (``None`` when it was deleted meanwhile)."""
    from inferscale.results import memory_to_dict

    before = memory_to_dict(listed)
    for _ in range(3):
        rows = client.history(listed.id)
        after = client.db.get(listed.id)
        if after is None or (rows and rows[-1]["event"] == "DELETE"):
            return None
        memory = memory_to_dict(after)
        if memory == before:  # unchanged while its history was read
            return memory, rows
        before = memory
    raise InferScaleError(f"memory {listed.id} kept changing while it was exported; run the export again")


def _export(args: argparse.Namespace) -> int:
    folder = Path(args.folder)

    def call(client: CommandClient, common: Common) -> dict[str, Any]:
        taken = [name for name in EXPORT_FILES if (folder / name).exists()]
        if taken:
            raise InvalidInputError(f"{folder} holds {', '.join(taken)} already; export into an empty folder")
        local = cast("MemoryClient", client)  # the parser offers no --host: open_client built the local client
        scope = optional_scope(**common.scope.ids())  # an empty or blank id is refused, as by every command
        memories, rows = export_store(local, scope)
        folder.mkdir(parents=True, exist_ok=True)
        for name, value in zip(EXPORT_FILES, (memories, rows), strict=True):
            (folder / name).write_text(json.dumps(value, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        return {"memories": len(memories), "history_rows": len(rows), "folder": str(folder)}

    def show(value: dict[str, Any], common: Common, out: Console) -> None:
        from inferscale.commands.output import count
        from inferscale.terminal_text import terminal_safe

        whose = common.scope.describe(none="every scope")
        memories = count(value["memories"], "memory", "memories")
        rows = count(value["history_rows"], "history row", "history rows")
        where = terminal_safe(value["folder"])
        out.print(f"exported {memories} ({whose}) and {rows} to {where}", markup=False, highlight=False)
        memories_file, history_file = (
            terminal_safe(shlex.quote(str(Path(value["folder"]) / name))) for name in EXPORT_FILES
        )
        out.print(
            f"import them into another store: inferscale import-mem0 {memories_file} --history {history_file} "
            "--db-url URL --data-dir ANOTHER_DIR",
            markup=False,
            highlight=False,
        )

    return run_call(args, call, show, "exporting")


def add_export_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], parents: Parents) -> None:
    """Add ``export`` to the ``inferscale`` subcommand parsers."""
    export = sub.add_parser(
        "export",
        parents=parents.local,
        help="write the store's memories (every scope without a scope flag) and their history as JSON into a folder, "
        "for import-mem0 into another store",
    )
    export.add_argument("folder", metavar="DIR", help=f"where to write {' and '.join(EXPORT_FILES)} (created)")
    export.set_defaults(func=_export, **LOCAL_ONLY)
