"""Transactions that an interruption cannot leave open.

A ``KeyboardInterrupt`` (Ctrl-C, SIGINT) is raised wherever the main thread happens to be, and an asyncio
cancellation wherever the cancelled coroutine awaits: both can land inside SQLAlchemy's commit, its rollback, or the
return of the connection to its pool. That connection is then neither committed, rolled back nor closed. It keeps
its transaction open (on SQLite the file's write lock, so every other writer, in this process or another, fails
after the busy timeout) until the garbage collector finds it, and the store's ``close()`` cannot release it: a
checked-out connection is not its pool's to close.

- :func:`sigint_deferred`: a Ctrl-C that arrives while a sync transaction runs is raised once the transaction has
  ended (committed or rolled back, its connection back in the pool); :func:`guarded_session` opens a session so.
- :class:`ToTheEnd`: an async transaction runs in a task of its own, shielded from its caller's cancellation: the
  caller is cancelled at once, the transaction still ends (a cancelled write may commit, as a write whose reply was
  lost may), and the store's ``close()`` waits for the transactions still running before it disposes the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Coroutine, Iterator
from types import FrameType
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from inferscale.storage.database import WRITE_OPTION

_T = TypeVar("_T")


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """Hold back SIGINT (Ctrl-C) for the block, then deliver it to the handler that was installed before: the
    default one raises ``KeyboardInterrupt`` when the block has ended. Only the main thread receives signals, so in
    any other thread (or where Python did not install the SIGINT handler) the block runs as it is.

    Raises:
        KeyboardInterrupt: after the block, when Ctrl-C arrived during it (the default handler's).
    """
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous is None:
        yield
        return
    received: list[FrameType | None] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        received.append(frame)

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            if callable(previous):
                previous(signal.SIGINT, received[-1])
            elif previous == signal.SIG_DFL:
                signal.raise_signal(signal.SIGINT)


@contextlib.contextmanager
def guarded_session(engine: Engine, *, write: bool = False) -> Iterator[Session]:
    """A session on ``engine`` under :func:`sigint_deferred`; with ``write``, in one write transaction (``BEGIN
    IMMEDIATE`` on SQLite, :data:`~inferscale.storage.database.WRITE_OPTION`), committed when the block ends and
    rolled back when it raises. Records are kept readable after the commit (``expire_on_commit=False``).

    Raises:
        KeyboardInterrupt: after the session has ended, when Ctrl-C arrived meanwhile.
    """
    bind = engine.execution_options(**{WRITE_OPTION: True}) if write else engine
    with sigint_deferred(), Session(bind, expire_on_commit=False) as session:
        if not write:
            yield session
            return
        with session.begin():
            yield session


class ToTheEnd:
    """Runs async transactions to their end whatever happens to their callers (see the module docstring), and
    knows which are still running, for ``close()``."""

    def __init__(self) -> None:
        self._running: set[asyncio.Task[Any]] = set()

    async def run(self, transaction: Coroutine[Any, Any, _T]) -> _T:
        """``await transaction``, in a task of its own that the caller's cancellation does not reach.

        Raises:
            asyncio.CancelledError: when the caller is cancelled (at once; the transaction goes on).
            whatever ``transaction`` raises.
        """
        task = asyncio.ensure_future(transaction)
        self._running.add(task)
        task.add_done_callback(self._forget)
        return await asyncio.shield(task)

    def _forget(self, task: asyncio.Task[Any]) -> None:
        self._running.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a caller cancelled meanwhile no longer awaits it (no "never retrieved")

    async def wait(self) -> None:
        """Wait until the transactions started on the running event loop have ended (their errors are their
        callers')."""
        loop = asyncio.get_running_loop()
        running = [task for task in self._running if task.get_loop() is loop]
        if running:
            await asyncio.gather(*running, return_exceptions=True)


__all__ = ["ToTheEnd", "guarded_session", "sigint_deferred"]
