"""Mem0's change history, read for an import (:meth:`inferscale.MemoryClient.import_memories`'s ``history``,
``inferscale import-mem0 --history``), so a memory's ``history()`` here goes back to its first ``ADD`` in Mem0.

Mem0 keeps one table, ``history``, in a SQLite file (``history_db_path``, ``~/.mem0/history.db`` by default), shared
by every memory it ever stored: ``{"id", "memory_id", "old_memory", "new_memory", "event", "created_at",
"updated_at", "is_deleted", "actor_id", "role"}`` per row (``mem0/memory/storage.py``); ``Memory.history(id)``
returns a memory's rows in that shape. An ``ADD`` row is dated by its ``created_at``; an ``UPDATE`` row carries the
memory's ``created_at`` and the update's time as ``updated_at`` (``Memory._update_memory``), so it is dated by
``updated_at``.

InferScale's own ``history()`` rows are read too (an InferScale store moved to another database): they add
``old_metadata``, ``new_metadata`` and the memory's scope ids (:data:`INFERSCALE_ROW_KEYS`); each keeps its
``new_metadata``, and a row whose scope ids are not its memory's is refused.

Only the rows of the memories imported are read: the table also holds those of deleted memories and of every other
scope, which carry no scope and are left where they are. Mem0's rows keep no metadata but a change's ``role`` and
``actor_id``; each imported row shows the memory's metadata as imported with those two of its change
(:func:`inferscale.storage.history_rows.imported_history_rows`).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from inferscale.errors import InvalidInputError
from inferscale.json_text import loads_json
from inferscale.mem0_import import ImportedMemory, mem0_time, usable_path
from inferscale.scope import SCOPE_KEYS
from inferscale.storage.change_sets import PastChange
from inferscale.storage.validation import check_key, check_metadata, check_text, same_json

SQLITE_HEADER = b"SQLite format 3\x00"
"""The first 16 bytes of every SQLite database file."""
ROW_KEYS = frozenset(
    {"id", "memory_id", "old_memory", "new_memory", "event", "created_at", "updated_at", "is_deleted"}
    | {"actor_id", "role"}
)
"""The columns of Mem0's ``history`` table (``role`` and ``actor_id`` since Mem0 0.1.100)."""
INFERSCALE_ROW_KEYS = frozenset({"old_metadata", "new_metadata", *SCOPE_KEYS})
"""The keys InferScale's own ``history()`` rows add to Mem0's (an InferScale store moved to another database): the
metadata before and after each change, and the memory's scope ids."""


def with_history(memories: Sequence[ImportedMemory], rows: object, *, assume_utc: bool = False) -> list[ImportedMemory]:
    """``memories``, each with the changes Mem0's ``rows`` recorded for it as its history
    (:attr:`~inferscale.storage.NewMemory.history`); one without rows keeps the single ``ADD`` an import gives.

    Args:
        memories: the memories read for the import (:func:`~inferscale.mem0_import.mem0_memories`).
        rows: Mem0's history rows, every memory's together (:func:`read_mem0_history`, or the rows
            ``Memory.history(id)`` returned): a list of dicts. Rows of a memory not in ``memories`` are not read.
        assume_utc: read a time without a zone as UTC (Mem0 writes its own times with one).

    Returns:
        The memories, in the order given.

    Raises:
        InvalidInputError: ``rows`` that are not a list of dicts each with a str ``memory_id``; naming the memory
            and the row, for a row of an imported memory with a key that is not a str, an unknown key or event, a
            ``DELETE`` (Mem0 deleted the memory after the records were read: read them again), no time or one that
            is not ISO 8601 with a zone, or no text; for an InferScale row whose scope ids are not its memory's, whose
            ``new_metadata`` or ``old_metadata`` is not a JSON object, whose ``role`` or ``actor_id`` contradicts its
            ``new_metadata``, or whose ``old_metadata`` is not what the change before it left; and for a memory whose
            rows cannot be laid out as one ``ADD`` and then ``UPDATE``s each from the text the one before left
            (:func:`chained`), ending at the memory's text (the records and the history come from different stores, or
            different times). Two equal rows count once (an export that lists a memory under its user and under its
            agent lists its rows twice).
    """
    if isinstance(rows, str | bytes | Mapping) or not isinstance(rows, Sequence):
        raise InvalidInputError(f"history must be a list of Mem0 history rows, got {type(rows).__name__}")
    wanted = {m.memory_id for m in memories}
    by_memory: dict[str, list[tuple[int, Mapping[str, Any]]]] = {}
    for position, row in enumerate(rows):
        if not isinstance(row, Mapping) or not isinstance(row.get("memory_id"), str):
            raise InvalidInputError(f"history row {position}: a Mem0 history row is a dict with a str memory_id")
        if row["memory_id"] in wanted:
            by_memory.setdefault(row["memory_id"], []).append((position, row))
    return [_with_changes(m, by_memory[m.memory_id], assume_utc) if m.memory_id in by_memory else m for m in memories]


