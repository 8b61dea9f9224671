"""Atomic change sets and the statements shared by the sync and async stores.

A :class:`ChangeSet` (adds, updates, deletes in one scope) is applied by :func:`apply_in_session` inside one
transaction: either every row and history row is written, or none is. The function takes a plain ``Session`` so
that :class:`~inferscale.storage.MemoryStore` runs it directly and
:class:`~inferscale.storage.AsyncMemoryStore` runs it through ``AsyncSession.run_sync`` (same SQL, async I/O).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, Select, delete, select
from sqlalchemy.orm import Session

from inferscale.errors import InvalidInputError, MemoryNotFoundError
from inferscale.filters import Filter
from inferscale.scope import Scope
from inferscale.storage.filter_sql import compile_filter
from inferscale.storage.models import HistoryRow, KVEntryRow, MemoryRow, utc_now
from inferscale.storage.repository import (
    MemoryRecord,
    _check_actor,
    _check_context,
    _check_id,
    _check_metadata,
    _check_text,
    _chunks,
    _json_copy,
    _scope_clauses,
    hash_text,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class NewMemory:
    """A memory to add.

    Attributes:
        text: the fact, stored as given.
        metadata: JSON-serialisable user metadata (never scope ids).
        context: the conversation turns the fact's KV is encoded after (oldest first).
    """

    text: str
    metadata: dict[str, Any] = field(default_factory=dict)
    context: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class MemoryUpdate:
    """A change to an existing memory: a new text, new metadata (replaces the dict), or both."""

    memory_id: str
    text: str | None = None
    metadata: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ChangeSet:
    """Changes applied in one transaction.

    Attributes:
        scope: the scope adds are written in and updates/deletes must belong to; ``None`` only for a set
            without adds (an update or delete by id).
        adds, updates, deletes: the changes; deletes name memory ids.
        actor: who made the changes, recorded in every history row.
        strict: raise :class:`MemoryNotFoundError` for an update or delete of an unknown id (explicit calls);
            otherwise such a change is skipped with a warning (LLM decisions).
        skip_duplicates: an add whose text is already stored in the scope is skipped (no row, no history).
    """

    scope: Scope | None
    adds: tuple[NewMemory, ...] = ()
    updates: tuple[MemoryUpdate, ...] = ()
    deletes: tuple[str, ...] = ()
    actor: str | None = None
    strict: bool = False
    skip_duplicates: bool = True


@dataclass(frozen=True, slots=True)
class AppliedChanges:
    """What a :class:`ChangeSet` did.

    Attributes:
        added: the new memories, in the order of ``adds`` (skipped duplicates left out).
        updated: ``(before, after)`` pairs, in the order of ``updates`` (no-op updates left out).
        deleted: the memories as they were before deletion.
        skipped: one human-readable reason per change that was not applied.
    """

    added: list[MemoryRecord]
    updated: list[tuple[MemoryRecord, MemoryRecord]]
    deleted: list[MemoryRecord]
    skipped: list[str]


def validate_changes(changes: ChangeSet) -> ChangeSet:
    """Check every text, id and metadata dict before anything is written.

    Returns:
        The change set with metadata deep-copied into plain JSON values.

    Raises:
        InvalidInputError: for an empty text, a bad id, non-JSON metadata, an update with nothing to change, or
            adds without a scope.
    """
    if changes.adds and changes.scope is None:
        raise InvalidInputError("adding memories needs a scope (user_id, agent_id or run_id)")
    adds = tuple(
        NewMemory(_check_text(a.text), _check_metadata(a.metadata), tuple(_check_context(list(a.context))))
        for a in changes.adds
    )
    updates: list[MemoryUpdate] = []
    for u in changes.updates:
        if u.text is None and u.metadata is None:
            raise InvalidInputError(f"nothing to update for memory {u.memory_id!r}: pass text, metadata or both")
        updates.append(
            MemoryUpdate(
                _check_id(u.memory_id),
                _check_text(u.text) if u.text is not None else None,
                _check_metadata(u.metadata) if u.metadata is not None else None,
            )
        )
    deletes = tuple(_check_id(d) for d in changes.deletes)
    _check_actor(changes.actor)
    return ChangeSet(
        changes.scope, adds, tuple(updates), deletes, changes.actor, changes.strict, changes.skip_duplicates
    )


def _history(
    memory_id: str, event: str, before: MemoryRecord | None, after: MemoryRow | None, actor: str | None, now: Any
) -> HistoryRow:
    return HistoryRow(
        memory_id=memory_id,
        event=event,
        old_text=before.text if before is not None else None,
        new_text=after.text if after is not None else None,
        old_metadata=_json_copy(before.metadata) if before is not None else None,
        new_metadata=_json_copy(after.metadata_) if after is not None else None,
        actor=actor,
        created_at=now,
    )


def _missing(changes: ChangeSet, what: str, memory_id: str, skipped: list[str]) -> None:
    reason = f"{what} of memory {memory_id!r} skipped: no such memory in scope {changes.scope}"
    if changes.strict:
        raise MemoryNotFoundError(f"no memory with id {memory_id!r}")
    log.warning(reason)
    skipped.append(reason)


def apply_in_session(s: Session, changes: ChangeSet) -> AppliedChanges:
    """Apply a validated change set inside the caller's transaction (deletes, then updates, then adds).

    Returns:
        :class:`AppliedChanges`.

    Raises:
        MemoryNotFoundError: with ``strict``, when an update or delete names an unknown id (the caller's
            transaction then rolls back: nothing is written).
    """
    now = utc_now()
    scope_clauses = _scope_clauses(changes.scope) if changes.scope is not None else []
    skipped: list[str] = []
    deleted: list[MemoryRecord] = []
    for memory_id in dict.fromkeys(changes.deletes):
        row = s.scalars(select(MemoryRow).where(MemoryRow.id == memory_id, *scope_clauses).with_for_update()).first()
        if row is None:
            _missing(changes, "DELETE", memory_id, skipped)
            continue
        record = MemoryRecord.from_row(row)
        s.execute(
            delete(KVEntryRow).where(KVEntryRow.memory_id == memory_id).execution_options(synchronize_session=False)
        )
        s.delete(row)
        s.add(_history(memory_id, "DELETE", record, None, changes.actor, now))
        deleted.append(record)
    gone = {d.id for d in deleted}
    updated: list[tuple[MemoryRecord, MemoryRecord]] = []
    for update in changes.updates:
        if update.memory_id in gone:
            skipped.append(f"UPDATE of memory {update.memory_id!r} skipped: it is deleted in the same change set")
            continue
        stmt = select(MemoryRow).where(MemoryRow.id == update.memory_id, *scope_clauses).with_for_update()
        row = s.scalars(stmt).first()
        if row is None:
            _missing(changes, "UPDATE", update.memory_id, skipped)
            continue
        before = MemoryRecord.from_row(row)
        same_text = update.text is None or update.text == row.text
        same_meta = update.metadata is None or update.metadata == row.metadata_
        if same_text and same_meta:
            skipped.append(f"UPDATE of memory {update.memory_id!r} skipped: nothing changes")
            continue
        if update.text is not None:
            row.text = update.text
            row.hash = hash_text(update.text)
        if update.metadata is not None:
            row.metadata_ = update.metadata
        row.updated_at = now
        s.add(_history(update.memory_id, "UPDATE", before, row, changes.actor, now))
        s.flush()
        updated.append((before, MemoryRecord.from_row(row)))
    added: list[MemoryRecord] = []
    seen: set[str] = set()
    for new in changes.adds:
        assert changes.scope is not None  # validate_changes guarantees it
        digest = hash_text(new.text)
        if changes.skip_duplicates:
            duplicate = (
                digest in seen
                or s.scalar(select(MemoryRow.pk).where(MemoryRow.hash == digest, *scope_clauses).limit(1)) is not None
            )
            if duplicate:
                skipped.append(f"ADD of {new.text!r} skipped: already stored in scope {changes.scope}")
                continue
        seen.add(digest)
        row = MemoryRow(
            id=str(uuid.uuid4()),
            text=new.text,
            hash=digest,
            user_id=changes.scope.user_id,
            agent_id=changes.scope.agent_id,
            run_id=changes.scope.run_id,
            metadata_=new.metadata,
            context=list(new.context),
            created_at=now,
            updated_at=now,
        )
        s.add(row)
        s.add(_history(row.id, "ADD", None, row, changes.actor, now))
        s.flush()  # assigns the integer key (the vector id)
        added.append(MemoryRecord.from_row(row))
    s.flush()
    return AppliedChanges(added, updated, deleted, skipped)


def delete_scope_in_session(s: Session, scope: Scope, actor: str | None) -> list[MemoryRecord]:
    """Delete every memory of ``scope`` with one ``DELETE`` history row each (inside the caller's transaction).

    Returns:
        The deleted memories, oldest first.
    """
    rows = s.scalars(select(MemoryRow).where(*_scope_clauses(scope)).order_by(MemoryRow.created_at, MemoryRow.pk)).all()
    records = [MemoryRecord.from_row(row) for row in rows]
    now = utc_now()
    for chunk in _chunks([r.id for r in records]):
        s.execute(
            delete(KVEntryRow).where(KVEntryRow.memory_id.in_(chunk)).execution_options(synchronize_session=False)
        )
        s.execute(delete(MemoryRow).where(MemoryRow.id.in_(chunk)).execution_options(synchronize_session=False))
    s.add_all(_history(r.id, "DELETE", r, None, actor, now) for r in records)
    return records


def reset_in_session(s: Session) -> None:
    """Delete every row of every table (inside the caller's transaction)."""
    s.execute(delete(KVEntryRow))
    s.execute(delete(HistoryRow))
    s.execute(delete(MemoryRow))


def where_clauses(scope: Scope, node: Filter | None, dialect: str) -> list[ColumnElement[bool]]:
    """The ``WHERE`` conditions of a scope plus an optional filter."""
    clauses = _scope_clauses(scope)
    if node is not None:
        clauses.append(compile_filter(node, dialect))
    return clauses


def select_memories(scope: Scope, node: Filter | None, dialect: str, limit: int | None) -> Select[tuple[MemoryRow]]:
    """Memories of ``scope`` matching ``node``, oldest first, at most ``limit`` (all when ``None``)."""
    stmt = select(MemoryRow).where(*where_clauses(scope, node, dialect)).order_by(MemoryRow.created_at, MemoryRow.pk)
    return stmt.limit(limit) if limit is not None else stmt


def select_vector_ids(scope: Scope, node: Filter | None, dialect: str) -> Select[tuple[int]]:
    """Vector ids of the memories of ``scope`` matching ``node``, ascending."""
    return select(MemoryRow.pk).where(*where_clauses(scope, node, dialect)).order_by(MemoryRow.pk)


def select_by_vector_ids(ids: Sequence[int]) -> Select[tuple[MemoryRow]]:
    """Memories whose vector id is in ``ids`` (pass at most a few hundred ids per statement)."""
    return select(MemoryRow).where(MemoryRow.pk.in_(list(ids)))


__all__ = [
    "AppliedChanges",
    "ChangeSet",
    "MemoryUpdate",
    "NewMemory",
    "apply_in_session",
    "delete_scope_in_session",
    "reset_in_session",
    "select_by_vector_ids",
    "select_memories",
    "select_vector_ids",
    "validate_changes",
    "where_clauses",
]
