"""Mem0-shaped result dicts of the public API (memories, history rows, applied changes)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from inferscale.storage import HistoryRecord, MemoryRecord
from inferscale.storage.change_sets import AppliedChanges, ChangeSet
from inferscale.storage.records import ATTRIBUTION_KEYS


def memory_to_dict(record: MemoryRecord, score: float | None = None) -> dict[str, Any]:
    """The Mem0-shaped dict of one memory.

    Returns:
        ``{"id", "memory", "hash", "metadata", "created_at", "updated_at"}`` (timestamps ISO 8601, UTC), the scope
        ids that are set (``"user_id"``, ``"agent_id"``, ``"run_id"``), the stored ``"role"`` and ``"actor_id"``
        (:data:`~inferscale.storage.records.ATTRIBUTION_KEYS`) beside them and not in ``"metadata"``, as Mem0's
        results promote them, and ``"score"`` when given. ``"hash"`` is Mem0's: the MD5 hex digest of the text
        (the store keys texts by their SHA-256, :attr:`MemoryRecord.hash`).
    """
    metadata = dict(record.metadata)
    promoted = {key: metadata.pop(key) for key in ATTRIBUTION_KEYS if key in metadata}
    out: dict[str, Any] = {
        "id": record.id,
        "memory": record.text,
        "hash": hashlib.md5(record.text.encode("utf-8"), usedforsecurity=False).hexdigest(),
        "metadata": metadata,
        "created_at": record.created_at.isoformat(),
        "updated_at": record.updated_at.isoformat(),
    }
    out.update(record.scope_dict())
    out.update(promoted)
    if score is not None:
        out["score"] = score
    return out


def history_to_dict(row: HistoryRecord) -> dict[str, Any]:
    """The Mem0-shaped dict of one history row.

    Returns:
        ``{"id", "memory_id", "event", "old_memory", "new_memory", "old_metadata", "new_metadata", "actor_id",
        "role", "created_at", "is_deleted"}`` and the memory's scope ids that are set; ``old_memory`` is ``None``
        on ADD, ``new_memory`` is ``None`` on DELETE. As in Mem0, a memory stored from a message keeps that
        message's ``role`` and speaker (``actor_id``: its ``name``, ``None`` without one) on every event, an
        UPDATE's and a DELETE's included (read from the metadata after the change, or before it where that names
        neither: a history imported from Mem0 keeps each change's own); an extracted fact has no ``role``, and its
        ``actor_id`` is who made the change, when the caller said so. A row of a memory deleted before the store
        recorded scopes has no scope ids.
    """
    after = row.new_metadata or {}
    # the metadata after the change (an imported row's own role and actor_id); merged with the metadata before it
    # where it names neither (a DELETE's; an update's of a store before metadata updates kept them, 5 Dec 2026)
    said = after if any(key in after for key in ATTRIBUTION_KEYS) else {**(row.old_metadata or {}), **after}
    actor = said.get("actor_id") if "role" in said else row.actor
    return {
        "id": row.public_id,
        "memory_id": row.memory_id,
        "event": row.event,
        "old_memory": row.old_text,
        "new_memory": row.new_text,
        "old_metadata": row.old_metadata,
        "new_metadata": row.new_metadata,
        "actor_id": actor,
        "role": said.get("role"),
        **(row.scope.as_dict() if row.scope is not None else {}),
        "created_at": row.created_at.isoformat(),
        "is_deleted": row.event == "DELETE",
    }


def changes_to_results(applied: AppliedChanges) -> list[dict[str, Any]]:
    """The ``results`` list of ``add``: ``{"id", "memory", "event"}`` per change (DELETEs, UPDATEs, ADDs), UPDATEs
    with ``"previous_memory"``, DELETEs with the deleted text as ``"memory"``; an ADD of a message stored verbatim
    (``infer=False``) also carries its ``"actor_id"`` (``None`` without a speaker name) and ``"role"``, as Mem0's
    does."""
    out: list[dict[str, Any]] = [{"id": r.id, "memory": r.text, "event": "DELETE"} for r in applied.deleted]
    out += [
        {"id": after.id, "memory": after.text, "event": "UPDATE", "previous_memory": before.text}
        for before, after in applied.updated
    ]
    for r in applied.added:
        added: dict[str, Any] = {"id": r.id, "memory": r.text, "event": "ADD"}
        if "role" in r.metadata:  # a message stored verbatim (attributed by its role)
            added.update(actor_id=r.metadata.get("actor_id"), role=r.metadata["role"])
        out.append(added)
    return out


def imports_to_results(
    applied: Sequence[tuple[ChangeSet, AppliedChanges]],
    left_out: Sequence[dict[str, str]],
    expired: Sequence[tuple[str, str]],
) -> dict[str, list[dict[str, Any]]]:
    """What ``import_memories`` returns: ``{"results": [...], "skipped": [...]}``.

    ``results`` holds one ADD per stored memory, as :func:`changes_to_results`; ``skipped`` one ``{"id", "reason"}``
    per memory not stored: those the import's plan ``left_out`` (imported before, or deleted here), those a
    concurrent write stored first (an add of ``applied`` that did not happen), and those Mem0 hides as expired
    (``expired``: ``(id, YYYY-MM-DD)`` pairs)."""
    results: list[dict[str, Any]] = []
    skipped = [*left_out, *({"id": memory_id, "reason": f"expired on {day}"} for memory_id, day in expired)]
    for changes, done in applied:
        results += changes_to_results(done)
        stored = {r.id for r in done.added}
        skipped += [
            {"id": new.memory_id, "reason": "stored meanwhile by another write"}
            for new in changes.adds
            if new.memory_id is not None and new.memory_id not in stored
        ]
    return {"results": results, "skipped": skipped}


# ---------------------------------------------------------------------------------------------------- arguments
