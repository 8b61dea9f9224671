"""Every write to memories and their history: change sets, scope deletion and reset (KV entries:
:mod:`inferscale.storage.kv_entries`).

A :class:`ChangeSet` (adds, updates, deletes in one scope) is applied by :func:`apply_in_session` inside one
transaction: either every row and history row is written, or none is. Single adds, updates and deletes of the
stores are one-change sets built by :func:`add_change`, :func:`update_change` and :func:`delete_change`.

Each ``*_in_session`` function takes the caller's plain ``Session`` (and transaction), so
:class:`~inferscale.storage.MemoryStore` runs it directly and
:class:`~inferscale.storage.async_store.AsyncMemoryStore` through ``AsyncSession.run_sync`` (same SQL, async I/O).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import flag_modified

from inferscale.errors import InvalidInputError, MemoryNotFoundError
from inferscale.scope import Scope
from inferscale.storage.models import HistoryRow, KVEntryRow, MemoryRow, utc_now
from inferscale.storage.queries import chunks, scope_clauses, select_memory
from inferscale.storage.records import HistoryEvent, MemoryRecord, hash_text
from inferscale.storage.validation import (
    check_actor,
    check_context,
    check_id,
    check_metadata,
    check_scope,
    check_text,
    json_copy,
    same_json,
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
        skip_unchanged: an update that changes neither text nor metadata is skipped (no history row, same
            ``updated_at``); otherwise it is written like any other update. Metadata is unchanged only when it is the
            same JSON, types included (``True`` is not ``1``, ``1.0`` is not ``1``).
    """

    scope: Scope | None
    adds: tuple[NewMemory, ...] = ()
    updates: tuple[MemoryUpdate, ...] = ()
    deletes: tuple[str, ...] = ()
    actor: str | None = None
    strict: bool = False
    skip_duplicates: bool = True
    skip_unchanged: bool = True


@dataclass(frozen=True, slots=True)
class AppliedChanges:
    """What a :class:`ChangeSet` did.

    Attributes:
        added: the new memories, in the order of ``adds`` (skipped duplicates left out).
        updated: ``(before, after)`` pairs, in the order of ``updates`` (skipped updates left out).
        deleted: the memories as they were before deletion.
        skipped: one human-readable reason per change that was not applied.
    """

    added: list[MemoryRecord]
    updated: list[tuple[MemoryRecord, MemoryRecord]]
    deleted: list[MemoryRecord]
    skipped: list[str]


# ---- building and checking change sets -------------------------------------------------------------------------


def validate_changes(changes: ChangeSet) -> ChangeSet:
    """Check every text, id and metadata dict before anything is written.

    Returns:
        The change set with metadata deep-copied into plain JSON values.

    Raises:
        InvalidInputError: for an empty text, a bad id, non-JSON metadata, an update with nothing to change, a
            scope that is not a Scope, or adds without a scope.
    """
    if changes.adds and changes.scope is None:
        raise InvalidInputError("adding memories needs a scope (user_id, agent_id or run_id)")
    scope = check_scope(changes.scope) if changes.scope is not None else None
    adds = tuple(
        NewMemory(check_text(a.text), check_metadata(a.metadata), tuple(check_context(a.context))) for a in changes.adds
    )
    updates: list[MemoryUpdate] = []
    for u in changes.updates:
        if u.text is None and u.metadata is None:
            raise InvalidInputError(f"nothing to update for memory {u.memory_id!r}: pass text, metadata or both")
        updates.append(
            MemoryUpdate(
                check_id(u.memory_id),
                check_text(u.text) if u.text is not None else None,
                check_metadata(u.metadata) if u.metadata is not None else None,
            )
        )
    deletes = tuple(check_id(d) for d in changes.deletes)
    actor = check_actor(changes.actor)
    return ChangeSet(
        scope,
        adds,
        tuple(updates),
        deletes,
        actor,
        changes.strict,
        changes.skip_duplicates,
        changes.skip_unchanged,
    )


def add_change(
    text: object, scope: object, metadata: object = None, context: object = None, actor: object = None
) -> ChangeSet:
    """The validated one-add change set of ``MemoryStore.add``: duplicates are stored too.

    Raises:
        InvalidInputError: for an empty text, a non-Scope scope, non-JSON metadata, non-str context or a bad actor.
    """
    new = NewMemory(check_text(text), check_metadata(metadata), tuple(check_context(context)))
    return ChangeSet(check_scope(scope), adds=(new,), actor=check_actor(actor), skip_duplicates=False)


def update_change(memory_id: object, text: object, metadata: object = None, actor: object = None) -> ChangeSet:
    """The validated one-update change set of ``MemoryStore.update``: strict, and written even when nothing
    changes (an ``UPDATE`` history row and a new ``updated_at``).

    Raises:
        InvalidInputError: when neither ``text`` nor ``metadata`` is given, or either (or the id, or the actor) is
            invalid.
    """
    memory_id = check_id(memory_id)
    new_text = check_text(text) if text is not None else None
    new_meta = check_metadata(metadata) if metadata is not None else None
    checked_actor = check_actor(actor)
    if new_text is None and new_meta is None:
        raise InvalidInputError(f"nothing to update for memory {memory_id!r}: pass text, metadata or both")
    update = MemoryUpdate(memory_id, new_text, new_meta)
    return ChangeSet(None, updates=(update,), actor=checked_actor, strict=True, skip_unchanged=False)


def delete_change(memory_id: object, actor: object = None) -> ChangeSet:
    """The validated strict one-delete change set of ``MemoryStore.delete``.

    Raises:
        InvalidInputError: when ``memory_id`` or ``actor`` is not a non-empty str.
    """
    return ChangeSet(None, deletes=(check_id(memory_id),), actor=check_actor(actor), strict=True)


