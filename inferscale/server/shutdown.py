"""The server's shutdown grace as one budget: :class:`ShutdownClock` marks when the server began stopping, and the
app's lifespan gives the memory client's background K/V encoder what is left of the grace once the running requests
are done (:func:`inferscale.server.app.create_app`); :func:`serve_uvicorn` runs an app under a uvicorn server that
starts the clock on the signal."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import uvicorn


class ShutdownClock:
    """When the server began stopping, and how much of its grace is left; the first :meth:`begin` wins. It takes no
    lock, so a signal handler may call it while the thread it interrupted is inside it (two first calls racing keep
    one of their two moments).

    Args:
        now: the clock read, in seconds (``time.monotonic``; a test passes its own).
    """

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now
        self._began: float | None = None

    def begin(self) -> None:
        """Mark now as the moment the server began stopping, unless a moment was marked already."""
        if self._began is None:
            self._began = self._now()

    def left(self, grace_s: float) -> float:
        """The seconds left of a ``grace_s``-second grace counted from :meth:`begin` (called now if it was not):
        ``grace_s`` minus the time since, never below 0."""
        self.begin()
        began = self._began
        assert began is not None
        return max(0.0, began + grace_s - self._now())


def serve_uvicorn(config: uvicorn.Config, clock: ShutdownClock) -> bool:
    """Run uvicorn's server on ``config`` until it stops (blocks), as ``uvicorn.run`` does for one process (a
    ``KeyboardInterrupt`` ends it quietly), with ``clock`` begun on the first SIGTERM or SIGINT (or when the server
    begins its shutdown for another reason), so the app's lifespan knows how much of the grace the requests used.

    Returns:
        whether the server started (``uvicorn.run`` exits with status 3 when it did not).
    """
    import uvicorn

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            clock.begin()  # the grace counts from the signal (the main loop notices it up to 0.1 s later)
            super().handle_exit(sig, frame)

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            clock.begin()
            await super().shutdown(sockets)

    server = _Server(config)
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    return server.started