def _with_changes(
    imported: ImportedMemory, rows: Sequence[tuple[int, Mapping[str, Any]]], assume_utc: bool
) -> ImportedMemory:
    """``imported`` with its rows as its history, in the order their texts chain (:func:`chained`)."""
    changes: dict[PastChange, PastChange] = {}  # equal rows once, in order
    before: dict[int, tuple[int, dict[str, Any] | None]] = {}  # id of a change: its row, its old_metadata
    for position, row in rows:
        try:
            _check_scope(row, imported)
            change = _change(row, assume_utc)
            old = None if row.get("old_metadata") is None else check_metadata(row["old_metadata"])
        except InvalidInputError as error:
            raise InvalidInputError(f"history row {position} of memory {imported.memory_id}: {error}") from error
        kept = changes.setdefault(change, change)
        before.setdefault(id(kept), (position, old))
    # InferScale's rows (they record the metadata after each change) are in the order written, which their times
    # need not show (hosts' clocks differ); Mem0's are ordered by time, as before
    listed = all(c.metadata is not None for c in changes)
    order = {id(c): i for i, c in enumerate(changes)} if listed else None
    history = chained(imported.memory_id, list(changes), order)
    _check_old_metadata(imported.memory_id, history, before)
    text = imported.memory.text
    if history[-1].new_text != text:
        raise InvalidInputError(
            f"the history of memory {imported.memory_id} ends at {history[-1].new_text!r}, not at its text "
            f"{text!r}: the records and the history were read from different stores or at different times; read "
            "both again, or leave the history out"
        )
    return replace(imported, memory=replace(imported.memory, history=history))


def _check_old_metadata(
    memory_id: str, history: Sequence[PastChange], before: Mapping[int, tuple[int, dict[str, Any] | None]]
) -> None:
    """Refuse a row whose ``old_metadata`` (InferScale's rows) is not what the row before it in ``history`` left: an
    ADD has none, an UPDATE the ``new_metadata`` of the change before it, where that records one."""
    for i, change in enumerate(history):
        position, old = before[id(change)]
        left = None if i == 0 else history[i - 1].metadata
        if old is not None and (i == 0 or (left is not None and not same_json(old, left))):
            raise InvalidInputError(
                f"history row {position} of memory {memory_id}: its old_metadata {old!r} is not what the change "
                f"before it left ({left!r})"
            )


def _check_scope(row: Mapping[str, Any], imported: ImportedMemory) -> None:
    """Refuse an InferScale history row whose scope ids are not its memory's (rows of another scope's memory with
    the same id: the records and the rows come from different stores)."""
    held = imported.scope.as_dict()
    for key in SCOPE_KEYS:
        if key in row and row[key] != held.get(key):
            raise InvalidInputError(f"its {key} is {row[key]!r}, the memory's is {held.get(key)!r}")


def chained(
    memory_id: str, changes: Sequence[PastChange], order: Mapping[int, int] | None = None
) -> tuple[PastChange, ...]:
    """``changes`` (one ADD and UPDATEs, in any order) in an order their texts chain: the ADD, then UPDATEs each from
    the text the one before left, every UPDATE once. From each text the earliest UPDATE not yet taken comes first;
    where that walk would end before every UPDATE is taken (a text changed back, then on: A→B, B→A, A→C with A→C
    dated first), the UPDATEs it skipped are spliced in where their text was reached (Hierholzer's walk of an
    Eulerian trail, over the texts as nodes and the UPDATEs as edges).

    Their times alone do not give the order: Mem0 dates an ADD by the memory's ``created_at``, which a caller may set
    in its metadata (backdated, or from another clock), and an UPDATE by the time Mem0 made it; two rows of one
    second may be listed either way round. The times are kept as Mem0 recorded them. With ``order`` (``id`` of a
    change: its place in the rows, InferScale's, listed in the order written), that order ranks the UPDATEs instead
    of their times, which the clocks of several hosts writing one database need not keep in step.

    Raises:
        InvalidInputError: naming the memory, when there is not exactly one ADD, or no order takes every UPDATE
            (one is named that no order reaches).
    """
    adds = [c for c in changes if c.event == "ADD"]
    if len(adds) != 1:
        raise InvalidInputError(
            f"the history of memory {memory_id} has {len(adds)} ADD rows, where a memory has one: leave the "
            "history out to start it at one ADD"
        )
    updates = sorted(
        (c for c in changes if c.event == "UPDATE"), key=(lambda c: c.at) if order is None else (lambda c: order[id(c)])
    )
    waiting: dict[str | None, deque[PastChange]] = {}
    for change in updates:
        waiting.setdefault(change.old_text, deque()).append(change)
    walk: list[PastChange] = [adds[0]]  # Hierholzer: walk on while the current text has an UPDATE left
    trail: list[PastChange] = []
    while walk:
        following = waiting.get(walk[-1].new_text)
        if following:
            walk.append(following.popleft())
        else:
            trail.append(walk.pop())
    trail.reverse()
    if len(trail) != len(changes):
        taken = {id(c) for c in trail}
        stranded = next(c for c in updates if id(c) not in taken)
        raise InvalidInputError(
            f"the history of memory {memory_id} does not chain: its UPDATE of {stranded.at.isoformat()} from "
            f"{stranded.old_text!r} follows no row that left that text: leave the history out to start it at one "
            "ADD"
        )
    return tuple(trail)


