"""Writes of the KV-entry bookkeeping (where each fact's KV tensors are stored, per model and encoding).

Like :mod:`inferscale.storage.changes`, each ``*_in_session`` function runs inside the caller's ``Session`` and
transaction, for the sync store directly and for the async store through ``AsyncSession.run_sync``; reads are in
:mod:`inferscale.storage.queries`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from inferscale.errors import InvalidInputError, MemoryNotFoundError
from inferscale.storage.models import STORE_ID_LENGTH, KVEntryRow, MemoryRow, utc_now
from inferscale.storage.queries import chunks, select_kv_entry
from inferscale.storage.records import KVEntryRecord, MemoryRecord
from inferscale.storage.validation import check_count, check_id, check_key, check_text


class MemoryChangedError(MemoryNotFoundError):
    """The memory's text, stored context or chain start is no longer the one a K/V entry was encoded from: another
    client changed it after the encoder read it (a re-wording, or a deleted text scrubbed from its context). The
    entry is not written; the memory is encoded again from its new state when next used."""


@dataclass(frozen=True, slots=True)
class NewKVEntry:
    """Where one fact's KV tensors were stored; build it with :meth:`checked`. Fields as in
    :class:`~inferscale.storage.records.KVEntryRecord`, and:

    Attributes:
        context: the memory's stored context as read before encoding (every turn, not only the last w), or ``None``
            to write the entry whatever the memory holds now. When given, the entry is written only while the
            memory still has ``text_hash``, this context and ``chain_from``.
        chain_from: the memory's chain start as read before encoding (with ``context``).
    """

    memory_id: str
    text_hash: str
    fingerprint: str
    encoding_key: str
    n_tokens: int
    nbytes: int
    location: str
    store_id: str | None = None
    context: tuple[str, ...] | None = None
    chain_from: int | None = None

    @classmethod
    def checked(
        cls,
        memory_id: object,
        text_hash: object,
        fingerprint: object,
        encoding_key: object,
        n_tokens: object,
        nbytes: object,
        location: object,
        store_id: object = None,
        encoded_from: MemoryRecord | None = None,
    ) -> NewKVEntry:
        """The validated entry; ``encoded_from``, the memory's record as the encoder read it, gives its ``context``
        and ``chain_from`` (``None``: unchecked).

        Raises:
            InvalidInputError: when an id or key is empty or longer than 255 characters (a ``store_id`` longer than
                32), or a count is negative; when ``encoded_from`` is not a record of this memory and text hash.
        """
        if encoded_from is not None and (
            not isinstance(encoded_from, MemoryRecord) or (encoded_from.id, encoded_from.hash) != (memory_id, text_hash)
        ):
            raise InvalidInputError("encoded_from must be the MemoryRecord of the entry's memory and text hash")
        return cls(
            check_id(memory_id),
            check_key(text_hash, "text_hash"),
            check_key(fingerprint, "fingerprint"),
            check_key(encoding_key, "encoding_key"),
            check_count(n_tokens, "n_tokens"),
            check_count(nbytes, "nbytes"),
            check_text(location, "location"),
            None if store_id is None else check_key(store_id, "store_id", STORE_ID_LENGTH),
            None if encoded_from is None else tuple(encoded_from.context),
            None if encoded_from is None else encoded_from.chain_from,
        )


def put_kv_entry_in_session(s: Session, entry: NewKVEntry) -> KVEntryRecord:
    """Insert or replace the KV entry of ``(memory_id, fingerprint, encoding_key)``; ``created_at`` is now. The
    memory's row is read locked (``FOR UPDATE`` on PostgreSQL; SQLite's write transaction holds the database), so a
    change of its text or context commits either before this check or after this row, and then deletes it. Every
    writer locks memory rows before K/V rows (``reset`` too), so none deadlocks with this one.

    Raises:
        MemoryNotFoundError: when no memory has id ``entry.memory_id``.
        MemoryChangedError: when ``entry.context`` is given and the memory's text hash, context or chain start is
            no longer the entry's (nothing is written).
        sqlalchemy.exc.IntegrityError: when a concurrent writer inserted the same key first (retry the
            transaction: the row then exists and is updated).
    """
    held = select(MemoryRow.hash, MemoryRow.context, MemoryRow.chain_from).where(MemoryRow.id == entry.memory_id)
    memory = s.execute(held.with_for_update()).one_or_none()
    if memory is None:
        raise MemoryNotFoundError(f"no memory with id {entry.memory_id!r}")
    now = (memory.hash, tuple(memory.context or ()), memory.chain_from)
    if entry.context is not None and now != (entry.text_hash, entry.context, entry.chain_from):
        raise MemoryChangedError(
            f"memory {entry.memory_id!r} changed after its K/V were encoded (its text or context): they are not "
            "stored, and it is encoded again when next used"
        )
    row = s.scalars(select_kv_entry(entry.memory_id, entry.fingerprint, entry.encoding_key)).one_or_none()
    if row is None:
        row = KVEntryRow(memory_id=entry.memory_id, fingerprint=entry.fingerprint, encoding_key=entry.encoding_key)
        s.add(row)
    row.text_hash = entry.text_hash
    row.n_tokens = entry.n_tokens
    row.nbytes = entry.nbytes
    row.location = entry.location
    row.store_id = entry.store_id
    row.created_at = utc_now()
    s.flush()
    return KVEntryRecord.from_row(row)


def delete_kv_entries_in_session(s: Session, memory_id: str) -> list[KVEntryRecord]:
    """Delete every KV entry of ``memory_id`` and return them, oldest first (so their tensors can go too)."""
    rows = s.scalars(select(KVEntryRow).where(KVEntryRow.memory_id == memory_id).order_by(KVEntryRow.id)).all()
    records = [KVEntryRecord.from_row(row) for row in rows]
    s.execute(delete(KVEntryRow).where(KVEntryRow.memory_id == memory_id).execution_options(synchronize_session=False))
    return records


def delete_kv_entry_rows_in_session(s: Session, row_ids: Sequence[int]) -> int:
    """Delete the KV entries whose row id is in ``row_ids`` (ids already gone are ignored); returns how many
    rows were deleted. Used by reconciliation for entries whose file is gone or whose text is stale, and by the
    scrub for entries that depended on a memory's old context."""
    deleted = 0
    for chunk in chunks(sorted(set(row_ids))):
        stmt = delete(KVEntryRow).where(KVEntryRow.id.in_(list(chunk))).execution_options(synchronize_session=False)
        deleted += int(getattr(s.execute(stmt), "rowcount", 0) or 0)
    return deleted


