"""The memory store: memories, their history and KV-entry bookkeeping in any SQL database (the source of truth).

Everything returned is a frozen record detached from the session, so callers never hold ORM objects. Inputs
are validated before anything is written; a rejected call leaves the database untouched.

Scope semantics: a memory is in a :class:`~inferscale.scope.Scope` when every id the scope sets is equal to the
memory's column (the ids are ANDed; ids the scope leaves unset are not constrained).
"""

from __future__ import annotations

import builtins
import copy
import hashlib
import math
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self

import numpy as np
from sqlalchemy import ColumnElement, Engine, delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from inferscale.errors import ConfigError, InvalidInputError, MemoryNotFoundError
from inferscale.scope import Scope
from inferscale.storage.database import WRITE_OPTION, make_engine

if TYPE_CHECKING:
    from inferscale.filters import Filter
    from inferscale.storage.changes import AppliedChanges, ChangeSet

from inferscale.storage.models import (
    KEY_LENGTH,
    Base,
    HistoryRow,
    KVEntryRow,
    MemoryRow,
    utc_now,
)

HistoryEvent = Literal["ADD", "UPDATE", "DELETE"]

_IN_CHUNK = 500  # ids per IN (...) clause; stays far below SQLite's bound-parameter limit
_MAX_JSON_DEPTH = 64


def hash_text(text: str) -> str:
    """The sha256 hex digest (64 lowercase hex characters) of ``text`` encoded as UTF-8."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------------------------


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
        )


@dataclass(frozen=True, slots=True)
class HistoryRecord:
    """One change to a memory.

    Attributes:
        id: the row's integer key (increases with time).
        memory_id: the public id of the memory that changed.
        event: ``"ADD"``, ``"UPDATE"`` or ``"DELETE"``.
        old_text, new_text: the text before and after (``old_text`` is ``None`` on ADD, ``new_text`` on DELETE).
        old_metadata, new_metadata: the metadata before and after, same convention.
        actor: who made the change, when the caller said so.
        created_at: tz-aware UTC time of the change.
    """

    id: int
    memory_id: str
    event: HistoryEvent
    old_text: str | None
    new_text: str | None
    old_metadata: dict[str, Any] | None
    new_metadata: dict[str, Any] | None
    actor: str | None
    created_at: datetime

    @classmethod
    def from_row(cls, row: HistoryRow) -> HistoryRecord:
        """A detached copy of ``row``."""
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
            memory_id=row.memory_id,
            event=event,
            old_text=row.old_text,
            new_text=row.new_text,
            old_metadata=copy.deepcopy(row.old_metadata),
            new_metadata=copy.deepcopy(row.new_metadata),
            actor=row.actor,
            created_at=row.created_at,
        )


@dataclass(frozen=True, slots=True)
class KVEntryRecord:
    """Where one fact's KV tensors are stored, for one model fingerprint and encoding.

    Attributes:
        id: the row's integer key.
        memory_id: the public id of the memory.
        text_hash: sha256 hex of the text the KV was encoded from; differs from the memory's ``hash`` once the
            memory's text has been updated (the entry is then stale).
        fingerprint: the model / dtype / rope / tokenizer fingerprint the KV was built with.
        encoding_key: how the fact was encoded (context window, prefix).
        n_tokens: the fact's length (tokens).
        nbytes: size of the stored tensors (bytes).
        location: where the tensors live (a file path or a store key).
        created_at: tz-aware UTC time the entry was last written.
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
        )


# --------------------------------------------------------------------------------------------------------------
# Validation (runs before any write)
# --------------------------------------------------------------------------------------------------------------


def _check_text(text: object, name: str = "text") -> str:
    if not isinstance(text, str):
        raise InvalidInputError(f"{name} must be a str, got {type(text).__name__}")
    if not text.strip():
        raise InvalidInputError(f"{name} must not be empty or whitespace, got {text!r}")
    return text


def _check_key(value: object, name: str) -> str:
    text = _check_text(value, name)
    if len(text) > KEY_LENGTH:
        raise InvalidInputError(f"{name} is {len(text)} characters; at most {KEY_LENGTH} are stored")
    return text


def _check_id(memory_id: object) -> str:
    if not isinstance(memory_id, str) or not memory_id:
        raise InvalidInputError(f"memory_id must be a non-empty str, got {memory_id!r}")
    return memory_id


