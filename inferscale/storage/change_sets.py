"""What a change set is: the memories to add, update and delete in one transaction, what applying one did, and
the checks every change passes before anything is written (applied by
:func:`inferscale.storage.changes.apply_in_session`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from inferscale.errors import InvalidInputError
from inferscale.scope import Scope
from inferscale.storage.records import ATTRIBUTION_KEYS, MemoryRecord
from inferscale.storage.validation import (
    check_actor,
    check_context,
    check_count,
    check_id,
    check_key,
    check_metadata,
    check_new_id,
    check_scope,
    check_text,
    check_utc_time,
    same_json,
)


@dataclass(frozen=True, slots=True)
class PastChange:
    """One change a memory went through in the store an import brings it from, kept as its history row.

    Attributes:
        event: ``"ADD"`` (the first change, with no ``old_text``) or ``"UPDATE"``.
        old_text, new_text: the memory's text before and after the change.
        at: when the change was made (tz-aware), by that store's clock: a history's times need not increase.
        actor: who made it, or whose message the memory is, as that store recorded (Mem0's ``actor_id``); ``None``
            when it did not.
        role: the role of the message the memory was then (Mem0's ``role``: ``"user"``, ``"assistant"``); ``None``
            for none.
        metadata: the memory's metadata after the change, as that store recorded it (an InferScale history row's
            ``new_metadata``); ``None`` where it recorded none (Mem0's rows). Not hashed: equal changes with other
            metadata are told apart by ``==`` alone.
    """

    event: Literal["ADD", "UPDATE"]
    old_text: str | None
    new_text: str
    at: datetime
    actor: str | None = None
    role: str | None = None
    metadata: dict[str, Any] | None = field(default=None, hash=False)


@dataclass(frozen=True, slots=True)
class NewMemory:
    """A memory to add.

    Attributes:
        text: the fact, stored as given.
        metadata: JSON-serialisable user metadata (never scope ids).
        context: the conversation turns the fact's KV is encoded after (oldest first).
        neighbours: how many of the first ``context`` entries are texts of memories of the change set's scope (read
            before the transaction, or added earlier in the same set). Each must still be held by a memory of exactly
            that scope when the add is written, or it is dropped (:mod:`inferscale.storage.contexts`); the entries
            after them (an ``add(infer=True)`` call's own rendered turns) are kept as given.
        chain_from: where the texts of the memory's bounded chain start in ``context`` (``kv.chain_block``): the
            entries before it are its block anchor's context turns, those from it on the texts of the block's
            earlier memories, oldest first; equal to ``len(context)`` for the anchor itself. ``None`` (the default)
            puts the memory in no chain. Every entry of a chained memory's context is a neighbour.
        memory_id: the new memory's id, a canonical UUID, when it comes from another store (an import keeps the ids
            an application holds); ``None`` (the default) gives it a new UUID4. A memory of exactly the change
            set's scope that holds the id already, or a deleted memory that had it, makes the add a skip (an import
            run again); a memory of another scope holding it, an error.
        created_at, updated_at: the memory's times in the store it comes from (tz-aware). Without ``created_at`` the
            memory is dated ``updated_at``, without both the time of the write; ``updated_at`` defaults to the
            memory's date. Its ``ADD`` history row is dated as the memory (unless ``history`` is given).
        history: the changes the store it comes from recorded, in the order their texts chain: an ``ADD``, then
            ``UPDATE``s, the last one's ``new_text`` the memory's text, each dated by its own time. They are its
            history rows instead of the one ``ADD`` row dated as the memory; empty (the default): that one row.
    """

    text: str
    metadata: dict[str, Any] = field(default_factory=dict)
    context: tuple[str, ...] = ()
    neighbours: int = 0
    chain_from: int | None = None
    memory_id: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    history: tuple[PastChange, ...] = ()


@dataclass(frozen=True, slots=True)
class MemoryUpdate:
    """A change to an existing memory: a new text, new metadata (set over the stored dict, key by key, as Mem0
    merges: :func:`~inferscale.storage.records.merged_metadata`), or both.

    Attributes:
        instead: the memory to add when this update is skipped because its memory is gone, or changed since the
            update was decided (:attr:`ChangeSet.seen`): the new fact an LLM's ``UPDATE`` carried, which no other
            change of the set holds. Its presence marks the update as an LLM's (:attr:`ChangeSet.skip_duplicates`).
    """

    memory_id: str
    text: str | None = None
    metadata: dict[str, Any] | None = None
    instead: NewMemory | None = None


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
        skip_duplicates: an add whose text is already stored in the scope is skipped (no row, no history); an
            LLM's update (one with :attr:`MemoryUpdate.instead`) to a text another memory of exactly its memory's
            scope holds deletes its memory instead (a ``DELETE`` history row): two memories of a scope never hold
            one text through a reconcile, and the old text the update was to replace does not stay beside the new.
            Its ``instead`` memory is added unless its text is still held once the set's updates are applied.
        skip_unchanged: an update that changes neither text nor metadata is skipped (no history row, same
            ``updated_at``); otherwise it is written like any other update. Metadata is unchanged only when it is the
            same JSON, types included (``True`` is not ``1``, ``1.0`` is not ``1``).
        seen: ``(memory_id, text hash)`` pairs: the texts the updates and deletes were decided on (an LLM shown
            them). An update or delete of a memory whose text has changed since (another call updated it meanwhile)
            is skipped, so a decision about the old text never overwrites or deletes the new one.
    """

    scope: Scope | None
    adds: tuple[NewMemory, ...] = ()
    updates: tuple[MemoryUpdate, ...] = ()
    deletes: tuple[str, ...] = ()
    actor: str | None = None
    strict: bool = False
    skip_duplicates: bool = True
    skip_unchanged: bool = True
    seen: tuple[tuple[str, str], ...] = ()

    def possible_adds(self) -> tuple[NewMemory, ...]:
        """The adds, then the updates' ``instead`` memories: all this set may add."""
        return (*self.adds, *(u.instead for u in self.updates if u.instead is not None))


