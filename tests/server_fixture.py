"""The real server in a test: :func:`running_server` serves an ASGI app with uvicorn on 127.0.0.1, on a port of its
own, for the length of a ``with`` block. Shared by the server tests, the remote clients' and the API suite's.

Starting and stopping a uvicorn server costs ~0.2 s (its shutdown sleeps 0.1 s, and its main loop notices
``should_exit`` on a 0.1 s tick), which the API suite paid twice per test (four client kinds, two of them remote). So
one uvicorn server (:class:`SharedServer`) runs for the whole session, in a thread of its own, listening on a pool of
loopback sockets; each ``with`` block takes a free port of the pool, and the server's ASGI app (:class:`PortRouter`)
hands that port's requests to the block's app. What a test sees is what a server of its own gave it: real HTTP over
TCP to uvicorn on a port no other app is on, the app's lifespan startup run (by uvicorn's own lifespan runner) before
the block and its shutdown after it, once the port's connections were closed and its requests finished (as uvicorn's
shutdown does, with the same 5 s grace before the stragglers are cancelled). A request on a port that no block holds
gets a 503 (a stopped server refused the connection). Blocks beyond the pool's size get a server of their own.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from uvicorn.lifespan.on import LifespanOn

STARTUP_TIMEOUT_S = 30.0
GRACEFUL_SHUTDOWN_S = 5.0
"""Seconds a stopping app's open connections and requests get to finish before its requests are cancelled."""
POOL_SIZE = 8
"""Ports of the shared server: the apps one test may serve at once before the next gets a server of its own."""
_POLL_S = 0.005


def _loopback_socket() -> socket.socket:
    """A TCP socket bound to a free port of 127.0.0.1 (port 0: the system picks it, so it is never raced for).

    proto=IPPROTO_TCP: asyncio turns Nagle off (TCP_NODELAY) only on sockets that say they are TCP; with proto 0 every
    reply after a connection's first waited ~40 ms for the client's delayed ACK.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@contextmanager
def _uvicorn_thread(app: Any, sockets: list[socket.socket]) -> Iterator[uvicorn.Server]:
    """Run ``app`` under uvicorn on ``sockets`` in a daemon thread until the block ends (lifespan on: its startup
    before the block, its shutdown after it); closes the sockets.

    Raises:
        RuntimeError: when the server has not started within :data:`STARTUP_TIMEOUT_S` seconds (its thread's error,
            if any, is chained).
    """
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)
    server = uvicorn.Server(config)
    failure: list[BaseException] = []

    def serve() -> None:
        try:
            server.run(sockets=sockets)
        except BaseException as exc:  # handed to the test thread below
            failure.append(exc)

    ports = ",".join(str(sock.getsockname()[1]) for sock in sockets)
    thread = threading.Thread(target=serve, name=f"uvicorn-{ports}", daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    try:
        while not server.started:
            if failure or not thread.is_alive() or time.monotonic() > deadline:
                server.should_exit = True
                thread.join(5)
                cause = failure[0] if failure else None
                raise RuntimeError(f"the test server on port {ports} did not start") from cause
            time.sleep(0.01)
        yield server
    finally:
        server.should_exit = True
        thread.join(STARTUP_TIMEOUT_S)
        for sock in sockets:
            sock.close()


@dataclass
class _Mounted:
    """An app served on a port of the shared server: its lifespan (its ``state`` is each request's) and its
    requests still running."""

    app: Any
    lifespan: LifespanOn
    requests: set[asyncio.Task[Any]] = field(default_factory=set)


class PortRouter:
    """The shared server's ASGI app: each request goes to the app mounted on the port it arrived on (``scope
    ["server"]``), or gets a 503 when none is. Its own lifespan only records the server's event loop, on which
    :meth:`mount` and :meth:`unmount` run."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.server: uvicorn.Server | None = None
        self._mounted: dict[int, _Mounted] = {}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                kind = (await receive())["type"]  # "lifespan.startup", then "lifespan.shutdown"
                self.loop = asyncio.get_running_loop()
                await send({"type": f"{kind}.complete"})
                if kind == "lifespan.shutdown":
                    return
        mounted = self._mounted.get(scope["server"][1])
        if mounted is None:
            if scope["type"] == "http":
                body = b"no test app is served on this port (its server stopped)"
                headers = [(b"content-type", b"text/plain"), (b"connection", b"close")]  # nothing stays open
                await send({"type": "http.response.start", "status": 503, "headers": headers})
                await send({"type": "http.response.body", "body": body})
            else:
                await send({"type": "websocket.close", "code": 1013})
            return
        scope["state"] = dict(mounted.lifespan.state)  # what uvicorn gives a request: a copy of its app's state
        task = asyncio.current_task()
        assert task is not None  # uvicorn runs each request in a task of its own
        mounted.requests.add(task)
        try:
            await mounted.app(scope, receive, send)
        finally:
            mounted.requests.discard(task)

    async def mount(self, port: int, app: Any) -> None:
        """Run ``app``'s lifespan startup (uvicorn's runner, lifespan "on"), then serve it on ``port``.

        Raises:
            RuntimeError: when the startup failed (uvicorn logged why).
        """
        lifespan = LifespanOn(uvicorn.Config(app, lifespan="on", log_config=None))
        await lifespan.startup()
        if lifespan.should_exit:
            raise RuntimeError(f"the test app for port {port} failed its lifespan startup (see the uvicorn.error log)")
        self._mounted[port] = _Mounted(app, lifespan)

    async def unmount(self, port: int) -> None:
        """Stop serving ``port`` as uvicorn's shutdown stops a server: no new request reaches the app, its idle
        connections are closed and busy ones closed after their reply, its connections and requests get
        :data:`GRACEFUL_SHUTDOWN_S` seconds to finish (then the requests are cancelled), then its lifespan shutdown
        runs."""
        mounted = self._mounted.pop(port)
        assert self.server is not None

        def connections() -> list[Any]:
            return [c for c in self.server.server_state.connections if c.server and c.server[1] == port]

        for connection in connections():
            connection.shutdown()
        deadline = time.monotonic() + GRACEFUL_SHUTDOWN_S
        while (connections() or mounted.requests) and time.monotonic() < deadline:
            await asyncio.sleep(_POLL_S)
        for task in list(mounted.requests):
            task.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")
        await mounted.lifespan.shutdown()


