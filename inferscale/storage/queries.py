"""Every read of the memory store: the ``SELECT`` builders and the session functions that run them.

Each session function takes the caller's plain ``Session`` and returns detached records, so
:class:`~inferscale.storage.MemoryStore` calls it directly and
:class:`~inferscale.storage.async_store.AsyncMemoryStore` through its :mod:`~inferscale.storage.async_sessions` runner.
Arguments are expected to be validated already (:mod:`inferscale.storage.validation`).

Scope semantics: a memory is in a :class:`~inferscale.scope.Scope` when every id the scope sets is equal to the
memory's column (the ids are ANDed; ids the scope leaves unset are not constrained). Only the neighbours a new
memory is encoded after (:func:`latest_memories`) and the duplicate check (:func:`memories_with_hash`) use *exactly* a
scope, where an unset id must be unset too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import TypeVar

import numpy as np
from sqlalchemy import ColumnElement, Select, and_, case, select
from sqlalchemy.orm import Session

from inferscale.filters import Filter
from inferscale.scope import Scope
from inferscale.storage.filter_sql import compile_filter
from inferscale.storage.models import HistoryRow, KVEntryRow, MemoryRow
from inferscale.storage.records import (
    HeldId,
    HistoryRecord,
    KVEntryRecord,
    MemoryRecord,
    MemoryVersions,
    scope_of_ids,
)

IN_CHUNK = 500
"""Ids per ``IN (...)`` clause; stays far below SQLite's bound-parameter limit."""

_T = TypeVar("_T")


def chunks(values: Sequence[_T], size: int = IN_CHUNK) -> Iterator[Sequence[_T]]:
    """``values`` in consecutive slices of at most ``size`` items (for ``IN`` clauses)."""
    for start in range(0, len(values), size):
        yield values[start : start + size]


# ---- statement builders ----------------------------------------------------------------------------------------


def scope_clauses(scope: Scope | None) -> list[ColumnElement[bool]]:
    """The ``WHERE`` conditions that keep ``memories`` inside ``scope`` (none for ``None``)."""
    clauses: list[ColumnElement[bool]] = []
    if scope is None:
        return clauses
    if scope.user_id is not None:
        clauses.append(MemoryRow.user_id == scope.user_id)
    if scope.agent_id is not None:
        clauses.append(MemoryRow.agent_id == scope.agent_id)
    if scope.run_id is not None:
        clauses.append(MemoryRow.run_id == scope.run_id)
    return clauses


def exact_scope_clauses(scope: Scope) -> list[ColumnElement[bool]]:
    """The ``WHERE`` conditions that keep ``memories`` of exactly ``scope``: every id it sets equal, every id it
    leaves unset ``NULL`` (``Scope(agent_id="a")`` holds the agent's own memories, not those of its users or runs)."""
    columns = (MemoryRow.user_id, MemoryRow.agent_id, MemoryRow.run_id)
    ids = (scope.user_id, scope.agent_id, scope.run_id)
    return [column.is_(None) if value is None else column == value for column, value in zip(columns, ids, strict=True)]


def where_clauses(scope: Scope, node: Filter | None, dialect: str) -> list[ColumnElement[bool]]:
    """The ``WHERE`` conditions of a scope plus an optional filter compiled for ``dialect``."""
    clauses = scope_clauses(scope)
    if node is not None:
        clauses.append(compile_filter(node, dialect))
    return clauses


def select_memory(memory_id: str, scope: Scope | None = None) -> Select[MemoryRow]:
    """The memory with public id ``memory_id`` when it is in ``scope`` (any scope for ``None``)."""
    return select(MemoryRow).where(MemoryRow.id == memory_id, *scope_clauses(scope))


def select_memories(scope: Scope, node: Filter | None, dialect: str, limit: int | None) -> Select[MemoryRow]:
    """Memories of ``scope`` matching ``node``, oldest first, at most ``limit`` (all when ``None``)."""
    stmt = select(MemoryRow).where(*where_clauses(scope, node, dialect)).order_by(MemoryRow.created_at, MemoryRow.pk)
    return stmt.limit(limit) if limit is not None else stmt


