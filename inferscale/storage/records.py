"""The frozen records the stores return: detached copies of rows, so callers never hold ORM objects."""

from __future__ import annotations

import copy
import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import numpy as np

from inferscale.scope import Scope
from inferscale.storage.models import HistoryRow, KVEntryRow, MemoryRow

HistoryEvent = Literal["ADD", "UPDATE", "DELETE"]


def hash_text(text: str) -> str:
    """The sha256 hex digest (64 lowercase hex characters) of ``text`` encoded as UTF-8."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


ATTRIBUTION_KEYS = ("role", "actor_id")
"""The metadata keys that say who said a verbatim memory: the role and the speaker's name (OpenAI's ``name``) of the
message ``add(infer=False)`` stored it from. As in Mem0, a metadata update keeps them unless it names them
(:func:`merged_metadata`), and result dicts show them beside the scope ids rather than inside ``metadata``."""


def merged_metadata(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The metadata of an update: ``old`` with ``new``'s keys set over it, as Mem0 merges (its keys that ``new``
    does not name, the :data:`ATTRIBUTION_KEYS` among them, stay)."""
    return {**old, **new}


@dataclass(frozen=True, slots=True)
class MemoryRecord:
    """One stored fact.

    Attributes:
        id: the public UUID4 string.
        vector_id: the integer key, also the fact's FAISS vector id (int64).
        text: the fact.
        hash: sha256 hex of ``text``.
        user_id, agent_id, run_id: the scope the fact was written in (unset ids are ``None``).
        metadata: JSON-serialisable user metadata.
        context: the preceding conversation turns the fact's KV is encoded after (oldest first).
        created_at, updated_at: tz-aware UTC timestamps.
        chain_from: where the texts of the memory's bounded chain start in ``context`` (the turns before are its
            block anchor's), or ``None`` when it is in no chain (:mod:`inferscale.storage.contexts`).
    """

    id: str
    vector_id: int
    text: str
    hash: str
    user_id: str | None
    agent_id: str | None
    run_id: str | None
    metadata: dict[str, Any]
    context: list[str]
    created_at: datetime
    updated_at: datetime
    chain_from: int | None = None

    def scope(self) -> Scope:
        """The exact scope the memory was written in."""
        return Scope.of_row(self.user_id, self.agent_id, self.run_id)

    def scope_dict(self) -> dict[str, str]:
        """The scope ids that are set, e.g. ``{"user_id": "alice", "run_id": "r1"}``."""
        ids = {"user_id": self.user_id, "agent_id": self.agent_id, "run_id": self.run_id}
        return {key: value for key, value in ids.items() if value is not None}

    @classmethod
    def from_row(cls, row: MemoryRow) -> MemoryRecord:
        """A detached copy of ``row``."""
        return cls(
            id=row.id,
            vector_id=int(row.pk),
            text=row.text,
            hash=row.hash,
            user_id=row.user_id,
            agent_id=row.agent_id,
            run_id=row.run_id,
            metadata=copy.deepcopy(row.metadata_) if row.metadata_ is not None else {},
            context=list(row.context) if row.context is not None else [],
            created_at=row.created_at,
            updated_at=row.updated_at,
            chain_from=row.chain_from,
        )


@dataclass(frozen=True, slots=True)
class HistoryRecord:
    """One change to a memory.

    Attributes:
        id: the row's integer key (increases with time, over every memory of the store).
        public_id: the id results show (:func:`history_public_id`): a UUID string, as Mem0's, that says nothing
            about other memories' changes (the integer key counts every tenant's writes) and stays the same.
        memory_id: the public id of the memory that changed.
        event: ``"ADD"``, ``"UPDATE"`` or ``"DELETE"``.
        old_text, new_text: the text before and after (``old_text`` is ``None`` on ADD, ``new_text`` on DELETE).
        old_metadata, new_metadata: the metadata before and after, same convention.
        actor: who made the change, when the caller said so (the result dicts show a verbatim memory's speaker
            instead: :func:`inferscale.results.history_to_dict`).
        scope: the scope of the memory (every row of one memory has the same); ``None`` on rows of a memory
            deleted before the store recorded scopes in its history (revision 0004_history_scope), which no scoped
            read returns.
        created_at: tz-aware UTC time of the change.
    """

    id: int
    public_id: str
    memory_id: str
    event: HistoryEvent
    old_text: str | None
    new_text: str | None
    old_metadata: dict[str, Any] | None
    new_metadata: dict[str, Any] | None
    actor: str | None
    scope: Scope | None
    created_at: datetime

    @classmethod
    def from_row(cls, row: HistoryRow, scope: Scope | None, twin: int = 0) -> HistoryRecord:
        """A detached copy of ``row``, whose memory's scope is ``scope`` (read with the row:
        :func:`inferscale.storage.queries.history`); ``twin``: as :func:`history_public_id`."""
        event: HistoryEvent
        if row.event == "ADD":
            event = "ADD"
        elif row.event == "UPDATE":
            event = "UPDATE"
        elif row.event == "DELETE":
            event = "DELETE"
        else:
            raise ValueError(f"history row {row.id} has unknown event {row.event!r}")
        return cls(
            id=int(row.id),
            public_id=history_public_id(row.memory_id, row.event, row.created_at, twin),
            memory_id=row.memory_id,
            event=event,
            old_text=row.old_text,
            new_text=row.new_text,
            old_metadata=copy.deepcopy(row.old_metadata),
            new_metadata=copy.deepcopy(row.new_metadata),
            actor=row.actor,
            scope=scope,
            created_at=row.created_at,
        )


