"""The history rows a write adds: one per change (:func:`history_row`), or, for a memory an import brings from
another store, one per change that store recorded (:func:`imported_history_rows`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from inferscale.storage.change_sets import PastChange
from inferscale.storage.models import HistoryRow, MemoryRow
from inferscale.storage.records import ATTRIBUTION_KEYS, HistoryEvent, MemoryRecord
from inferscale.storage.validation import json_copy


def history_row(
    memory_id: str,
    event: HistoryEvent,
    before: MemoryRecord | None,
    after: MemoryRow | None,
    actor: str | None,
    now: datetime,
) -> HistoryRow:
    """The history row of one change; ``before`` or ``after`` (whichever exists) gives the memory's scope."""
    scope = before.scope() if before is not None else after
    return HistoryRow(
        memory_id=memory_id,
        event=event,
        old_text=before.text if before is not None else None,
        new_text=after.text if after is not None else None,
        old_metadata=json_copy(before.metadata) if before is not None else None,
        new_metadata=json_copy(after.metadata_) if after is not None else None,
        actor=actor,
        user_id=scope.user_id if scope is not None else None,
        agent_id=scope.agent_id if scope is not None else None,
        run_id=scope.run_id if scope is not None else None,
        created_at=now,
    )


def imported_history_rows(row: MemoryRow, past: Sequence[PastChange]) -> list[HistoryRow]:
    """The rows of the changes ``past`` (an ``ADD``, then ``UPDATE``s ending at ``row``'s text) that the store
    ``row``'s memory comes from recorded, in that order, each dated and attributed as it was there.

    A change that records the metadata after it (:attr:`PastChange.metadata`: another InferScale store's history)
    shows that metadata. Mem0 kept no other metadata in its history (a row's ``role`` and ``actor_id`` alone), so
    each of its rows shows the memory's metadata as stored here with the ``role`` and ``actor_id`` of its change, and
    the last one the memory's metadata as it is. An update's old metadata is the change before it's.
    """
    kept = {key: value for key, value in (row.metadata_ or {}).items() if key not in ATTRIBUTION_KEYS}
    said = [
        {**kept, **{key: value for key, value in (("role", c.role), ("actor_id", c.actor)) if value is not None}}
        for c in past[:-1]
    ]
    said.append(dict(row.metadata_ or {}))  # after the last change: the memory as it is
    said = [c.metadata if c.metadata is not None else computed for c, computed in zip(past, said, strict=True)]
    return [
        HistoryRow(
            memory_id=row.id,
            event=change.event,
            old_text=change.old_text,
            new_text=change.new_text,
            old_metadata=json_copy(said[i - 1]) if i > 0 else None,
            new_metadata=json_copy(said[i]),
            actor=change.actor,
            user_id=row.user_id,
            agent_id=row.agent_id,
            run_id=row.run_id,
            created_at=change.at,
        )
        for i, change in enumerate(past)
    ]


__all__ = ["history_row", "imported_history_rows"]
