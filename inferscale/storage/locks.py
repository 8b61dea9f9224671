"""Transaction-scoped locks that make check-then-write steps safe across connections and processes.

SQLite needs none of its own: every write transaction starts ``BEGIN IMMEDIATE``
(:data:`~inferscale.storage.database.WRITE_OPTION`), so writers to one file run one at a time. PostgreSQL's default
``READ COMMITTED`` lets two transactions check for the same absent row at once and both insert it; there a
transaction takes an advisory lock (``pg_advisory_xact_lock``) on a 64-bit key before it checks, so a second one
waits until the first commits and then sees its row. The lock is released when the transaction ends, commit or
rollback. Other dialects get no lock (InferScale is tested on SQLite and PostgreSQL).

Each advisory lock takes a slot of PostgreSQL's shared lock table (``max_locks_per_transaction`` x
``max_connections`` slots for the whole server, 64 x 100 by default), so one lock per key would let a large change
set (an import of thousands of memories, each with an id to claim) fill it and fail with "out of shared memory".
:func:`lock_keys` therefore escalates, as databases escalate row locks to a table lock: every locking transaction
first takes one *escalation lock* of its schema (advisory locks are database-wide; an escalated write in one schema
never holds back another schema's writers, though two schemas' writers to scopes of the same ids still take turns on
their keys), shared while it names at most :data:`MAX_ADVISORY_KEYS` keys (it then locks each of them as
well), exclusive when it names more (it then locks none of them: holding the escalation lock alone excludes every
other locking transaction of the schema, as SQLite's writers exclude each other). A transaction thus holds at most
``MAX_ADVISORY_KEYS + 1`` advisory locks. The schema lock (:mod:`inferscale.storage.schema`) is taken alone
(``escalate=False``): a migration's DDL must never wait on writers while holding a lock they wait for.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from sqlalchemy import Connection, func, select
from sqlalchemy.orm import Session

_INT64_BITS = 64

MAX_ADVISORY_KEYS = 32
"""The most keys :func:`lock_keys` locks one by one in a transaction; past it, the exclusive escalation lock stands
for them all. Half of PostgreSQL's default ``max_locks_per_transaction`` (64)."""


def advisory_key(*parts: str) -> int:
    """A signed 64-bit advisory-lock key naming ``parts`` (the first 8 bytes of the sha256 of their NUL-joined UTF-8
    text). Two different names share a key with probability 2**-64; they would then only wait for each other."""
    digest = hashlib.sha256("\x00".join(parts).encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[: _INT64_BITS // 8], "big", signed=True)


def escalation_key(schema: str) -> int:
    """The advisory key :func:`lock_keys` locks first in ``schema``: shared for a few keys, exclusive for many."""
    return advisory_key("inferscale.escalation", schema)


def current_schema(conn: Connection | Session) -> str:
    """``current_schema()`` of ``conn``'s PostgreSQL session (``""`` when none is set)."""
    return str(conn.execute(select(func.current_schema())).scalar_one_or_none() or "")


def lock_keys(conn: Connection | Session, keys: Iterable[int], *, escalate: bool = True) -> None:
    """Lock ``keys`` for the rest of the current transaction, on PostgreSQL; waits while another transaction holds
    one. Does nothing on other dialects, or when there are no keys.

    With ``escalate`` (module docstring), the schema's escalation lock comes first, shared when there are at most
    :data:`MAX_ADVISORY_KEYS` distinct keys, then each key in ascending order (two transactions that lock
    overlapping key sets then never wait for each other in a cycle); with more keys, the escalation lock is taken
    exclusive and the keys are not locked one by one. Without it, each key alone, in ascending order. Call it once
    per transaction: a second call could wait, holding locks, on a transaction that waits on the first call's.

    Args:
        conn: the connection or session whose current transaction holds the locks until it ends.
        keys: signed 64-bit keys (see :func:`advisory_key`); duplicates are taken once.
        escalate: whether the keys take part in escalation (every write does; the schema lock does not).
    """
    distinct = sorted(set(keys))
    if not distinct or not _on_postgresql(conn):
        return
    if escalate and len(distinct) > MAX_ADVISORY_KEYS:
        lock_all(conn)
        return
    if escalate:
        conn.execute(select(func.pg_advisory_xact_lock_shared(escalation_key(current_schema(conn)))))
    for key in distinct:
        conn.execute(select(func.pg_advisory_xact_lock(key)))


def lock_all(conn: Connection | Session) -> None:
    """Take the schema's escalation lock exclusive for the rest of the current transaction, on PostgreSQL: no other
    locking transaction of the schema runs until it ends (for a change to every memory, ``reset``; a
    :func:`lock_keys` call with more than :data:`MAX_ADVISORY_KEYS` keys). Does nothing on other dialects. Counts
    as the transaction's one :func:`lock_keys` call."""
    if _on_postgresql(conn):
        conn.execute(select(func.pg_advisory_xact_lock(escalation_key(current_schema(conn)))))


def _on_postgresql(conn: Connection | Session) -> bool:
    dialect = conn.dialect if isinstance(conn, Connection) else conn.get_bind().dialect
    return dialect.name == "postgresql"


__all__ = ["MAX_ADVISORY_KEYS", "advisory_key", "current_schema", "escalation_key", "lock_all", "lock_keys"]