# ---- session functions -----------------------------------------------------------------------------------------


def _history(
    memory_id: str,
    event: HistoryEvent,
    before: MemoryRecord | None,
    after: MemoryRow | None,
    actor: str | None,
    now: datetime,
) -> HistoryRow:
    return HistoryRow(
        memory_id=memory_id,
        event=event,
        old_text=before.text if before is not None else None,
        new_text=after.text if after is not None else None,
        old_metadata=json_copy(before.metadata) if before is not None else None,
        new_metadata=json_copy(after.metadata_) if after is not None else None,
        actor=actor,
        created_at=now,
    )


def _missing(changes: ChangeSet, what: str, memory_id: str, skipped: list[str]) -> None:
    reason = f"{what} of memory {memory_id!r} skipped: no such memory in scope {changes.scope}"
    if changes.strict:
        raise MemoryNotFoundError(f"no memory with id {memory_id!r}")
    log.warning(reason)
    skipped.append(reason)


def _delete_memories(s: Session, records: Sequence[MemoryRecord], actor: str | None, now: datetime) -> None:
    """Delete the memories and their KV entries; one ``DELETE`` history row each."""
    for chunk in chunks([r.id for r in records]):
        s.execute(
            delete(KVEntryRow).where(KVEntryRow.memory_id.in_(chunk)).execution_options(synchronize_session=False)
        )
        s.execute(delete(MemoryRow).where(MemoryRow.id.in_(chunk)).execution_options(synchronize_session=False))
    s.add_all(_history(r.id, "DELETE", r, None, actor, now) for r in records)


def apply_in_session(s: Session, changes: ChangeSet) -> AppliedChanges:
    """Apply a validated change set inside the caller's transaction (deletes, then updates, then adds).

    Returns:
        :class:`AppliedChanges`.

    Raises:
        MemoryNotFoundError: with ``strict``, when an update or delete names an unknown id (the caller's
            transaction then rolls back: nothing is written).
    """
    now = utc_now()
    skipped: list[str] = []
    deleted: list[MemoryRecord] = []
    for memory_id in dict.fromkeys(changes.deletes):
        row = s.scalars(select_memory(memory_id, changes.scope).with_for_update()).first()
        if row is None:
            _missing(changes, "DELETE", memory_id, skipped)
            continue
        record = MemoryRecord.from_row(row)
        s.expunge(row)
        _delete_memories(s, [record], changes.actor, now)
        deleted.append(record)
    gone = {d.id for d in deleted}
    updated: list[tuple[MemoryRecord, MemoryRecord]] = []
    for update in changes.updates:
        if update.memory_id in gone:
            skipped.append(f"UPDATE of memory {update.memory_id!r} skipped: it is deleted in the same change set")
            continue
        row = s.scalars(select_memory(update.memory_id, changes.scope).with_for_update()).first()
        if row is None:
            _missing(changes, "UPDATE", update.memory_id, skipped)
            continue
        before = MemoryRecord.from_row(row)
        same_text = update.text is None or update.text == row.text
        same_meta = update.metadata is None or same_json(update.metadata, row.metadata_)
        if changes.skip_unchanged and same_text and same_meta:
            skipped.append(f"UPDATE of memory {update.memory_id!r} skipped: nothing changes")
            continue
        if update.text is not None and update.text != row.text:
            row.text = update.text
            row.hash = hash_text(update.text)
            # K/V encoded from the old text can never be served again: their rows go in the same transaction.
            s.execute(
                delete(KVEntryRow)
                .where(KVEntryRow.memory_id == update.memory_id)
                .execution_options(synchronize_session=False)
            )
        if update.metadata is not None:
            row.metadata_ = update.metadata
            # SQLAlchemy skips writing a JSON value equal (by ==) to the loaded one, and == calls True equal to 1.
            flag_modified(row, "metadata_")
        row.updated_at = now
        s.add(_history(update.memory_id, "UPDATE", before, row, changes.actor, now))
        s.flush()
        updated.append((before, MemoryRecord.from_row(row)))
    added: list[MemoryRecord] = []
    seen: set[str] = set()
    for new in changes.adds:
        if changes.scope is None:
            raise InvalidInputError("adding memories needs a scope (user_id, agent_id or run_id)")
        digest = hash_text(new.text)
        if changes.skip_duplicates:
            in_scope = select(MemoryRow.pk).where(MemoryRow.hash == digest, *scope_clauses(changes.scope)).limit(1)
            if digest in seen or s.scalar(in_scope) is not None:
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
    """Delete every memory of ``scope`` (and their KV entries) with one ``DELETE`` history row each.

    Returns:
        The deleted memories, oldest first.
    """
    stmt = select(MemoryRow).where(*scope_clauses(scope)).order_by(MemoryRow.created_at, MemoryRow.pk)
    rows = s.scalars(stmt).all()
    records = [MemoryRecord.from_row(row) for row in rows]
    for row in rows:
        s.expunge(row)
    _delete_memories(s, records, actor, utc_now())
    return records


def reset_in_session(s: Session) -> None:
    """Delete every row of every table (the schema stays)."""
    s.execute(delete(KVEntryRow))
    s.execute(delete(HistoryRow))
    s.execute(delete(MemoryRow))


__all__ = [
    "AppliedChanges",
    "ChangeSet",
    "MemoryUpdate",
    "NewMemory",
    "add_change",
    "apply_in_session",
    "delete_change",
    "delete_scope_in_session",
    "reset_in_session",
    "update_change",
    "validate_changes",
]