def _change(row: Mapping[str, Any], assume_utc: bool) -> PastChange:
    """One row as a change."""
    if any(not isinstance(key, str) for key in row):
        raise InvalidInputError("a Mem0 history row's keys are strs")
    unknown = sorted(set(row) - ROW_KEYS - INFERSCALE_ROW_KEYS)
    if unknown:
        raise InvalidInputError(
            f"unknown keys {unknown} (Mem0's history rows have {sorted(ROW_KEYS)}, InferScale's also "
            f"{sorted(INFERSCALE_ROW_KEYS)})"
        )
    event = row.get("event")
    if event == "DELETE":
        raise InvalidInputError(
            "Mem0 deleted this memory after its records were read: read them again, or leave the memory out"
        )
    if event not in ("ADD", "UPDATE"):
        raise InvalidInputError(f"event {event!r} is none of Mem0's (ADD, UPDATE, DELETE)")
    created = mem0_time(row.get("created_at"), "created_at", assume_utc)
    updated = mem0_time(row.get("updated_at"), "updated_at", assume_utc)
    at: datetime | None = (created or updated) if event == "ADD" else (updated or created)
    if at is None:
        raise InvalidInputError("no time: neither created_at nor updated_at is set")
    old = None if event == "ADD" else check_text(row.get("old_memory"), "old_memory")
    said = {key: None if row.get(key) is None else check_key(row.get(key), key) for key in ("actor_id", "role")}
    metadata = None if row.get("new_metadata") is None else check_metadata(row["new_metadata"])
    for key, value in said.items():  # an InferScale row keeps its role and actor_id in its metadata too
        if metadata is not None and value is not None and key in metadata and metadata[key] != value:
            raise InvalidInputError(f"its {key} is {value!r}, its new_metadata's {metadata[key]!r}")
    new = check_text(row.get("new_memory"), "new_memory")
    return PastChange(event, old, new, at, said["actor_id"], said["role"], metadata)


def read_mem0_history(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a Mem0 history: its SQLite file (``history_db_path``; opened read-only), or a JSON file of rows
    as ``Memory.history(id)`` returns them, every memory's in one list.

    Raises:
        InvalidInputError: when the path is not a readable file, a SQLite file has no ``history`` table, or a JSON
            file holds no list.
    """
    source = usable_path(path)
    try:
        with source.open("rb") as file:
            header = file.read(len(SQLITE_HEADER))
    except (OSError, ValueError) as error:  # missing, a folder, unreadable; a NUL in the path
        raise InvalidInputError(f"{source} cannot be read as Mem0's history: {error}") from None
    if header == SQLITE_HEADER:
        return _sqlite_rows(source)
    try:
        loaded = loads_json(source.read_text(encoding="utf-8"))
    except ValueError as error:
        raise InvalidInputError(f"{source} is neither Mem0's history.db nor JSON: {error}") from None
    if not isinstance(loaded, list):
        raise InvalidInputError(f"{source} holds no list of Mem0 history rows")
    return loaded


def _sqlite_rows(source: Path) -> list[dict[str, Any]]:
    """Every row of the ``history`` table of the SQLite file ``source``, opened read-only, in the order written."""
    try:
        with contextlib.closing(sqlite3.connect(f"{source.resolve().as_uri()}?mode=ro", uri=True)) as connection:
            connection.row_factory = sqlite3.Row
            return [dict(row) for row in connection.execute("SELECT * FROM history ORDER BY rowid")]
    except sqlite3.DatabaseError as error:  # no history table, a damaged file, a lock held past the timeout
        raise InvalidInputError(f"{source} cannot be read as Mem0's history.db: {error}") from None


__all__ = ["read_mem0_history", "with_history"]