def select_vector_ids(scope: Scope, node: Filter | None, dialect: str) -> Select[int]:
    """Vector ids of the memories of ``scope`` matching ``node``, ascending."""
    return select(MemoryRow.pk).where(*where_clauses(scope, node, dialect)).order_by(MemoryRow.pk)


def select_by_vector_ids(ids: Sequence[int]) -> Select[MemoryRow]:
    """Memories whose vector id is in ``ids`` (pass at most :data:`IN_CHUNK` ids per statement)."""
    return select(MemoryRow).where(MemoryRow.pk.in_(list(ids)))


def select_by_ids(memory_ids: Sequence[str]) -> Select[MemoryRow]:
    """Memories whose public id is in ``memory_ids`` (pass at most :data:`IN_CHUNK` ids per statement)."""
    return select(MemoryRow).where(MemoryRow.id.in_(list(memory_ids)))


def select_kv_entry(memory_id: str, fingerprint: str, encoding_key: str) -> Select[KVEntryRow]:
    """The KV entry of ``(memory_id, fingerprint, encoding_key)`` (unique)."""
    return select(KVEntryRow).where(
        KVEntryRow.memory_id == memory_id,
        KVEntryRow.fingerprint == fingerprint,
        KVEntryRow.encoding_key == encoding_key,
    )


def select_versions(scope: Scope | None, node: Filter | None, dialect: str) -> Select[int, str, str]:
    """``(vector_id, id, hash)`` of the memories of ``scope`` matching ``node`` (every memory for ``None``),
    ascending by vector id."""
    clauses = scope_clauses(scope)
    if node is not None:
        clauses.append(compile_filter(node, dialect))
    return select(MemoryRow.pk, MemoryRow.id, MemoryRow.hash).where(*clauses).order_by(MemoryRow.pk)


def _dialect(s: Session) -> str:
    return s.get_bind().dialect.name


# ---- session functions -----------------------------------------------------------------------------------------


def get_memory(s: Session, memory_id: str, scope: Scope | None = None) -> MemoryRecord | None:
    """The memory with public id ``memory_id``; ``None`` when there is none or it is outside ``scope``."""
    row = s.scalars(select_memory(memory_id, scope)).one_or_none()
    return MemoryRecord.from_row(row) if row is not None else None


def get_memories(s: Session, memory_ids: Sequence[str]) -> dict[str, MemoryRecord]:
    """The memories whose public id is in ``memory_ids`` (any scope), keyed by id; unknown ids are left out. One
    statement per :data:`IN_CHUNK` ids."""
    found: dict[str, MemoryRecord] = {}
    for chunk in chunks(memory_ids):
        found.update((row.id, MemoryRecord.from_row(row)) for row in s.scalars(select_by_ids(chunk)))
    return found


def memories_with_hash(s: Session, text_hash: str, scope: Scope, limit: int | None = None) -> list[MemoryRecord]:
    """The memories of exactly ``scope`` (an id it leaves unset is unset too) whose text hashes to ``text_hash``,
    oldest first, at most ``limit``. ``add``'s duplicate check reads the first, and must not take a fact of a
    narrower scope (a run of the user) for one of the scope, since that scope's ``delete_all`` would delete it; a
    chained memory finds the memories it is encoded on among them (:mod:`inferscale.chains`)."""
    stmt = (
        select(MemoryRow)
        .where(MemoryRow.hash == text_hash, *exact_scope_clauses(scope))
        .order_by(MemoryRow.created_at, MemoryRow.pk)
        .limit(limit)
    )
    return [MemoryRecord.from_row(row) for row in s.scalars(stmt)]


def list_memories(s: Session, scope: Scope, node: Filter | None, limit: int | None) -> list[MemoryRecord]:
    """The memories in ``scope`` that match ``node``, oldest first, at most ``limit`` (all when ``None``).

    Raises:
        ValueError: when ``node`` is set and the database is neither SQLite nor PostgreSQL.
    """
    return [MemoryRecord.from_row(row) for row in s.scalars(select_memories(scope, node, _dialect(s), limit))]


