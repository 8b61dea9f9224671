"""The real server in a test: :func:`running_server` runs an ASGI app under uvicorn on 127.0.0.1, on a free port,
in a thread of its own, for the length of a ``with`` block. Shared by the server tests and the remote client's."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

STARTUP_TIMEOUT_S = 30.0


@contextmanager
def running_server(app: Any, *, log_level: str = "warning") -> Iterator[str]:
    """Serve ``app`` with uvicorn on 127.0.0.1 until the block ends; yields its base URL (``http://127.0.0.1:PORT``).

    The socket is bound before the server starts (port 0: the system picks a free one), so the port is known and
    never raced for. The app's lifespan runs (startup before the block, shutdown after it).

    Raises:
        RuntimeError: when the server has not started within :data:`STARTUP_TIMEOUT_S` seconds (its thread's error,
            if any, is chained).
    """
    # proto=IPPROTO_TCP: asyncio turns Nagle off (TCP_NODELAY) only on sockets that say they are TCP; with proto 0
    # every reply after a connection's first waited ~40 ms for the client's delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan="on", timeout_graceful_shutdown=5))
    failure: list[BaseException] = []

    def serve() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:  # handed to the test thread below
            failure.append(exc)

    thread = threading.Thread(target=serve, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not server.started:
        if failure or not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            thread.join(5)
            sock.close()
            cause = failure[0] if failure else None
            raise RuntimeError(f"the test server on port {port} did not start") from cause
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(STARTUP_TIMEOUT_S)
        sock.close()
