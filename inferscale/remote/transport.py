"""Sending :class:`~inferscale.remote.calls.ApiCall` values over httpx: the connection settings, the sync and async
transports, retries (:mod:`inferscale.remote.retry`) and the chat stream read with httpx-sse.

Both transports do the same four things: send a call's request (trying again as the policy allows), turn the reply
into the call's result or error (:func:`inferscale.remote.errors.reply_value`), open a chat stream (its status is
checked before the first chunk, so a refused request raises from the ``chat`` call itself), and turn a connection
that failed for good into a :class:`~inferscale.errors.ServerError` that names the host.
"""

from __future__ import annotations

import asyncio
import os
import re
import ssl
import threading
from collections.abc import AsyncGenerator, Generator
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar

import httpx
from httpx_sse import EventSource, SSEError, aconnect_sse, connect_sse

from inferscale.errors import ConfigError, EngineClosedError, InferScaleError, ServerError
from inferscale.remote.calls import ApiCall
from inferscale.remote.chat import ChunkReader
from inferscale.remote.errors import error_of, reply_value, unsent_value
from inferscale.remote.retry import Reply, RetryableReply, aretrying, check_reply, retrying
from inferscale.types import ChatChunk
from inferscale.validation_text import shown_input

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 300.0
"""Seconds a request may take (connect, each read, write), unless the client is given another ``timeout``."""

DEFAULT_RETRIES = 3
"""Attempts after the first, unless the client is given another ``retries``."""

API_KEY_ENV = "INFERSCALE_API_KEY"
"""The environment variable the API key is read from when none is passed."""

_HEADER_TOKEN = re.compile(r"[\x21-\x7e]+")
"""What a key may hold: visible ASCII, no whitespace (a key is one token of the ``Authorization`` header)."""

JSON_BODY = {"Content-Type": "application/json"}
"""The header of a request with a body (every body is JSON)."""

_OPENED = ChatChunk("")
"""Yielded once by a stream's generator when the reply's status was checked (never a chunk of an answer)."""


@cache
def default_tls_context() -> ssl.SSLContext:
    """The TLS settings of every remote client's connections to an https host: httpx's defaults, which verify the
    server's certificate and host name against certifi's CA bundle, or the files ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``
    name when the first client is built. Built once per process and shared: httpx would build them again for each
    client, and loading the CA bundle takes ~45 ms of CPU (2-core EPYC). The clients speak HTTP/1.1 only; httpcore
    sets the context's ALPN protocols on every connection, so a client given ``http2=True`` would need its own."""
    return httpx.create_ssl_context()