def delete_kv_entry_rows_sized(s: Session, row_ids: Sequence[int]) -> list[int]:
    """Delete the KV entries whose row id is in ``row_ids`` and return the ``nbytes`` of each row deleted (ids already
    gone are ignored), so a caller counts only what it removed itself. The rows are read, locked on PostgreSQL
    (``FOR UPDATE``; SQLite's write transaction holds the database), then deleted in the caller's transaction: no
    ``DELETE ... RETURNING``, which SQLite before 3.35 does not parse."""
    sizes: list[int] = []
    for chunk in chunks(sorted(set(row_ids))):
        held = select(KVEntryRow.id, KVEntryRow.nbytes).where(KVEntryRow.id.in_(list(chunk))).with_for_update()
        rows = [(int(row_id), int(nbytes)) for row_id, nbytes in s.execute(held)]
        if rows:
            gone = delete(KVEntryRow).where(KVEntryRow.id.in_([row_id for row_id, _ in rows]))
            s.execute(gone.execution_options(synchronize_session=False))
        sizes += [nbytes for _, nbytes in rows]
    return sizes


__all__ = [
    "MemoryChangedError",
    "NewKVEntry",
    "delete_kv_entries_in_session",
    "delete_kv_entry_rows_in_session",
    "delete_kv_entry_rows_sized",
    "put_kv_entry_in_session",
]
