"""Thread pools a process keeps for the async API's blocking work, apart from the event loop's default executor.

Work that can hold a thread for seconds gets threads of its own, so that it never makes a millisecond call wait:

- SQLite sessions (:mod:`inferscale.storage.async_sessions`): a write waits up to the busy timeout for another
  process's lock;
- model work (:data:`MODEL_WORK`): generation, LLM fact extraction and the reconcile decision, K/V encoding, loading
  the model. A search's embedding and index scan run on the default executor, and before model work had threads of
  its own, a search waited there behind generating chats until one ended (``benchmarks/search_beside_chats.py``).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

_P = ParamSpec("_P")
_T = TypeVar("_T")

MODEL_WORK_THREADS = 16
"""Threads for the model work of every async client of the process. Local model calls take turns on their model's
lock whatever the count; an OpenAI-compatible extraction endpoint answers up to this many calls at once."""


class ProcessThreads:
    """A thread pool of ``max_workers`` threads for this process, made on first use and again in a forked child: the
    parent's threads do not exist there, and an inherited pool that counted them as idle never ran the child's
    calls (it hung)."""

    def __init__(self, max_workers: int, name: str) -> None:
        self._max_workers = max_workers
        self._name = name
        self._made: tuple[int, ThreadPoolExecutor] | None = None
        self._lock = threading.Lock()

    def pool(self) -> ThreadPoolExecutor:
        """This process's pool."""
        with self._lock:
            if self._made is None or self._made[0] != os.getpid():
                made = ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix=self._name)
                self._made = (os.getpid(), made)
            return self._made[1]


MODEL_WORK = ProcessThreads(MODEL_WORK_THREADS, "inferscale-model")
"""The threads the async client runs model work on (module docstring), shared by every client of the process."""


async def on_threads(threads: ProcessThreads | None, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """``fn(*args, **kwargs)`` on one of ``threads`` (``None``: the event loop's default executor), in a copy of the
    caller's context variables (as ``asyncio.to_thread``). A cancelled caller stops waiting: the call is dropped if it
    has not begun, else runs on.

    Raises:
        Whatever ``fn`` raises.
    """
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    pool = None if threads is None else threads.pool()
    return await asyncio.get_running_loop().run_in_executor(pool, call)


__all__ = ["MODEL_WORK", "MODEL_WORK_THREADS", "ProcessThreads", "on_threads"]
