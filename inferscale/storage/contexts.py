"""Stored contexts hold only texts their scope still holds: the SQL side of "a deletion stays deleted".

A memory's ``context`` (the turns its K/V are encoded after, context-window encoding) starts with the texts of the
memories stored before it in exactly its scope, its *neighbours*, copied when it is added. A neighbour's text thus
outlives the neighbour unless it is removed too. The rule, applied inside the transaction that makes the change
(:func:`inferscale.storage.changes.apply_in_session`):

- when a text leaves a scope (its memory is deleted or re-worded, and no other memory of exactly that scope holds
  it), every memory of that scope whose context holds it as an entry loses that entry (and its ``kv_entries``
  rows: its K/V are encoded again, under the key of the new context);
- a new memory's neighbours are checked when it is written: a neighbour text that left the scope after it was read
  (a deletion committed in between) is dropped.

Only entries equal to a memory's text are removed. The turns an ``add(infer=True)`` call renders from its own
conversation (``"user: ..."``) stay with the memories extracted from it: they are those memories' own source, and go
with them. ``delete_all`` needs no scrub: it deletes every memory of each exact scope it touches (any memory of a
deleted memory's exact scope is in the deleted scope too), and ``reset`` deletes everything.

Locks: on PostgreSQL every change set that deletes or re-words memories, or adds to a scope, first takes the
advisory lock of each exact scope involved (:func:`context_lock_key`), so a scrub and an add of the same scope take
turns: the add either commits first (and the scrub then sees it) or sees the deletion (and drops the text). SQLite's
writers take turns already.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Sequence

from sqlalchemy import Text, cast, or_, select
from sqlalchemy.orm import Session

from inferscale.scope import Scope
from inferscale.storage.locks import advisory_key
from inferscale.storage.models import MemoryRow
from inferscale.storage.queries import chunks, exact_scope_clauses
from inferscale.storage.records import hash_text


def context_lock_key(scope: Scope) -> int:
    """The advisory-lock key of the stored contexts of exactly ``scope`` (:func:`advisory_key`)."""
    return advisory_key("inferscale.contexts", scope.key())


def scope_of(row: MemoryRow) -> Scope:
    """The exact scope of a stored memory (every row sets at least one id)."""
    return Scope.of_row(row.user_id, row.agent_id, row.run_id)


def live_hashes(s: Session, scope: Scope, hashes: Collection[str]) -> set[str]:
    """Those of ``hashes`` (sha256 hex, :func:`hash_text`) that a memory of exactly ``scope`` holds now."""
    live: set[str] = set()
    for chunk in chunks(sorted(hashes)):
        stmt = select(MemoryRow.hash).where(*exact_scope_clauses(scope), MemoryRow.hash.in_(chunk)).distinct()
        live.update(s.scalars(stmt))
    return live


def context_holders(s: Session, scope: Scope, texts: Iterable[str]) -> list[str]:
    """The ids of the memories of exactly ``scope`` whose stored context may hold one of ``texts`` as an entry (a
    superset: the caller checks each entry), ascending.

    The ``context`` column is JSON text written by :func:`json.dumps`, where an entry ``t`` appears as
    ``json.dumps(t)``; both escapings of non-ASCII text are looked for, so a serializer with ``ensure_ascii=False``
    is no miss either. One scan of the scope's rows, in SQL, on both backends.
    """
    patterns = sorted({json.dumps(t, ensure_ascii=ascii_only) for t in texts for ascii_only in (True, False)})
    if not patterns:
        return []
    column = cast(MemoryRow.context, Text)
    found: set[str] = set()
    for chunk in chunks(patterns, 50):
        matches = or_(*(column.contains(p, autoescape=True) for p in chunk))
        found.update(s.scalars(select(MemoryRow.id).where(*exact_scope_clauses(scope), matches)))
    return sorted(found)


def without_texts(context: Sequence[str], gone: Collection[str]) -> list[str] | None:
    """``context`` without its entries in ``gone``, or ``None`` when it holds none of them."""
    kept = [turn for turn in context if turn not in gone]
    return kept if len(kept) != len(context) else None


def chain_start(chain_from: int | None, kept: Sequence[bool]) -> int | None:
    """Where a memory's chain starts once only the context entries whose flag in ``kept`` (one per entry, in order)
    is true stay: ``chain_from`` less the entries before it that go (``None`` stays ``None``). The chain's own texts
    shift with the turns before them, so the memory stays chained on the same memories, less those that went."""
    if chain_from is None:
        return None
    return sum(kept[:chain_from])


def live_neighbours(context: Sequence[str], neighbours: int, live: Collection[str]) -> list[str]:
    """``context`` with those of its first ``neighbours`` entries dropped whose :func:`hash_text` is not in
    ``live`` (the text left the scope after the add read it)."""
    kept = [turn for turn in context[:neighbours] if hash_text(turn) in live]
    return [*kept, *context[neighbours:]]


__all__ = [
    "chain_start",
    "context_holders",
    "context_lock_key",
    "live_hashes",
    "live_neighbours",
    "scope_of",
    "without_texts",
]
