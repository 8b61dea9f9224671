"""Sync transactions that a Ctrl-C cannot leave open.

A ``KeyboardInterrupt`` (Ctrl-C, SIGINT) is raised wherever the main thread happens to be, and so can land inside
SQLAlchemy's commit, its rollback, or the return of the connection to its pool. That connection is then neither
committed, rolled back nor closed: it keeps its transaction open (on SQLite the file's write lock, so every other
writer, in this process or another, fails after the busy timeout) until the garbage collector finds it, and the
store's ``close()`` cannot release it: a checked-out connection is not its pool's to close.

:func:`sigint_deferred` holds a Ctrl-C back while a session runs and raises it once the session has ended
(committed or rolled back, its connection back in the pool); :func:`guarded_session` opens a session so. A second
Ctrl-C is not held back: a session waiting on an unreachable database stays interruptible.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from inferscale.storage.database import WRITE_OPTION, session_turn


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """Hold back a first SIGINT (Ctrl-C) for the block, then deliver it to the handler that was installed before:
    the default one raises ``KeyboardInterrupt`` when the block has ended. A second one during the block is
    delivered at once (the handler is restored first), so a block that hangs can still be interrupted. Only the main
    thread receives signals, so in any other thread (or where Python did not install the SIGINT handler) the block
    runs as it is.

    Raises:
        KeyboardInterrupt: after the block, when Ctrl-C arrived during it; at once, on a second Ctrl-C (both the
            default handler's).
    """
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous is None:
        yield
        return
    received: list[FrameType | None] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        if received:  # the second one: the caller insists
            received.clear()
            signal.signal(signal.SIGINT, previous)
            _deliver(previous, frame)
        else:
            received.append(frame)

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            _deliver(previous, received[-1])


def _deliver(handler: Any, frame: FrameType | None) -> None:
    """Run the SIGINT ``handler`` as the signal would have: call a Python one, re-raise for the default action."""
    if callable(handler):
        handler(signal.SIGINT, frame)
    elif handler == signal.SIG_DFL:
        signal.raise_signal(signal.SIGINT)


@contextlib.contextmanager
def guarded_session(engine: Engine, *, write: bool = False) -> Iterator[Session]:
    """A session on ``engine`` under :func:`sigint_deferred`; with ``write``, in one write transaction (``BEGIN
    IMMEDIATE`` on SQLite, :data:`~inferscale.storage.database.WRITE_OPTION`), committed when the block ends and
    rolled back when it raises. Records are kept readable after the commit (``expire_on_commit=False``). On an engine
    whose one connection every thread shares (in-memory SQLite), sessions take turns
    (:func:`~inferscale.storage.database.session_turn`); the wait for a turn stays interruptible.

    Raises:
        KeyboardInterrupt: after the session has ended, when Ctrl-C arrived meanwhile.
    """
    bind = engine.execution_options(**{WRITE_OPTION: True}) if write else engine
    with session_turn(engine), sigint_deferred(), Session(bind, expire_on_commit=False) as session:
        if not write:
            yield session
            return
        with session.begin():
            yield session


__all__ = ["guarded_session", "sigint_deferred"]