class SharedServer:
    """One uvicorn server on :data:`POOL_SIZE` loopback ports, started by the constructor, serving a
    :class:`PortRouter`; :meth:`serve` lends a port to an app."""

    def __init__(self, size: int = POOL_SIZE) -> None:
        sockets = [_loopback_socket() for _ in range(size)]
        self._free = collections.deque(sock.getsockname()[1] for sock in sockets)  # least recently used first
        self._lock = threading.Lock()
        self.router = PortRouter()
        self._running = _uvicorn_thread(self.router, sockets)
        self.router.server = self._running.__enter__()
        assert self.router.loop is not None  # set by the router's lifespan startup, before `started`

    def _on_loop(self, coroutine: Any) -> Any:
        assert self.router.loop is not None
        done: Future[Any] = asyncio.run_coroutine_threadsafe(coroutine, self.router.loop)
        return done.result(STARTUP_TIMEOUT_S + GRACEFUL_SHUTDOWN_S)

    def take_port(self) -> int | None:
        """A free port of the pool, or None when every one is lent."""
        with self._lock:
            return self._free.popleft() if self._free else None

    @contextmanager
    def serve(self, app: Any, port: int) -> Iterator[str]:
        """Serve ``app`` on ``port`` (from :meth:`take_port`) for the block; yields its base URL; gives the port
        back after the app's shutdown."""
        try:
            self._on_loop(self.router.mount(port, app))
            try:
                yield f"http://127.0.0.1:{port}"
            finally:
                self._on_loop(self.router.unmount(port))
        finally:
            with self._lock:
                self._free.append(port)

    def stop(self) -> None:
        """Stop the server (its own shutdown: what is still mounted is not shut down here)."""
        self._running.__exit__(None, None, None)


_shared: SharedServer | None = None
_shared_lock = threading.Lock()


def shared_server() -> SharedServer:
    """The session's shared server, started on first use and stopped when the interpreter exits."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = SharedServer()
            atexit.register(_shared.stop)
        return _shared


@contextmanager
def running_server(app: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn on 127.0.0.1 until the block ends; yields its base URL (``http://127.0.0.1:PORT``),
    a port no other app is served on meanwhile. The app's lifespan runs (startup before the block, shutdown after
    it, once its connections and requests are done).

    Raises:
        RuntimeError: when the server, or the app's lifespan startup, has not started within
            :data:`STARTUP_TIMEOUT_S` seconds or failed.
    """
    shared = shared_server()
    port = shared.take_port()
    if port is not None:
        with shared.serve(app, port) as url:
            yield url
        return
    sock = _loopback_socket()  # every pooled port is lent: a server of its own
    with _uvicorn_thread(app, [sock]):
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
