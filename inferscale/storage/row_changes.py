"""The row changes of a change set (:mod:`inferscale.storage.changes` applies the set): deleting memories, and
applying its updates, with the skips each may take."""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import delete
from sqlalchemy import update as update_rows
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import flag_modified

from inferscale.errors import MemoryNotFoundError
from inferscale.scope import Scope
from inferscale.storage.change_sets import ChangeSet, NewMemory
from inferscale.storage.history_rows import history_row
from inferscale.storage.models import HistoryRow, KVEntryRow, MemoryRow
from inferscale.storage.queries import chunks, memories_with_hash
from inferscale.storage.records import MemoryRecord, hash_text, merged_metadata
from inferscale.storage.validation import same_json

log = logging.getLogger(__name__)


@dataclass
class Updates:
    """What :func:`update_memories` did.

    Attributes:
        changed: ``(before, row)`` of each memory updated, its row as it is now.
        deleted: the memories an LLM's update deleted instead (its new text held by another of the scope).
        instead: the ``instead`` memories of the updates skipped or turned into deletes, for the caller to add (a
            duplicate's add is skipped).
    """

    changed: list[tuple[MemoryRecord, MemoryRow]] = field(default_factory=list)
    deleted: list[MemoryRecord] = field(default_factory=list)
    instead: list[NewMemory] = field(default_factory=list)


def skip_missing(changes: ChangeSet, what: str, memory_id: str, skipped: list[str]) -> None:
    """Skip the change ``what`` of a ``memory_id`` the scope does not hold, with a warning and its reason added to
    ``skipped``.

    Raises:
        MemoryNotFoundError: instead, for a ``strict`` change set (an explicit call).
    """
    reason = f"{what} of memory {memory_id!r} skipped: no such memory in scope {changes.scope}"
    if changes.strict:
        raise MemoryNotFoundError(f"no memory with id {memory_id!r}")
    log.warning(reason)
    skipped.append(reason)


def changed_since_seen(row: MemoryRow, seen: dict[str, str], what: str, skipped: list[str]) -> bool:
    """Whether ``row``'s text is not the one its change was decided on (``seen``: :attr:`ChangeSet.seen`); such a
    change is skipped, with a warning, and the reason is added to ``skipped``."""
    if row.id not in seen or seen[row.id] == row.hash:
        return False
    reason = f"{what} of memory {row.id!r} skipped: its text changed after the change was decided (now {row.text!r})"
    log.warning(reason)
    skipped.append(reason)
    return True


def delete_memories(s: Session, rows: Sequence[MemoryRow], actor: str | None, now: datetime) -> list[MemoryRecord]:
    """Delete the memories of ``rows`` (locked, and taken out of the session: the deletes below bypass it) and their
    KV entries; one ``DELETE`` history row each. Their history rows that recorded no scope (written before revision
    0004_history_scope, or by an older InferScale) get it first: they read it from the live memory
    (:func:`~inferscale.storage.queries.history`), which is about to go.

    Returns:
        The deleted memories as they were, in the order of ``rows``.
    """
    records = [MemoryRecord.from_row(row) for row in rows]
    for row in rows:
        s.expunge(row)
    by_scope: dict[Scope, list[str]] = {}
    for record in records:
        by_scope.setdefault(record.scope(), []).append(record.id)
    unrecorded = (HistoryRow.user_id.is_(None), HistoryRow.agent_id.is_(None), HistoryRow.run_id.is_(None))
    for scope, ids in by_scope.items():
        for chunk in chunks(ids):
            s.execute(
                update_rows(HistoryRow)
                .where(HistoryRow.memory_id.in_(chunk), *unrecorded)
                .values(user_id=scope.user_id, agent_id=scope.agent_id, run_id=scope.run_id)
                .execution_options(synchronize_session=False)
            )
    for chunk in chunks([r.id for r in records]):
        s.execute(
            delete(KVEntryRow).where(KVEntryRow.memory_id.in_(chunk)).execution_options(synchronize_session=False)
        )
        s.execute(delete(MemoryRow).where(MemoryRow.id.in_(chunk)).execution_options(synchronize_session=False))
    s.add_all(history_row(r.id, "DELETE", r, None, actor, now) for r in records)
    return records


def update_memories(
    s: Session,
    changes: ChangeSet,
    rows: Mapping[str, MemoryRow],
    scopes: Mapping[str, Scope],
    gone: Collection[str],
    now: datetime,
    skipped: list[str],
) -> Updates:
    """Apply the updates of ``changes`` to their ``rows`` (locked; ``scopes``: each one's exact scope), one
    ``UPDATE`` history row each, after the deletes of the set (``gone``: the ids they deleted).

    An update is skipped, its reason added to ``skipped``, when its memory is gone or not in the scope, changed since
    it was decided (:attr:`ChangeSet.seen`), or changes nothing (``skip_unchanged``); a skipped update's
    ``instead`` memory is added by the caller. An LLM's update (one with ``instead``, ``skip_duplicates``) to a text
    another memory of its scope holds deletes its memory instead: the text it was to take is held already, and the
    old one it was to drop must go (kept, it contradicted the new one; rewritten, two memories held one text). Its
    ``instead`` memory is handed to the caller too, whose add skips it as a duplicate unless a later update of the
    set re-worded the holder (the fact is never lost); a later update of the deleted memory is skipped.

    Raises:
        MemoryNotFoundError: for an unknown id in a ``strict`` set.
    """
    result = Updates()
    seen = dict(changes.seen)
    gone = set(gone)  # and the memories deleted below: a later update of one is skipped, as one of a deleted memory
    for update in changes.updates:
        row = None if update.memory_id in gone else rows.get(update.memory_id)
        if update.memory_id in gone:
            skipped.append(f"UPDATE of memory {update.memory_id!r} skipped: it is deleted in the same change set")
        elif row is None:
            skip_missing(changes, "UPDATE", update.memory_id, skipped)
        elif changed_since_seen(row, seen, "UPDATE", skipped):
            row = None
        if row is None:
            if update.instead is not None:
                result.instead.append(update.instead)
            continue
        before = MemoryRecord.from_row(row)
        same_text = update.text is None or update.text == row.text
        new_meta = None if update.metadata is None else merged_metadata(row.metadata_, update.metadata)
        same_meta = new_meta is None or same_json(new_meta, row.metadata_)
        if changes.skip_unchanged and same_text and same_meta:
            skipped.append(f"UPDATE of memory {update.memory_id!r} skipped: nothing changes")
            continue
        fact = update.instead if changes.skip_duplicates else None  # an LLM's update (explicit ones have none)
        new_text = None if same_text else update.text  # another memory of its scope holding it: its lock is held
        if fact is not None and new_text and memories_with_hash(s, hash_text(new_text), scopes[update.memory_id], 1):
            log.warning("UPDATE of memory %r to a text its scope holds: the memory is deleted", update.memory_id)
            result.deleted += delete_memories(s, [row], changes.actor, now)
            gone.add(update.memory_id)
            # added unless still held once every update is applied (a later one may re-word the holder)
            result.instead.append(fact)
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
        if new_meta is not None:
            row.metadata_ = new_meta
            # SQLAlchemy skips writing a JSON value equal (by ==) to the loaded one, and == calls True equal to 1.
            flag_modified(row, "metadata_")
        row.updated_at = now
        s.add(history_row(update.memory_id, "UPDATE", before, row, changes.actor, now))
        s.flush()
        result.changed.append((before, row))
    return result


__all__ = ["Updates", "changed_since_seen", "delete_memories", "skip_missing", "update_memories"]