@dataclass(frozen=True, slots=True)
class Connection:
    """Where the server is and how to call it.

    Attributes:
        base_url: the server's URL without a trailing slash, e.g. ``"http://127.0.0.1:8000"``.
        headers: sent with every request (``Authorization: Token <key>`` when there is a key).
        timeout: seconds for each phase of a request (connect, write, each read).
        retries: attempts after the first for a call that may be retried (see :mod:`inferscale.remote.retry`).
    """

    base_url: str
    headers: dict[str, str]
    timeout: float
    retries: int

    @classmethod
    def of(cls, host: Any, api_key: Any, timeout: Any, retries: Any) -> Connection:
        """Check a remote client's arguments; ``api_key=None`` reads :data:`API_KEY_ENV` (no key when it is unset
        or empty).

        Raises:
            ConfigError: for a host that is not an http(s) URL, a key that is not a string or holds a character an
                HTTP header token cannot (whitespace, a control or a non-ASCII character; the message never shows
                the key), a timeout that is not a positive number of seconds, or retries that are not an int >= 0.
        """
        url = httpx.URL(host) if isinstance(host, str) else None
        if url is None or url.scheme not in ("http", "https") or not url.host:
            raise ConfigError(f"host must be the server's http(s) URL, e.g. 'http://127.0.0.1:8000', got {host!r}")
        key = os.environ.get(API_KEY_ENV) if api_key is None else api_key
        if key is not None and not isinstance(key, str):
            raise ConfigError(f"api_key must be a string (isk_...), got {type(key).__name__}")
        if key and not _HEADER_TOKEN.fullmatch(key):
            # never echo the key: the message ends up in logs and tracebacks
            source = f"${API_KEY_ENV}" if api_key is None else "api_key"
            raise ConfigError(
                f"{source} holds whitespace, a control or a non-ASCII character, which an Authorization header cannot "
                "carry: pass the key as `inferscale keys create` printed it (a key read from a file keeps the file's "
                "newline: strip it)"
            )
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ConfigError(f"timeout must be a positive number of seconds, got {shown_input(timeout)}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ConfigError(f"retries must be an int >= 0, got {shown_input(retries)}")
        headers = {"Accept": "application/json"}
        if key:
            headers["Authorization"] = f"Token {key}"
        return cls(str(host).rstrip("/"), headers, float(timeout), retries)

    def client_options(self) -> dict[str, Any]:
        """The keyword arguments of the ``httpx.Client`` or ``httpx.AsyncClient`` that sends to the server."""
        return {
            "base_url": self.base_url,
            "headers": self.headers,
            "timeout": httpx.Timeout(self.timeout),
            "verify": default_tls_context(),
        }

    def what(self, call: ApiCall[Any]) -> str:
        """``"METHOD URL"`` of ``call``, for messages."""
        return f"{call.method} {self.base_url}{call.path}"

    def failed(self, call: ApiCall[Any], error: httpx.HTTPError) -> ServerError:
        """The error of a request that got no reply: the connection could not be made (after every attempt), or
        it broke or timed out while the request ran."""
        if isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout)):
            return ServerError(
                f"cannot connect to the InferScale server at {self.base_url} ({self.retries + 1} attempts; "
                f"{type(error).__name__}: {error}); check the host and that `inferscale serve` runs there"
            )
        return ServerError(
            f"{self.what(call)} got no complete reply from the InferScale server at {self.base_url} "
            f"({type(error).__name__}: {error}); the timeout is {self.timeout:g} s"
        )

    def value(self, call: ApiCall[T], reply: Reply) -> T:
        """The result of ``call`` from its last reply (see :func:`~inferscale.remote.errors.reply_value`)."""
        return reply_value(call, reply.status, reply.content, self.what(call), reply.retry_after_s)

    def refused(self, call: ApiCall[Any], reply: Reply) -> InferScaleError:
        """The error of a stream whose opening reply was not a 2xx (see :func:`~inferscale.remote.errors.error_of`)."""
        return error_of(reply.status, reply.content, self.what(call), reply.retry_after_s)

    def closed_between_attempts(self, call: ApiCall[Any]) -> EngineClosedError:
        """The error of a call whose client was closed after an attempt that failed and before the next one."""
        return EngineClosedError(f"{call.method} {call.path}: the client was closed between two attempts")

    def broken(
        self, call: ApiCall[Any], error: httpx.HTTPError, closed_here: bool, reading: str = "its stream"
    ) -> InferScaleError:
        """The error of a request or stream that broke off: :class:`~inferscale.errors.EngineClosedError` when this
        side closed the client meanwhile (as the local client raises), naming what was being ``reading``, else
        :meth:`failed`'s."""
        if closed_here:
            return EngineClosedError(f"{self.what(call)}: the client was closed while {reading} was read")
        return self.failed(call, error)


def _headers(call: ApiCall[Any]) -> dict[str, str]:
    """The per-request headers: the JSON content type when ``call`` has a body."""
    return dict(JSON_BODY) if call.content is not None else {}


# ------------------------------------------------------------------------------------------------------ sync