HISTORY_ID_NAMESPACE = uuid.UUID("6f1c2a7e-3d4b-4e8a-9b0c-5d2e7f813a46")
"""The UUID namespace of :func:`history_public_id` (fixed: the ids stay the same from release to release)."""


def history_public_id(memory_id: str, event: str, created_at: datetime, twin: int = 0) -> str:
    """The id a history row is shown with: a name-based UUID (``uuid5``) of its memory's id, its event and its time
    (``twin`` counts the earlier rows of that memory with the same event and time: 0 but for a clash of
    microseconds). What it is made of is shown in the row already, so, unlike the row's integer key, which counts
    the changes of every memory in the store, it tells a caller nothing about other memories' writes, other
    tenants' included; and a row keeps its id on every read, also after other rows are deleted."""
    return str(uuid.uuid5(HISTORY_ID_NAMESPACE, f"{memory_id}/{event}/{created_at.isoformat()}/{twin}"))


def scope_of_ids(user_id: str | None, agent_id: str | None, run_id: str | None) -> Scope | None:
    """The scope of these ids, or ``None`` when none is set (a history row whose memory's scope is unknown)."""
    if user_id is None and agent_id is None and run_id is None:
        return None
    return Scope.of_row(user_id, agent_id, run_id)


@dataclass(frozen=True, slots=True)
class KVEntryRecord:
    """Where one fact's KV tensors are stored, for one model fingerprint and encoding.

    Attributes:
        id: the row's integer key.
        memory_id: the public id of the memory.
        text_hash: sha256 hex of the text the KV was encoded from (a change of the memory's text deletes the
            entry in the same transaction).
        fingerprint: the model (weights, dtype, whole config) and tokenizer fingerprint the KV was built with.
        encoding_key: how and after what the fact was encoded (prefix tokens, context turns, w, mode, bucket).
        n_tokens: the fact's length (tokens).
        nbytes: size of the stored tensors (bytes).
        location: where the tensors live (a file path or a store key).
        created_at: tz-aware UTC time the entry was last written.
        store_id: the id of the K/V folder holding the file, or ``None`` (no disk tier, or written before
            folders had ids).
    """

    id: int
    memory_id: str
    text_hash: str
    fingerprint: str
    encoding_key: str
    n_tokens: int
    nbytes: int
    location: str
    created_at: datetime
    store_id: str | None = None

    @classmethod
    def from_row(cls, row: KVEntryRow) -> KVEntryRecord:
        """A detached copy of ``row``."""
        return cls(
            id=int(row.id),
            memory_id=row.memory_id,
            text_hash=row.text_hash,
            fingerprint=row.fingerprint,
            encoding_key=row.encoding_key,
            n_tokens=int(row.n_tokens),
            nbytes=int(row.nbytes),
            location=row.location,
            created_at=row.created_at,
            store_id=row.store_id,
        )


@dataclass(frozen=True, slots=True)
class HeldId:
    """What holds a memory id: the live memory with it (its exact scope and text hash), or, when none does, the
    history of a deleted memory that had it (both ``None``)."""

    scope: Scope | None
    text_hash: str | None


@dataclass(frozen=True, slots=True)
class MemoryVersions:
    """What a set of memories holds now, in the compact form the derived stores compare against (no texts).

    Attributes:
        vector_ids: int64 ``[n]``, ascending: the memories' vector ids.
        ids: ``n`` public ids, aligned with ``vector_ids``.
        hashes: ``n`` sha256 hex digests of the memories' texts, aligned with ``vector_ids``.
    """

    vector_ids: np.ndarray
    ids: tuple[str, ...]
    hashes: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.ids)


__all__ = [
    "ATTRIBUTION_KEYS",
    "HISTORY_ID_NAMESPACE",
    "HeldId",
    "HistoryEvent",
    "HistoryRecord",
    "KVEntryRecord",
    "MemoryRecord",
    "MemoryVersions",
    "hash_text",
    "history_public_id",
    "merged_metadata",
    "scope_of_ids",
]