@dataclass(frozen=True, slots=True)
class AppliedChanges:
    """What a :class:`ChangeSet` did.

    Attributes:
        added: the new memories, in the order of ``adds`` (skipped duplicates left out).
        updated: ``(before, after)`` pairs, in the order of ``updates`` (skipped updates left out).
        deleted: the memories as they were before deletion.
        skipped: one human-readable reason per change that was not applied.
        recontexted: memories whose stored context lost the text of a deleted or re-worded memory of their scope
            (:mod:`inferscale.storage.contexts`), as after the change; their ``kv_entries`` rows are deleted, and
            their K/V are to be dropped and encoded again (their encoding key covers the context).
    """

    added: list[MemoryRecord]
    updated: list[tuple[MemoryRecord, MemoryRecord]]
    deleted: list[MemoryRecord]
    skipped: list[str]
    recontexted: list[MemoryRecord] = field(default_factory=list)


def held_elsewhere(memory_id: str) -> str:
    """The refusal of a new memory's given id that a memory of another scope holds: whose memory it is stays
    unsaid (another tenant's scope is never shown)."""
    return (
        f"memory id {memory_id} is held by a memory of another scope: leave the record out, or give it that scope's "
        "ids if it is that memory"
    )


# ---- building and checking change sets -------------------------------------------------------------------------


def validate_changes(changes: ChangeSet) -> ChangeSet:
    """Check every text, id and metadata dict before anything is written.

    Returns:
        The change set with metadata deep-copied into plain JSON values.

    Raises:
        InvalidInputError: for an empty text, a bad id, non-JSON metadata, an update with nothing to change, a
            scope that is not a Scope, adds without a scope, or one id given to two new memories.
    """
    if changes.possible_adds() and changes.scope is None:
        raise InvalidInputError("adding memories needs a scope (user_id, agent_id or run_id)")
    scope = check_scope(changes.scope) if changes.scope is not None else None
    adds = tuple(_checked_add(a) for a in changes.adds)
    given = Counter(a.memory_id for a in changes.possible_adds() if a.memory_id is not None)
    repeated = sorted(i for i, n in given.items() if n > 1)
    if repeated:
        raise InvalidInputError(f"the same id is given to more than one new memory: {', '.join(repeated)}")
    updates: list[MemoryUpdate] = []
    for u in changes.updates:
        if u.text is None and u.metadata is None:
            raise InvalidInputError(f"nothing to update for memory {u.memory_id!r}: pass text, metadata or both")
        updates.append(
            MemoryUpdate(
                check_id(u.memory_id),
                check_text(u.text) if u.text is not None else None,
                check_metadata(u.metadata) if u.metadata is not None else None,
                _checked_add(u.instead) if u.instead is not None else None,
            )
        )
    deletes = tuple(check_id(d) for d in changes.deletes)
    actor = check_actor(changes.actor)
    seen = tuple((check_id(memory_id), check_key(digest, "seen text hash")) for memory_id, digest in changes.seen)
    return ChangeSet(
        scope,
        adds,
        tuple(updates),
        deletes,
        actor,
        changes.strict,
        changes.skip_duplicates,
        changes.skip_unchanged,
        seen,
    )