def _check_scope(scope: object) -> Scope:
    if not isinstance(scope, Scope):
        raise InvalidInputError(
            f"scope must be an inferscale.scope.Scope, got {type(scope).__name__}; e.g. Scope(user_id='alice')"
        )
    return scope


def _check_actor(actor: object) -> str | None:
    if actor is None:
        return None
    return _check_key(actor, "actor")


def _check_json(value: object, where: str, depth: int = 0) -> None:
    if depth > _MAX_JSON_DEPTH:
        raise InvalidInputError(f"{where} nests deeper than {_MAX_JSON_DEPTH} levels (is it cyclic?)")
    if value is None or isinstance(value, str | bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInputError(f"{where} is {value!r}; JSON has no NaN or infinity")
        return
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_json(item, f"{where}[{i}]", depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidInputError(f"{where} has the key {key!r}; JSON object keys must be str")
            _check_json(item, f"{where}[{key!r}]", depth + 1)
        return
    raise InvalidInputError(
        f"{where} is a {type(value).__name__}, which is not JSON-serialisable; "
        "use str, int, float, bool, None, list or dict"
    )


def _check_metadata(metadata: object) -> dict[str, Any]:
    """A deep copy of ``metadata`` (``None`` → ``{}``), tuples turned into lists as JSON stores them."""
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise InvalidInputError(f"metadata must be a dict, got {type(metadata).__name__}")
    _check_json(metadata, "metadata")
    return _json_copy(metadata)


def _json_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _json_copy(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_copy(item) for item in value]
    return value


def _check_context(context: object) -> list[str]:
    if context is None:
        return []
    if isinstance(context, str) or not isinstance(context, Sequence):
        raise InvalidInputError(f"context must be a list of str (conversation turns), got {context!r}")
    turns = list(context)
    for i, turn in enumerate(turns):
        if not isinstance(turn, str):
            raise InvalidInputError(f"context[{i}] must be a str, got {type(turn).__name__}")
    return turns


def _check_count(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise InvalidInputError(f"{name} must be a non-negative int, got {value!r}")
    return int(value)


def _check_vector_ids(ids: object) -> builtins.list[int]:
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise InvalidInputError(f"ids must be a 1-D integer array, got shape {ids.shape} dtype {ids.dtype}")
        return [int(i) for i in ids]
    if isinstance(ids, str) or not isinstance(ids, Sequence):
        raise InvalidInputError(f"ids must be a sequence of int, got {type(ids).__name__}")
    out: builtins.list[int] = []
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int | np.integer):
            raise InvalidInputError(f"vector ids must be int, got {i!r}")
        out.append(int(i))
    return out


def _scope_clauses(scope: Scope) -> builtins.list[ColumnElement[bool]]:
    clauses: builtins.list[ColumnElement[bool]] = []
    if scope.user_id is not None:
        clauses.append(MemoryRow.user_id == scope.user_id)
    if scope.agent_id is not None:
        clauses.append(MemoryRow.agent_id == scope.agent_id)
    if scope.run_id is not None:
        clauses.append(MemoryRow.run_id == scope.run_id)
    return clauses


def _chunks(values: Sequence[Any], size: int = _IN_CHUNK) -> Iterator[Sequence[Any]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


# --------------------------------------------------------------------------------------------------------------
# Store
# --------------------------------------------------------------------------------------------------------------


class MemoryStore:
    """Memories, history and KV entries in one SQL database, addressed by a SQLAlchemy URL.

    The constructor does no I/O: the engine is created and the tables are created (if missing) on first use,
    once, under a lock, so a store may be shared by threads. Every method runs in its own transaction.

    Args:
        url: any SQLAlchemy URL, e.g. ``sqlite:////home/me/.cache/inferscale/memory.db`` or
            ``postgresql+psycopg://postgres@127.0.0.1:5432/inferscale``.

    Raises:
        ConfigError: when ``url`` is not a non-empty string (a malformed URL is reported on first use).

    Every method may also raise ``sqlalchemy.exc.OperationalError`` when the database cannot be reached.
    """

    def __init__(self, url: str) -> None:
        if not isinstance(url, str) or not url.strip():
            raise ConfigError(f"database url must be a non-empty string, got {url!r}")
        self._url = url
        self._engine: Engine | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        """The SQLAlchemy URL this store was opened with."""
        return self._url

    def __repr__(self) -> str:
        return f"MemoryStore({self._url!r})"

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ---- lifecycle ---------------------------------------------------------------------------------------

    @property
    def engine(self) -> Engine:
        """The engine, created (and the schema with it) on first access.

        Raises:
            ConfigError: when the URL is malformed or its driver is not installed.
        """
        engine = self._engine
        if engine is not None:
            return engine
        with self._lock:
            if self._engine is None:
                engine = make_engine(self._url)
                try:
                    # Under the write lock, so two processes opening a new file do not both create the tables.
                    with engine.execution_options(**{WRITE_OPTION: True}).begin() as conn:
                        Base.metadata.create_all(conn)
                except BaseException:
                    engine.dispose()
                    raise
                self._engine = engine
            return self._engine

    def _session(self) -> Session:
        return Session(self.engine, expire_on_commit=False)

    def _write_session(self) -> Session:
        """A session whose transactions take the write lock up front (``BEGIN IMMEDIATE`` on SQLite)."""
        return Session(self.engine.execution_options(**{WRITE_OPTION: True}), expire_on_commit=False)

    @property
    def dialect(self) -> str:
        """The database's dialect name, e.g. ``"sqlite"`` or ``"postgresql"`` (opens the engine)."""
        return self.engine.dialect.name

    def close(self) -> None:
        """Dispose the engine's connections. The store reconnects if it is used again."""
        with self._lock:
            if self._engine is not None:
                self._engine.dispose()
                self._engine = None

    def reset(self) -> None:
        """Delete every row of every table (memories, history, KV entries). The schema stays."""
        with self._write_session() as s, s.begin():
            s.execute(delete(KVEntryRow))
            s.execute(delete(HistoryRow))
            s.execute(delete(MemoryRow))

    # ---- memories ----------------------------------------------------------------------------------------

    def add(
        self,
        text: str,
        scope: Scope,
        metadata: dict[str, Any] | None = None,
        context: Sequence[str] | None = None,
        actor: str | None = None,
    ) -> MemoryRecord:
        """Store a new memory and its ``ADD`` history row in one transaction.

        Args:
            text: the fact; a non-empty string, stored as given.
            scope: the ids the memory belongs to.
            metadata: JSON-serialisable dict (str keys; str/int/float/bool/None/list/dict values).
            context: preceding conversation turns used to encode the fact's KV (oldest first).
            actor: who made the change, recorded in the history.

        Returns:
            The stored memory, with its new UUID4 ``id`` and integer ``vector_id``.

        Raises:
            InvalidInputError: for an empty text, a non-Scope scope, non-JSON metadata or non-str context.
        """
        text = _check_text(text)
        scope = _check_scope(scope)
        meta = _check_metadata(metadata)
        turns = _check_context(context)
        actor = _check_actor(actor)
        now = utc_now()
        row = MemoryRow(
            id=str(uuid.uuid4()),
            text=text,
            hash=hash_text(text),
            user_id=scope.user_id,
            agent_id=scope.agent_id,
            run_id=scope.run_id,
            metadata_=meta,
            context=turns,
            created_at=now,
            updated_at=now,
        )
        with self._write_session() as s, s.begin():
            s.add(row)
            s.add(
                HistoryRow(
                    memory_id=row.id,
                    event="ADD",
                    old_text=None,
                    new_text=text,
                    old_metadata=None,
                    new_metadata=_json_copy(meta),
                    actor=actor,
                    created_at=now,
                )
            )
            s.flush()  # assigns the integer key
            record = MemoryRecord.from_row(row)
        return record

    def get(self, memory_id: str, scope: Scope | None = None) -> MemoryRecord | None:
        """The memory with public id ``memory_id``; ``None`` when there is none or it is outside ``scope``.

        Raises:
            InvalidInputError: when ``memory_id`` is not a non-empty str or ``scope`` is not a Scope.
        """
        memory_id = _check_id(memory_id)
        clauses = _scope_clauses(_check_scope(scope)) if scope is not None else []
        with self._session() as s:
            row = s.scalars(select(MemoryRow).where(MemoryRow.id == memory_id, *clauses)).one_or_none()
            return MemoryRecord.from_row(row) if row is not None else None

    def find_by_hash(self, text_hash: str, scope: Scope) -> MemoryRecord | None:
        """The oldest memory in ``scope`` whose text hashes to ``text_hash`` (see :func:`hash_text`), or None.

        Raises:
            InvalidInputError: when ``text_hash`` is not a non-empty str or ``scope`` is not a Scope.
        """
        text_hash = _check_text(text_hash, "text_hash")
        clauses = _scope_clauses(_check_scope(scope))
        stmt = (
            select(MemoryRow)
            .where(MemoryRow.hash == text_hash, *clauses)
            .order_by(MemoryRow.created_at, MemoryRow.pk)
            .limit(1)
        )
        with self._session() as s:
            row = s.scalars(stmt).first()
            return MemoryRecord.from_row(row) if row is not None else None

    def list(
        self, scope: Scope, limit: int | None = None, filters: Filter | None = None
    ) -> builtins.list[MemoryRecord]:
        """The memories in ``scope`` that match ``filters``, oldest first, at most ``limit`` (all when ``None``).

        Args:
            scope: the ids to stay inside.
            limit: the most memories to return.
            filters: a parsed filter (:func:`inferscale.filters.parse_filters`), compiled to SQL.

        Raises:
            InvalidInputError: when ``scope`` is not a Scope or ``limit`` is not a positive int.
        """
        from inferscale.storage.changes import select_memories

        scope = _check_scope(scope)
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise InvalidInputError(f"limit must be a positive int or None, got {limit!r}")
        stmt = select_memories(scope, filters, self.dialect, limit)
        with self._session() as s:
            return [MemoryRecord.from_row(row) for row in s.scalars(stmt)]

    def all_memories(self) -> builtins.list[MemoryRecord]:
        """Every memory of every scope, in ``vector_id`` order (used to rebuild a vector index)."""
        with self._session() as s:
            return [MemoryRecord.from_row(row) for row in s.scalars(select(MemoryRow).order_by(MemoryRow.pk))]

    def by_vector_ids(self, ids: Sequence[int] | np.ndarray) -> dict[int, MemoryRecord]:
        """The memories whose ``vector_id`` is in ``ids``, keyed by vector id; unknown ids are left out.

        Args:
            ids: int64 vector ids, e.g. the ids a FAISS search returned (any order, duplicates allowed).

        Raises:
            InvalidInputError: when ``ids`` holds something other than integers.
        """
        wanted = sorted(set(_check_vector_ids(ids)))
        found: dict[int, MemoryRecord] = {}
        if not wanted:
            return found
        with self._session() as s:
            for chunk in _chunks(wanted):
                for row in s.scalars(select(MemoryRow).where(MemoryRow.pk.in_(chunk))):
                    found[int(row.pk)] = MemoryRecord.from_row(row)
        return found

    def vector_ids_in_scope(self, scope: Scope, filters: Filter | None = None) -> np.ndarray:
        """The vector ids of the memories in ``scope`` that match ``filters``: an int64 array ``[n]``, ascending.

        Raises:
            InvalidInputError: when ``scope`` is not a Scope.
        """
        from inferscale.storage.changes import select_vector_ids

        stmt = select_vector_ids(_check_scope(scope), filters, self.dialect)
        with self._session() as s:
            ids = s.scalars(stmt).all()
        return np.asarray(ids, dtype=np.int64).reshape(-1)

    def apply(self, changes: ChangeSet) -> AppliedChanges:
        """Apply adds, updates and deletes with their history rows in one transaction (all or nothing).

        Returns:
            :class:`~inferscale.storage.changes.AppliedChanges`: what was added, updated, deleted and skipped.

        Raises:
            InvalidInputError: for an invalid change (nothing is written).
            MemoryNotFoundError: with ``changes.strict``, for an unknown id (nothing is written).
        """
        from inferscale.storage.changes import apply_in_session, validate_changes

        checked = validate_changes(changes)
        with self._write_session() as s, s.begin():
            return apply_in_session(s, checked)

    def update(
        self,
        memory_id: str,
        text: str | None,
        metadata: dict[str, Any] | None = None,
        actor: str | None = None,
    ) -> MemoryRecord:
        """Replace a memory's text and/or metadata, and record an ``UPDATE`` history row with old and new.

        A new ``text`` also updates ``hash``; ``metadata``, when given, replaces the whole dict; ``updated_at``
        is set to now. KV entries are left alone: their ``text_hash`` no longer matches, which marks them stale.

        Raises:
            InvalidInputError: when neither ``text`` nor ``metadata`` is given, or either is invalid.
            MemoryNotFoundError: when no memory has id ``memory_id``.
        """
        memory_id = _check_id(memory_id)
        new_text = _check_text(text) if text is not None else None
        new_meta = _check_metadata(metadata) if metadata is not None else None
        actor = _check_actor(actor)
        if new_text is None and new_meta is None:
            raise InvalidInputError(f"nothing to update for memory {memory_id!r}: pass text, metadata or both")
        now = utc_now()
        with self._write_session() as s, s.begin():
            row = s.scalars(select(MemoryRow).where(MemoryRow.id == memory_id).with_for_update()).one_or_none()
            if row is None:
                raise MemoryNotFoundError(f"no memory with id {memory_id!r}")
            old_text = row.text
            old_meta = copy.deepcopy(row.metadata_)
            if new_text is not None:
                row.text = new_text
                row.hash = hash_text(new_text)
            if new_meta is not None:
                row.metadata_ = new_meta
            row.updated_at = now
            s.add(
                HistoryRow(
                    memory_id=memory_id,
                    event="UPDATE",
                    old_text=old_text,
                    new_text=row.text,
                    old_metadata=old_meta,
                    new_metadata=_json_copy(row.metadata_),
                    actor=actor,
                    created_at=now,
                )
            )
            s.flush()
            record = MemoryRecord.from_row(row)
        return record

    def delete(self, memory_id: str, actor: str | None = None) -> MemoryRecord:
        """Delete a memory and its KV entries, recording a ``DELETE`` history row.

        Returns:
            The memory as it was just before deletion (its ``vector_id`` is what to remove from the index).

        Raises:
            InvalidInputError: when ``memory_id`` or ``actor`` is not a non-empty str.
            MemoryNotFoundError: when no memory has id ``memory_id``.
        """
        memory_id = _check_id(memory_id)
        actor = _check_actor(actor)
        with self._write_session() as s, s.begin():
            row = s.scalars(select(MemoryRow).where(MemoryRow.id == memory_id).with_for_update()).one_or_none()
            if row is None:
                raise MemoryNotFoundError(f"no memory with id {memory_id!r}")
            record = MemoryRecord.from_row(row)
            self._delete_rows(s, [record], actor)
        return record

    def delete_scope(self, scope: Scope, actor: str | None = None) -> builtins.list[MemoryRecord]:
        """Delete every memory in ``scope`` (and their KV entries), one ``DELETE`` history row each.

        Returns:
            The deleted memories, oldest first.

        Raises:
            InvalidInputError: when ``scope`` is not a Scope or ``actor`` is not a non-empty str.
        """
        clauses = _scope_clauses(_check_scope(scope))
        actor = _check_actor(actor)
        with self._write_session() as s, s.begin():
            rows = s.scalars(select(MemoryRow).where(*clauses).order_by(MemoryRow.created_at, MemoryRow.pk)).all()
            records = [MemoryRecord.from_row(row) for row in rows]
            self._delete_rows(s, records, actor)
        return records

    @staticmethod
    def _delete_rows(s: Session, records: Sequence[MemoryRecord], actor: str | None) -> None:
        now = utc_now()
        ids = [record.id for record in records]
        for chunk in _chunks(ids):
            s.execute(
                delete(KVEntryRow).where(KVEntryRow.memory_id.in_(chunk)).execution_options(synchronize_session=False)
            )
            s.execute(delete(MemoryRow).where(MemoryRow.id.in_(chunk)).execution_options(synchronize_session=False))
        s.add_all(
            HistoryRow(
                memory_id=record.id,
                event="DELETE",
                old_text=record.text,
                new_text=None,
                old_metadata=_json_copy(record.metadata),
                new_metadata=None,
                actor=actor,
                created_at=now,
            )
            for record in records
        )

    def history(self, memory_id: str) -> builtins.list[HistoryRecord]:
        """The changes to ``memory_id``, oldest first (also after it was deleted); ``[]`` for an unknown id.

        Raises:
            InvalidInputError: when ``memory_id`` is not a non-empty str.
        """
        memory_id = _check_id(memory_id)
        stmt = select(HistoryRow).where(HistoryRow.memory_id == memory_id).order_by(HistoryRow.id)
        with self._session() as s:
            return [HistoryRecord.from_row(row) for row in s.scalars(stmt)]

    # ---- KV entries --------------------------------------------------------------------------------------

    def put_kv_entry(
        self,
        memory_id: str,
        text_hash: str,
        fingerprint: str,
        encoding_key: str,
        n_tokens: int,
        nbytes: int,
        location: str,
    ) -> KVEntryRecord:
        """Insert or replace the KV entry of ``(memory_id, fingerprint, encoding_key)``.

        Args:
            memory_id: the memory's public id.
            text_hash: sha256 hex of the text the KV was encoded from.
            fingerprint: model / dtype / rope / tokenizer fingerprint (at most 255 characters).
            encoding_key: how the fact was encoded (at most 255 characters).
            n_tokens: the fact's length (tokens, >= 0).
            nbytes: size of the stored tensors (bytes, >= 0).
            location: where the tensors live.

        Returns:
            The stored entry; ``created_at`` is the time of this write.

        Raises:
            InvalidInputError: when an argument is empty, too long or negative.
            MemoryNotFoundError: when no memory has id ``memory_id``.
        """
        memory_id = _check_id(memory_id)
        text_hash = _check_key(text_hash, "text_hash")
        fingerprint = _check_key(fingerprint, "fingerprint")
        encoding_key = _check_key(encoding_key, "encoding_key")
        n_tokens = _check_count(n_tokens, "n_tokens")
        nbytes = _check_count(nbytes, "nbytes")
        location = _check_text(location, "location")
        # Two writers may insert the same key at once; the loser retries and updates the winner's row.
        for attempt in range(2):
            try:
                with self._write_session() as s, s.begin():
                    if s.scalar(select(MemoryRow.pk).where(MemoryRow.id == memory_id)) is None:
                        raise MemoryNotFoundError(f"no memory with id {memory_id!r}")
                    row = s.scalars(
                        select(KVEntryRow).where(
                            KVEntryRow.memory_id == memory_id,
                            KVEntryRow.fingerprint == fingerprint,
                            KVEntryRow.encoding_key == encoding_key,
                        )
                    ).one_or_none()
                    if row is None:
                        row = KVEntryRow(memory_id=memory_id, fingerprint=fingerprint, encoding_key=encoding_key)
                        s.add(row)
                    row.text_hash = text_hash
                    row.n_tokens = n_tokens
                    row.nbytes = nbytes
                    row.location = location
                    row.created_at = utc_now()
                    s.flush()
                    record = KVEntryRecord.from_row(row)
                return record
            except IntegrityError:
                if attempt == 1:
                    raise
        raise AssertionError("unreachable")

    def get_kv_entry(self, memory_id: str, fingerprint: str, encoding_key: str) -> KVEntryRecord | None:
        """The KV entry of ``(memory_id, fingerprint, encoding_key)``, or ``None``.

        Raises:
            InvalidInputError: when an argument is not a non-empty str.
        """
        memory_id = _check_id(memory_id)
        fingerprint = _check_text(fingerprint, "fingerprint")
        encoding_key = _check_text(encoding_key, "encoding_key")
        stmt = select(KVEntryRow).where(
            KVEntryRow.memory_id == memory_id,
            KVEntryRow.fingerprint == fingerprint,
            KVEntryRow.encoding_key == encoding_key,
        )
        with self._session() as s:
            row = s.scalars(stmt).one_or_none()
            return KVEntryRecord.from_row(row) if row is not None else None

    def delete_kv_entries(self, memory_id: str) -> builtins.list[KVEntryRecord]:
        """Delete every KV entry of ``memory_id`` and return them (so their tensors can be removed too).

        Raises:
            InvalidInputError: when ``memory_id`` is not a non-empty str.
        """
        memory_id = _check_id(memory_id)
        with self._write_session() as s, s.begin():
            rows = s.scalars(select(KVEntryRow).where(KVEntryRow.memory_id == memory_id).order_by(KVEntryRow.id)).all()
            records = [KVEntryRecord.from_row(row) for row in rows]
            s.execute(
                delete(KVEntryRow).where(KVEntryRow.memory_id == memory_id).execution_options(synchronize_session=False)
            )
        return records