def latest_memories(s: Session, scope: Scope, limit: int) -> list[MemoryRecord]:
    """The ``limit`` memories of exactly ``scope`` stored last, oldest first: the neighbours a new memory of that scope
    is encoded after (context-window encoding). Exact, not ANDed: a memory of ``Scope(agent_id="a")`` is served to
    whoever reads agent ``a``'s own memories, so its K/V must never be encoded after a text of one of the agent's users
    (which would outlive that user's ``delete_all`` in them).

    "Stored last" is by ``pk``, the order the rows were inserted in (a scope's writers take turns: see
    :func:`~inferscale.storage.changes.apply_in_session`), which a user's index (``ix_memories_user_scope``) walks
    backwards: ordered by ``created_at`` first, every add sorted the whole scope (32 ms at 5,000 memories on SQLite,
    against 0.1 ms, a review's measurement), and a clock set back would reorder it."""
    return [MemoryRecord.from_row(row) for row in reversed(s.scalars(select_latest(scope, limit)).all())]


def select_latest(scope: Scope, limit: int) -> Select[MemoryRow]:
    """The ``SELECT`` of :func:`latest_memories`: the ``limit`` rows of exactly ``scope`` with the highest ``pk``,
    newest first."""
    return select(MemoryRow).where(*exact_scope_clauses(scope)).order_by(MemoryRow.pk.desc()).limit(limit)


def all_memories(s: Session) -> list[MemoryRecord]:
    """Every memory of every scope, in ``vector_id`` order."""
    return [MemoryRecord.from_row(row) for row in s.scalars(select(MemoryRow).order_by(MemoryRow.pk))]


def by_vector_ids(s: Session, ids: Sequence[int]) -> dict[int, MemoryRecord]:
    """The memories whose ``vector_id`` is in ``ids`` (ascending, no duplicates), keyed by vector id."""
    found: dict[int, MemoryRecord] = {}
    for chunk in chunks(ids):
        for row in s.scalars(select_by_vector_ids(chunk)):
            found[int(row.pk)] = MemoryRecord.from_row(row)
    return found


def vector_ids_in_scope(s: Session, scope: Scope, node: Filter | None) -> np.ndarray:
    """The vector ids of the memories in ``scope`` that match ``node``: an int64 array ``[n]``, ascending.

    Raises:
        ValueError: when ``node`` is set and the database is neither SQLite nor PostgreSQL.
    """
    ids = s.scalars(select_vector_ids(scope, node, _dialect(s))).all()
    return np.asarray(ids, dtype=np.int64).reshape(-1)


def memory_versions(s: Session, scope: Scope | None = None, node: Filter | None = None) -> MemoryVersions:
    """What each memory of ``scope`` matching ``node`` (every memory for ``None``) holds now, in the compact form
    the derived stores compare against: vector ids, public ids and text hashes, ascending by vector id.

    Raises:
        ValueError: when ``node`` is set and the database is neither SQLite nor PostgreSQL.
    """
    rows = s.execute(select_versions(scope, node, _dialect(s))).all()
    return MemoryVersions(
        np.asarray([row[0] for row in rows], dtype=np.int64).reshape(-1),
        tuple(row[1] for row in rows),
        tuple(row[2] for row in rows),
    )


def memory_states(s: Session, memory_ids: Sequence[str]) -> dict[str, bool]:
    """For each id among ``memory_ids`` that this database ever stored, whether it still holds it: ``True`` for a
    stored memory, ``False`` for a deleted one (only its history rows remain). Ids it never stored (another
    database's) are left out."""
    states: dict[str, bool] = {}
    for chunk in chunks(list(memory_ids)):
        states.update((memory_id, True) for memory_id in s.scalars(select(MemoryRow.id).where(MemoryRow.id.in_(chunk))))
        for memory_id in s.scalars(select(HistoryRow.memory_id).where(HistoryRow.memory_id.in_(chunk)).distinct()):
            states.setdefault(memory_id, False)
    return states


def all_kv_entries(s: Session) -> list[KVEntryRecord]:
    """Every KV entry, by row id."""
    return [KVEntryRecord.from_row(row) for row in s.scalars(select(KVEntryRow).order_by(KVEntryRow.id))]


