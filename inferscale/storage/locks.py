"""Transaction-scoped locks that make check-then-write steps safe across connections and processes.

SQLite needs none of its own: every write transaction starts ``BEGIN IMMEDIATE``
(:data:`~inferscale.storage.database.WRITE_OPTION`), so writers to one file run one at a time. PostgreSQL's default
``READ COMMITTED`` lets two transactions check for the same absent row at once and both insert it; there a
transaction takes an advisory lock (``pg_advisory_xact_lock``) on a 64-bit key before it checks, so a second one
waits until the first commits and then sees its row. The lock is released when the transaction ends, commit or
rollback. Other dialects get no lock (InferScale is tested on SQLite and PostgreSQL).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from sqlalchemy import Connection, func, select
from sqlalchemy.orm import Session

_INT64_BITS = 64


def advisory_key(*parts: str) -> int:
    """A signed 64-bit advisory-lock key naming ``parts`` (the first 8 bytes of the sha256 of their NUL-joined UTF-8
    text). Two different names share a key with probability 2**-64; they would then only wait for each other."""
    digest = hashlib.sha256("\x00".join(parts).encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[: _INT64_BITS // 8], "big", signed=True)


def lock_keys(conn: Connection | Session, keys: Iterable[int]) -> None:
    """Take PostgreSQL's transaction-scoped advisory lock on every key, in ascending order (two transactions that
    lock overlapping key sets then never wait for each other in a cycle); waits while another transaction holds
    one. Does nothing on other dialects.

    Args:
        conn: the connection or session whose current transaction holds the locks until it ends.
        keys: signed 64-bit keys (see :func:`advisory_key`); duplicates are taken once.
    """
    dialect = conn.dialect if isinstance(conn, Connection) else conn.get_bind().dialect
    if dialect.name != "postgresql":
        return
    for key in sorted(set(keys)):
        conn.execute(select(func.pg_advisory_xact_lock(key)))


__all__ = ["advisory_key", "lock_keys"]