def _checked_add(new: NewMemory) -> NewMemory:
    """``new`` validated, its metadata deep-copied.

    Raises:
        InvalidInputError: for an empty text, non-JSON metadata, non-str context, ``neighbours`` that is not an
            int from 0 to the number of context turns, or a ``chain_from`` that is not ``None`` or such an int, or
            that is set while some context entry is not a neighbour; for a given id that is not a canonical UUID, a
            given time that is not a tz-aware ``datetime``, or a ``history`` that is not an ``ADD`` and then
            ``UPDATE``s, each taking the text on from the one before, to the memory's text (and to its metadata,
            where the last change records the metadata after it).
    """
    context = tuple(check_context(new.context))
    neighbours = check_count(new.neighbours, "neighbours")
    if neighbours > len(context):
        raise InvalidInputError(f"neighbours is {neighbours}, more than the {len(context)} context turns")
    chain_from = None if new.chain_from is None else check_count(new.chain_from, "chain_from")
    if chain_from is not None and (chain_from > len(context) or neighbours != len(context)):
        raise InvalidInputError(
            f"chain_from is {chain_from} with {len(context)} context turns of which {neighbours} are neighbours: a "
            "chain starts within the context, and every turn of a chained memory is a neighbour"
        )
    memory_id = None if new.memory_id is None else check_new_id(new.memory_id)
    created_at = None if new.created_at is None else check_utc_time(new.created_at, "created_at")
    updated_at = None if new.updated_at is None else check_utc_time(new.updated_at, "updated_at")
    text = check_text(new.text)
    metadata = check_metadata(new.metadata)
    return NewMemory(
        text,
        metadata,
        context,
        neighbours,
        chain_from,
        memory_id,
        created_at,
        updated_at,
        _checked_history(new.history, text, metadata),
    )


def _checked_history(history: object, text: str, metadata: dict[str, Any]) -> tuple[PastChange, ...]:
    """``history`` (:attr:`NewMemory.history`) checked: empty, or an ``ADD`` with no old text, then ``UPDATE``s each
    taking the text on from the change before it, ending at ``text``, and, where the last change records the
    metadata after it, at ``metadata``.

    Raises:
        InvalidInputError: for anything else, or a change whose text, time, actor or role is not valid.
    """
    if not isinstance(history, tuple) or any(not isinstance(change, PastChange) for change in history):
        raise InvalidInputError("a new memory's history is a tuple of PastChange")
    checked: list[PastChange] = []
    for change in history:
        expected = ("ADD", None) if not checked else ("UPDATE", checked[-1].new_text)
        if (change.event, change.old_text) != expected:
            raise InvalidInputError(
                f"history change {len(checked)} is {change.event} from {change.old_text!r}: a history is an ADD, then "
                "UPDATEs, each from the text the change before it left"
            )
        at = check_utc_time(change.at, "a history change's time")
        new_text = check_text(change.new_text, "a history change's new text")
        role = None if change.role is None else check_key(change.role, "a history change's role")
        after = None if change.metadata is None else check_metadata(change.metadata)
        checked.append(PastChange(change.event, change.old_text, new_text, at, check_actor(change.actor), role, after))
    if checked and checked[-1].new_text != text:
        raise InvalidInputError("a history ends at the text its memory has: its last change leaves another one")
    if checked and checked[-1].metadata is not None and not same_json(_stated(checked[-1].metadata), _stated(metadata)):
        raise InvalidInputError(
            "a history ends at the metadata its memory has: its last change records other metadata "
            f"({checked[-1].metadata!r}, the memory's is {metadata!r})"
        )
    return tuple(checked)


def _stated(metadata: dict[str, Any]) -> dict[str, Any]:
    """``metadata`` without a ``role`` or ``actor_id`` of ``None``: an import leaves such a key out of the memory's
    metadata (it says nothing), so a history row that kept it ends at the same metadata."""
    return {key: value for key, value in metadata.items() if not (key in ATTRIBUTION_KEYS and value is None)}


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


__all__ = [
    "AppliedChanges",
    "ChangeSet",
    "MemoryUpdate",
    "NewMemory",
    "PastChange",
    "add_change",
    "delete_change",
    "held_elsewhere",
    "update_change",
    "validate_changes",
]