class Transport:
    """Sends calls with an :class:`httpx.Client` (thread-safe: one transport may serve several threads).

    Args:
        connection: the server and its settings.
        transport: the httpx transport to send with (default: httpx's own; tests pass ``httpx.MockTransport``).
    """

    def __init__(self, connection: Connection, transport: httpx.BaseTransport | None = None) -> None:
        self.connection = connection
        self._transport = transport
        self._lock = threading.Lock()
        self._client: httpx.Client | None = None

    @property
    def _http(self) -> httpx.Client:
        """The httpx client, (re)opened on first use after construction or :meth:`close`."""
        with self._lock:
            if self._client is None or self._client.is_closed:
                self._client = httpx.Client(**self.connection.client_options(), transport=self._transport)
            return self._client

    def call(self, call: ApiCall[T]) -> T:
        """Send ``call`` and return its result.

        Raises:
            InferScaleError: the type of the server's error code (the local client's types).
            ServerError: when the server cannot be reached after the retries, the reply breaks off or times out, or
                the reply is not the InferScale shape.
            EngineClosedError: when this client is closed (another thread, another task) while the call waits for
                its reply or between two attempts.
        """
        if call.unroutable_id is not None:
            return unsent_value(call, call.unroutable_id)
        http = self._http
        request = http.build_request(
            call.method, call.path, params=call.params, content=call.content, headers=_headers(call)
        )
        try:
            reply = retrying(self.connection.retries)(self._attempt, http, request, call)
        except RetryableReply as last:
            reply = last.reply
        except httpx.HTTPError as exc:
            raise self.connection.broken(call, exc, closed_here=http.is_closed, reading="its reply") from exc
        return self.connection.value(call, reply)

    def _attempt(self, http: httpx.Client, request: httpx.Request, call: ApiCall[Any]) -> Reply:
        if http.is_closed:  # closed between two attempts: httpx would raise a bare RuntimeError
            raise self.connection.closed_between_attempts(call)
        reply = Reply.of(http.send(request))
        check_reply(reply, call.idempotent)
        return reply

    def stream(self, call: ApiCall[Any]) -> Generator[ChatChunk, None, None]:
        """Open ``call`` as a server-sent event stream and return its chunks (see
        :class:`~inferscale.remote.chat.ChunkReader`). The reply's status is checked before this returns; closing
        the iterator (or dropping it) closes the connection.

        Raises:
            InferScaleError: the type of an error reply's code, before any chunk.
            ServerError: as :meth:`call`; while reading, also for a stream that breaks off or is malformed.
        """
        chunks = self._chunks(call)
        opened = next(chunks)  # runs up to the status check: a refused request raises here
        assert opened is _OPENED
        return chunks

    def _chunks(self, call: ApiCall[Any]) -> Generator[ChatChunk, None, None]:
        reader = ChunkReader()
        http = self._http
        with ExitStack() as stack:
            try:
                source = retrying(self.connection.retries)(self._open, http, stack, call)
                if not source.response.is_success:
                    source.response.read()
                    raise self.connection.refused(call, Reply.of(source.response))
                yield _OPENED
                for event in source.iter_sse():
                    yield from reader.feed(event.data)
                    if reader.done:
                        break
            except RetryableReply as last:  # the last attempt's reply, closed by _open
                raise self.connection.refused(call, last.reply) from None
            except SSEError as exc:  # an httpx.TransportError: caught first
                raise ServerError(f"{self.connection.what(call)} did not answer with an event stream: {exc}") from exc
            except httpx.HTTPError as exc:
                raise self.connection.broken(call, exc, closed_here=http.is_closed) from exc
        reader.end()

    def _open(self, http: httpx.Client, stack: ExitStack, call: ApiCall[Any]) -> EventSource:
        """One attempt to open the stream; a reply the policy tries again on is closed before it raises."""
        if http.is_closed:  # closed between two attempts: httpx would raise a bare RuntimeError
            raise self.connection.closed_between_attempts(call)
        with ExitStack() as attempt:
            source = attempt.enter_context(
                connect_sse(
                    http, call.method, call.path, params=call.params, content=call.content, headers=_headers(call)
                )
            )
            if not source.response.is_success:
                source.response.read()
                check_reply(Reply.of(source.response), call.idempotent)
            stack.enter_context(attempt.pop_all())
            return source

    def close(self) -> None:
        """Close the connection pool (an open stream is cut off); a later call opens a new one."""
        with self._lock:
            if self._client is not None:
                self._client.close()


# ------------------------------------------------------------------------------------------------------ async


