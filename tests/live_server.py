"""A real uvicorn server on 127.0.0.1, on a free port, in a thread of the test process: for tests that talk to the
InferScale server over HTTP (the remote client's runs of the API suite).

The server runs its own event loop in its thread; ``on_stop`` (e.g. the served client's ``close``) is awaited on that
loop after the server has shut down, so what the app's client bound to the loop (async SQL connections) is closed
where it lives.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn

START_TIMEOUT_S = 30.0


class LiveServer:
    """One uvicorn server serving ``app`` on ``127.0.0.1:<free port>``, started by :meth:`start`.

    Attributes:
        url: ``"http://127.0.0.1:<port>"``.
    """

    def __init__(self, app: Any, on_stop: Callable[[], Awaitable[None]] | None = None) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))  # the kernel picks a free port; uvicorn listens on this very socket
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", lifespan="auto", timeout_graceful_shutdown=5)
        self._server = uvicorn.Server(config)
        self._on_stop = on_stop
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"uvicorn {self.url}", daemon=True)

    def _run(self) -> None:
        async def serve() -> None:
            try:
                await self._server.serve(sockets=[self._sock])
            finally:
                if self._on_stop is not None:
                    await self._on_stop()

        try:
            asyncio.run(serve())
        except BaseException as exc:  # reported by start() or stop(), in the test's thread
            self._error = exc

    def start(self) -> LiveServer:
        """Start the server and wait until it accepts requests.

        Raises:
            RuntimeError: when it did not start within ``START_TIMEOUT_S`` (with the server thread's error).
        """
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self._server.should_exit = True
                self._thread.join(START_TIMEOUT_S)
                self._sock.close()
                raise RuntimeError(f"the test server at {self.url} did not start") from self._error
            time.sleep(0.002)
        return self

    def stop(self) -> None:
        """Shut the server down (open connections are closed), run ``on_stop`` on its loop, and wait for both.

        Raises:
            RuntimeError: when the server thread failed (with its error) or did not end.
        """
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(START_TIMEOUT_S)
        self._sock.close()
        if self._thread.is_alive():
            raise RuntimeError(f"the test server at {self.url} did not stop")
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"the test server at {self.url} failed") from error
