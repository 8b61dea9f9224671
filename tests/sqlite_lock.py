"""Whether a SQLite file's write lock is free: what the interrupted-transaction tests check after each write, in the
test process and in the child process a random Ctrl-C runs in."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def write_lock_is_free(path: Path | str) -> bool:
    """Whether another connection can take ``path``'s write lock (``BEGIN IMMEDIATE``) within half a second."""
    db = sqlite3.connect(path, timeout=0.5)
    try:
        db.execute("BEGIN IMMEDIATE")
        db.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        db.close()