def kv_entries_of(s: Session, memory_ids: Sequence[str]) -> list[KVEntryRecord]:
    """The KV entries of the memories ``memory_ids``, by row id. One statement per :data:`IN_CHUNK` ids."""
    found: list[KVEntryRecord] = []
    for chunk in chunks(memory_ids):
        rows = s.scalars(select(KVEntryRow).where(KVEntryRow.memory_id.in_(list(chunk))))
        found += [KVEntryRecord.from_row(row) for row in rows]
    return sorted(found, key=lambda entry: entry.id)


def history(s: Session, memory_id: str, scope: Scope | None = None) -> list[HistoryRecord]:
    """The changes to ``memory_id``, oldest first, when the memory was in ``scope`` (any scope for ``None``; also
    after it was deleted); ``[]`` for an unknown id or one outside ``scope``.

    Each row's scope is the one it recorded, whole, or, for a row that recorded none (written before revision
    0004_history_scope, or by an older InferScale still running), the live memory's (a deletion records it in those
    rows first). A memory deleted before that revision has no scope.
    """
    recorded = (HistoryRow.user_id, HistoryRow.agent_id, HistoryRow.run_id)
    live = (MemoryRow.user_id, MemoryRow.agent_id, MemoryRow.run_id)
    unrecorded = and_(*(column.is_(None) for column in recorded))
    ids = [
        case((unrecorded, own), else_=kept).label(f"scope_{kept.key}") for kept, own in zip(recorded, live, strict=True)
    ]
    given = (scope.user_id, scope.agent_id, scope.run_id) if scope is not None else (None, None, None)
    stmt = (
        select(HistoryRow, *ids)
        .outerjoin(MemoryRow, MemoryRow.id == HistoryRow.memory_id)
        .where(HistoryRow.memory_id == memory_id, *(c == v for c, v in zip(ids, given, strict=True) if v is not None))
        .order_by(HistoryRow.id)
    )
    records: list[HistoryRecord] = []
    seen = Counter[tuple[str, datetime]]()
    for r in s.execute(stmt):
        row = r[0]
        twin = seen[(row.event, row.created_at)]
        seen[(row.event, row.created_at)] += 1
        records.append(HistoryRecord.from_row(row, scope_of_ids(r[1], r[2], r[3]), twin))
    return records


def get_kv_entry(s: Session, memory_id: str, fingerprint: str, encoding_key: str) -> KVEntryRecord | None:
    """The KV entry of ``(memory_id, fingerprint, encoding_key)``, or ``None``."""
    row = s.scalars(select_kv_entry(memory_id, fingerprint, encoding_key)).one_or_none()
    return KVEntryRecord.from_row(row) if row is not None else None


def held_ids(s: Session, ids: Sequence[str]) -> dict[str, HeldId]:
    """What holds each of ``ids``, by id, in any scope: a live memory (its scope and text hash), or only the history
    of a deleted one; ids nothing names are left out."""
    wanted = sorted(set(ids))
    held: dict[str, HeldId] = {}
    for chunk in chunks(wanted):
        columns = (MemoryRow.id, MemoryRow.user_id, MemoryRow.agent_id, MemoryRow.run_id, MemoryRow.hash)
        for i, u, a, r, digest in s.execute(select(*columns).where(MemoryRow.id.in_(chunk))):
            held[i] = HeldId(Scope.of_row(u, a, r), digest)
    for chunk in chunks([i for i in wanted if i not in held]):
        gone = s.scalars(select(HistoryRow.memory_id).where(HistoryRow.memory_id.in_(chunk)).distinct())
        held.update((i, HeldId(None, None)) for i in gone)
    return held


__all__ = [
    "IN_CHUNK",
    "all_kv_entries",
    "all_memories",
    "by_vector_ids",
    "chunks",
    "exact_scope_clauses",
    "get_kv_entry",
    "get_memory",
    "held_ids",
    "history",
    "kv_entries_of",
    "latest_memories",
    "list_memories",
    "memories_with_hash",
    "memory_states",
    "memory_versions",
    "scope_clauses",
    "select_by_vector_ids",
    "select_kv_entry",
    "select_memories",
    "select_memory",
    "select_vector_ids",
    "select_versions",
    "vector_ids_in_scope",
    "where_clauses",
]