class AsyncTransport:
    """Sends calls with an :class:`httpx.AsyncClient` per event loop (its connections belong to the loop that opened
    them); see :class:`Transport`. So one client serves a second ``asyncio.run`` (it raised "Event loop is closed"),
    or threads that each run a loop.

    Args:
        connection: the server and its settings.
        transport: the httpx transport to send with (default: httpx's own; tests pass ``httpx.MockTransport``).
    """

    def __init__(self, connection: Connection, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.connection = connection
        self._transport = transport
        self._clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}
        self._clients_lock = threading.Lock()

    @property
    def _http(self) -> httpx.AsyncClient:
        """The running loop's httpx client, (re)opened on its first use after construction or :meth:`close`.

        Raises:
            RuntimeError: when no event loop is running (a coroutine of this transport always runs in one).
        """
        loop = asyncio.get_running_loop()
        with self._clients_lock:
            client = self._clients.get(loop)
            if client is None or client.is_closed:
                self._drop_closed_loops()
                client = httpx.AsyncClient(**self.connection.client_options(), transport=self._transport)
                self._clients[loop] = client
            return client

    def _drop_closed_loops(self) -> None:
        """Forget the clients of loops that are closed (a client per ``asyncio.run`` would pile up otherwise); their
        connections cannot be closed from another loop, and are closed when collected. Call with the lock held."""
        for gone in [loop for loop in self._clients if loop.is_closed()]:
            del self._clients[gone]

    async def call(self, call: ApiCall[T]) -> T:
        """Send ``call`` and return its result; see :meth:`Transport.call` (same errors)."""
        if call.unroutable_id is not None:
            return unsent_value(call, call.unroutable_id)
        http = self._http
        request = http.build_request(
            call.method, call.path, params=call.params, content=call.content, headers=_headers(call)
        )
        try:
            reply: Reply = await aretrying(self.connection.retries)(self._attempt, http, request, call)
        except RetryableReply as last:
            reply = last.reply
        except httpx.HTTPError as exc:
            raise self.connection.broken(call, exc, closed_here=http.is_closed, reading="its reply") from exc
        return self.connection.value(call, reply)

    async def _attempt(self, http: httpx.AsyncClient, request: httpx.Request, call: ApiCall[Any]) -> Reply:
        if http.is_closed:  # closed between two attempts: httpx would raise a bare RuntimeError
            raise self.connection.closed_between_attempts(call)
        reply = Reply.of(await http.send(request))
        check_reply(reply, call.idempotent)
        return reply

    async def stream(self, call: ApiCall[Any]) -> AsyncGenerator[ChatChunk, None]:
        """Open ``call`` as an event stream; see :meth:`Transport.stream` (same errors). Closing the iterator
        (``await it.aclose()``), or dropping it, closes the connection."""
        chunks = self._chunks(call)
        opened = await anext(chunks)  # runs up to the status check: a refused request raises here
        assert opened is _OPENED
        return chunks

    async def _chunks(self, call: ApiCall[Any]) -> AsyncGenerator[ChatChunk, None]:
        reader = ChunkReader()
        http = self._http
        async with AsyncExitStack() as stack:
            try:
                source: EventSource = await aretrying(self.connection.retries)(self._open, http, stack, call)
                if not source.response.is_success:
                    await source.response.aread()
                    raise self.connection.refused(call, Reply.of(source.response))
                yield _OPENED
                async for event in source.aiter_sse():
                    for chunk in reader.feed(event.data):
                        yield chunk
                    if reader.done:
                        break
            except RetryableReply as last:  # the last attempt's reply, closed by _open
                raise self.connection.refused(call, last.reply) from None
            except SSEError as exc:  # an httpx.TransportError: caught first
                raise ServerError(f"{self.connection.what(call)} did not answer with an event stream: {exc}") from exc
            except httpx.HTTPError as exc:
                raise self.connection.broken(call, exc, closed_here=http.is_closed) from exc
        reader.end()

    async def _open(self, http: httpx.AsyncClient, stack: AsyncExitStack, call: ApiCall[Any]) -> EventSource:
        """One attempt to open the stream; see :meth:`Transport._open`."""
        if http.is_closed:  # closed between two attempts: httpx would raise a bare RuntimeError
            raise self.connection.closed_between_attempts(call)
        async with AsyncExitStack() as attempt:
            source = await attempt.enter_async_context(
                aconnect_sse(
                    http, call.method, call.path, params=call.params, content=call.content, headers=_headers(call)
                )
            )
            if not source.response.is_success:
                await source.response.aread()
                check_reply(Reply.of(source.response), call.idempotent)
            await stack.enter_async_context(attempt.pop_all())
            return source

    async def close(self) -> None:
        """Close the running loop's connection pool (an open stream is cut off), and forget those of loops that are
        closed (:meth:`_drop_closed_loops`); a later call opens a new one."""
        loop = asyncio.get_running_loop()
        with self._clients_lock:
            client = self._clients.pop(loop, None)
            self._drop_closed_loops()
        if client is not None:
            await client.aclose()
