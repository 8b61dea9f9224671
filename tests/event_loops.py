"""Running one client from several event loops at once, as a service whose threads each call ``asyncio.run`` does."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any


def run_on_own_loops(
    coroutine_of: Callable[[int], Coroutine[Any, Any, object]], count: int, timeout_s: float = 60.0
) -> dict[int, object]:
    """Run ``coroutine_of(i)`` for ``i`` in ``range(count)``, each under ``asyncio.run`` on a thread of its own, all at
    once; returns each one's result, or the exception it raised, by ``i`` (one still running after ``timeout_s``
    seconds is missing: a hang)."""
    answers: dict[int, object] = {}

    def worker(i: int) -> None:
        try:
            answers[i] = asyncio.run(coroutine_of(i))
        except Exception as exc:  # returned: a thread cannot raise into the test
            answers[i] = exc

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout_s)
    return answers
