"""Every write to memories and their history: change sets, scope deletion and reset (K/V rows:
:mod:`inferscale.storage.kv_entries`; a change set's row deletes and updates: :mod:`inferscale.storage.row_changes`).

A :class:`ChangeSet` (adds, updates, deletes in one scope; built and checked in :mod:`inferscale.storage.change_sets`,
single changes by its ``add_change``, ``update_change`` and ``delete_change``) is applied by :func:`apply_in_session`
inside one transaction: either every row and history row is written, or none is. A deletion or re-wording also takes
the old text out of the stored contexts of its scope's other memories (:mod:`inferscale.storage.contexts`).

Each ``*_in_session`` function takes the caller's plain ``Session`` (and transaction), so
:class:`~inferscale.storage.MemoryStore` runs it directly and
:class:`~inferscale.storage.async_store.AsyncMemoryStore` through its :mod:`~inferscale.storage.async_sessions` runner.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime

from sqlalchemy import and_, delete, or_, select
from sqlalchemy.orm import Session

from inferscale.errors import InvalidInputError
from inferscale.kv.fingerprint import survives_recontext
from inferscale.scope import Scope
from inferscale.storage.change_sets import AppliedChanges, ChangeSet, NewMemory, held_elsewhere
from inferscale.storage.contexts import (
    chain_start,
    context_holders,
    context_lock_key,
    live_hashes,
    live_neighbours,
    without_texts,
)
from inferscale.storage.history_rows import history_row, imported_history_rows
from inferscale.storage.kv_entries import delete_kv_entry_rows_in_session
from inferscale.storage.locks import MAX_ADVISORY_KEYS, advisory_key, lock_all, lock_keys
from inferscale.storage.models import HistoryRow, KVEntryRow, MemoryRow, utc_now
from inferscale.storage.queries import chunks, exact_scope_clauses, held_ids, scope_clauses
from inferscale.storage.records import MemoryRecord, hash_text
from inferscale.storage.row_changes import changed_since_seen, delete_memories, skip_missing, update_memories

log = logging.getLogger(__name__)


# ---- session functions -----------------------------------------------------------------------------------------


def _named_scopes(s: Session, changes: ChangeSet) -> dict[str, Scope]:
    """The exact scope of each memory of ``changes.scope`` that its deletes and updates name, by id (ids outside it,
    or unknown, left out). Read without locks: a memory never changes scope."""
    ids = sorted({*changes.deletes, *(u.memory_id for u in changes.updates)})
    found: dict[str, Scope] = {}
    for chunk in chunks(ids):
        columns = (MemoryRow.id, MemoryRow.user_id, MemoryRow.agent_id, MemoryRow.run_id)
        stmt = select(*columns).where(MemoryRow.id.in_(chunk), *scope_clauses(changes.scope))
        found.update((i, Scope.of_row(u, a, r)) for i, u, a, r in s.execute(stmt))
    return found


def _leaving_texts(s: Session, changes: ChangeSet, scopes: dict[str, Scope]) -> dict[Scope, set[str]]:
    """The texts the change set may take out of each exact scope: the deleted memories' texts and the old texts of
    those it re-words (read once the scopes' locks are held, so no other change set re-words them meanwhile)."""
    deletes = set(changes.deletes)
    new_texts = {u.memory_id: u.text for u in changes.updates if u.text is not None}
    wanted = sorted(i for i in scopes if i in deletes or i in new_texts)
    leaving: dict[Scope, set[str]] = {}
    for chunk in chunks(wanted):
        for memory_id, text in s.execute(select(MemoryRow.id, MemoryRow.text).where(MemoryRow.id.in_(chunk))):
            if memory_id in deletes or new_texts[memory_id] != text:
                leaving.setdefault(scopes[memory_id], set()).add(text)
    return leaving


def _lock_rows(s: Session, ids: Iterable[str]) -> dict[str, MemoryRow]:
    """The rows of ``ids`` (those that still exist), by id, locked ``FOR UPDATE`` in id order.

    Taking every row lock up front, in one order, means two writers that touch the same memories never wait for
    each other in a cycle (PostgreSQL would abort one as a deadlock); :func:`delete_scope_in_session` locks in the
    same order. SQLite ignores ``FOR UPDATE`` (its writers hold the file's write lock from ``BEGIN IMMEDIATE``).
    """
    rows: dict[str, MemoryRow] = {}
    for chunk in chunks(sorted(set(ids))):
        stmt = select(MemoryRow).where(MemoryRow.id.in_(chunk)).order_by(MemoryRow.id).with_for_update()
        rows.update((row.id, row) for row in s.scalars(stmt))
    return rows


def _scrub(s: Session, leaving: dict[Scope, set[str]], holders: dict[str, tuple[Scope, MemoryRow]]) -> list[MemoryRow]:
    """Remove from the holders' contexts every text that left its scope (no memory of exactly that scope holds it
    after the change), moving each one's chain start back by the entries removed before it, and delete the
    ``kv_entries`` rows whose K/V depended on the old context; returns the rows whose context changed.

    A context-free entry (encoded after no turn, on no chain) stays valid and is kept while the memory's context
    keeps an entry (:func:`~inferscale.kv.fingerprint.survives_recontext`, the rule the client's tiers follow too)."""
    s.flush()
    gone: dict[Scope, set[str]] = {}
    for scope, texts in leaving.items():
        live = live_hashes(s, scope, {hash_text(t) for t in texts})
        gone[scope] = {t for t in texts if hash_text(t) not in live}
    changed: list[MemoryRow] = []
    for scope, row in holders.values():
        left = gone[scope]
        kept = without_texts(row.context, left)
        if kept is not None:
            row.chain_from = chain_start(row.chain_from, [turn not in left for turn in row.context])
            row.context = kept
            changed.append(row)
    with_context = {row.id for row in changed if row.context}
    stale: list[int] = []
    for chunk in chunks([row.id for row in changed]):
        entries = s.execute(
            select(KVEntryRow.id, KVEntryRow.memory_id, KVEntryRow.encoding_key).where(KVEntryRow.memory_id.in_(chunk))
        )
        stale += [i for i, memory_id, key in entries if not survives_recontext(key, memory_id in with_context)]
    delete_kv_entry_rows_in_session(s, stale)
    return changed


def apply_in_session(s: Session, changes: ChangeSet) -> AppliedChanges:
    """Apply a validated change set inside the caller's transaction (deletes, then updates, then adds, then the
    scrub of the contexts that held a deleted or re-worded text).

    Locks come first, advisory locks (PostgreSQL, held to the end of the transaction) before row locks:

    - the stored contexts of each exact scope the change set touches (:func:`~inferscale.storage.contexts.
      context_lock_key`): those of the memories it deletes or updates, and its own scope when it adds. Every write
      that can put a text into a scope (an add to it, an update of one of its memories) thus takes that scope's
      lock, so with ``skip_duplicates`` the duplicate check sees every such write committed before it, under any
      concurrency: the same text is stored once per exact scope on PostgreSQL as on SQLite, whose writers take
      turns already;
    - the ids given to new memories (:attr:`NewMemory.memory_id`), so two change sets giving one id to memories of
      two scopes take turns: the second sees the first's memory and refuses (never a unique-key error);
    - then the rows the deletes and updates name and the rows whose context holds a text they take out of their scope
      (:mod:`inferscale.storage.contexts`), ``FOR UPDATE``, in id order.

    The changes' timestamp is taken after the locks (and after SQLite's write lock), so history rows, ``created_at``
    and ``updated_at`` follow the order the transactions commit in: before, two writers to one memory could leave its
    history with times going backwards and ``updated_at`` older than its last change.

    A duplicate is a text stored in exactly the change set's scope (an id it leaves unset is unset too): a fact added
    for user ``u1`` is stored though a run of ``u1`` holds it, whose ``delete_all`` would otherwise take it too.

    Returns:
        :class:`AppliedChanges`.

    Raises:
        MemoryNotFoundError: with ``strict``, when an update or delete names an unknown id (the caller's
            transaction then rolls back: nothing is written).
        InvalidInputError: when an add's given id is held by a memory of another scope (rolled back likewise).
    """
    s.connection()  # the transaction begins now: on SQLite, ``BEGIN IMMEDIATE`` waits for the write lock here
    scopes = _named_scopes(s, changes)
    keys = [context_lock_key(scope) for scope in set(scopes.values())]
    possible = changes.possible_adds()
    if possible and changes.scope is not None:
        keys.append(context_lock_key(changes.scope))
    keys += [advisory_key("inferscale.memory_id", new.memory_id) for new in possible if new.memory_id is not None]
    lock_keys(s, keys)
    leaving = _leaving_texts(s, changes, scopes)
    holder_scopes = {i: scope for scope, texts in leaving.items() for i in context_holders(s, scope, texts)}
    locked = _lock_rows(s, [*scopes, *holder_scopes])
    rows = {i: locked[i] for i in scopes if i in locked}
    now = utc_now()
    skipped: list[str] = []
    deleted: list[MemoryRecord] = []
    seen = dict(changes.seen)
    for memory_id in dict.fromkeys(changes.deletes):
        row = rows.get(memory_id)
        if row is None:
            skip_missing(changes, "DELETE", memory_id, skipped)
            continue
        if changed_since_seen(row, seen, "DELETE", skipped):
            continue
        deleted += delete_memories(s, [row], changes.actor, now)
    gone = {d.id for d in deleted}
    updates = update_memories(s, changes, rows, scopes, gone, now, skipped)
    deleted += updates.deleted
    gone |= {d.id for d in updates.deleted}
    added = _add_memories(s, changes, (*changes.adds, *updates.instead), now, skipped)
    holders = {i: (scope, locked[i]) for i, scope in holder_scopes.items() if i in locked and i not in gone}
    recontexted = _scrub(s, leaving, holders)
    s.flush()
    updated = [(before, MemoryRecord.from_row(row)) for before, row in updates.changed]
    return AppliedChanges(added, updated, deleted, skipped, [MemoryRecord.from_row(row) for row in recontexted])


def _add_memories(
    s: Session, changes: ChangeSet, adds: Sequence[NewMemory], now: datetime, skipped: list[str]
) -> list[MemoryRecord]:
    """Insert ``adds`` (the change set's, then the ``instead`` memories of its skipped updates) after its deletes and
    updates, each with an ``ADD`` history row; returns the new memories. With ``skip_duplicates``, a text stored in
    exactly the scope, or earlier in the set, is skipped. Each add's neighbour texts that no memory of the scope holds
    any more are dropped from its context (and its chain start moves back by those dropped before it). An add with a
    given id (:attr:`NewMemory.memory_id`) that a memory of exactly the scope holds already, or a deleted memory
    had, is skipped, and is refused when a memory of another scope holds it (the transaction rolls back). A given
    ``created_at`` dates the memory and (without a given history) its ``ADD`` history row; without one, a given
    ``updated_at`` does (no memory is updated before it is created), else the write's time. A memory with
    :attr:`NewMemory.history` gets those changes as its history rows instead of the one ``ADD``."""
    if not adds:
        return []
    scope = changes.scope
    if scope is None:
        raise InvalidInputError("adding memories needs a scope (user_id, agent_id or run_id)")
    wanted = {hash_text(turn) for new in adds for turn in new.context[: new.neighbours]}
    live = live_hashes(s, scope, wanted) if wanted else set()
    added: list[MemoryRecord] = []
    seen: set[str] = set()
    taken = held_ids(s, [new.memory_id for new in adds if new.memory_id is not None])
    for new in adds:
        digest = hash_text(new.text)
        holder = taken.get(new.memory_id or "")
        if holder is not None:
            if holder.scope is not None and holder.scope != scope:
                raise InvalidInputError(held_elsewhere(new.memory_id or ""))
            whose = f"a memory of scope {scope}" if holder.scope is not None else "a deleted memory"
            skipped.append(f"ADD of memory {new.memory_id!r} skipped: {whose} had that id already")
            continue
        if changes.skip_duplicates:
            in_scope = select(MemoryRow.pk).where(MemoryRow.hash == digest, *exact_scope_clauses(scope)).limit(1)
            if digest in seen or s.scalar(in_scope) is not None:
                skipped.append(f"ADD of {new.text!r} skipped: already stored in scope {scope}")
                continue
        present = live | seen
        created_at = new.created_at or new.updated_at or now
        row = MemoryRow(
            id=new.memory_id or str(uuid.uuid4()),
            text=new.text,
            hash=digest,
            user_id=scope.user_id,
            agent_id=scope.agent_id,
            run_id=scope.run_id,
            metadata_=new.metadata,
            context=live_neighbours(new.context, new.neighbours, present),
            chain_from=chain_start(
                new.chain_from, [i >= new.neighbours or hash_text(t) in present for i, t in enumerate(new.context)]
            ),
            created_at=created_at,
            updated_at=new.updated_at or created_at,
        )
        seen.add(digest)
        s.add(row)
        if new.history:
            s.add_all(imported_history_rows(row, new.history))
        else:
            s.add(history_row(row.id, "ADD", None, row, changes.actor, created_at))
        s.flush()  # assigns the integer key (the vector id)
        added.append(MemoryRecord.from_row(row))
    return added


def delete_scope_in_session(s: Session, scope: Scope, actor: str | None) -> list[MemoryRecord]:
    """Delete every memory of ``scope`` (and their KV entries) with one ``DELETE`` history row each.

    No other memory's context is scrubbed: a deleted text can sit only in the contexts of memories of exactly its
    memory's scope (:mod:`inferscale.storage.contexts`), and every one of them is in ``scope`` too, so deleted here.

    Locks, as :func:`apply_in_session` takes them: first the stored-contexts lock of every exact scope with a memory
    in ``scope`` (PostgreSQL; an add to one of them holds it from reading its neighbours' texts to its commit), then
    the rows in id order. Without the first, an add running beside the deletion could commit a memory whose context
    held the deleted texts (a tester's find on PostgreSQL; SQLite's writers take turns already). Only the memories of
    the exact scopes locked are deleted: a scope that gets its first memory after they were read is left to the
    adds beside the deletion, which count as after it (a reviewer's find: deleting its memories unlocked let an add
    keep one of their texts in its context). Past :data:`~inferscale.storage.locks.MAX_ADVISORY_KEYS` scopes the
    lock is the schema's exclusive one, which waits for every add, and the whole of ``scope`` is deleted.

    Returns:
        The deleted memories, oldest first.
    """
    exact = [
        Scope.of_row(u, a, r)
        for u, a, r in s.execute(
            select(MemoryRow.user_id, MemoryRow.agent_id, MemoryRow.run_id).where(*scope_clauses(scope)).distinct()
        )
    ]
    if not exact:
        return []
    keys = {context_lock_key(e) for e in exact}
    lock_keys(s, keys)
    where = scope_clauses(scope)
    if len(keys) <= MAX_ADVISORY_KEYS:
        where.append(or_(*(and_(*exact_scope_clauses(e)) for e in exact)))
    stmt = select(MemoryRow).where(*where).order_by(MemoryRow.id).with_for_update()
    rows = sorted(s.scalars(stmt).all(), key=lambda row: (row.created_at, row.pk))
    return delete_memories(s, rows, actor, utc_now())


def reset_in_session(s: Session) -> list[str]:
    """Delete every row of every table (the schema stays), holding the schema's exclusive escalation lock on
    PostgreSQL (:func:`~inferscale.storage.locks.lock_all`): no write runs beside it, so none commits a memory whose
    context holds a text the reset removed.

    Returns:
        The ids of every memory the database knew (stored, or in the history), sorted: whose K/V files the caller
        removes, and no others (other databases may share the K/V folder).
    """
    lock_all(s)
    # Memory rows before K/V rows, as every writer locks them: a K/V write holds its memory's row while it writes its
    # entry (kv_entries.put_kv_entry_in_session), and would deadlock with a reset that took the entries first.
    s.execute(select(MemoryRow.pk).order_by(MemoryRow.id).with_for_update())
    known = s.scalars(select(MemoryRow.id).union(select(HistoryRow.memory_id))).all()
    s.execute(delete(KVEntryRow))
    s.execute(delete(HistoryRow))
    s.execute(delete(MemoryRow))
    return sorted(set(known))


__all__ = ["apply_in_session", "delete_scope_in_session", "reset_in_session"]
