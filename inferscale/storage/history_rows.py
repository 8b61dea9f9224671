"""The history rows a write adds: one per change (:func:`history_row`), or, for a memory an import brings from
another store, one per change that store recorded (:func:`imported_history_rows`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from inferscale.storage.change_sets import PastChange
from inferscale.storage.models import HistoryRow, MemoryRow
from inferscale.storage.records import HistoryEvent, MemoryRecord
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
    """The rows of the changes ``past`` (oldest first: an ``ADD``, then ``UPDATE``s ending at ``row``'s text) that
    the store ``row``'s memory comes from recorded, each dated and attributed as it was there.

    That store kept no metadata in its history (Mem0's does not), so each row shows the memory's metadata as
    stored here (``role`` and ``actor_id`` included), on both sides of an update.
    """
    return [
        HistoryRow(
            memory_id=row.id,
            event=change.event,
            old_text=change.old_text,
            new_text=change.new_text,
            old_metadata=json_copy(row.metadata_) if change.old_text is not None else None,
            new_metadata=json_copy(row.metadata_),
            actor=change.actor,
            user_id=row.user_id,
            agent_id=row.agent_id,
            run_id=row.run_id,
            created_at=change.at,
        )
        for change in past
    ]


__all__ = ["history_row", "imported_history_rows"]
