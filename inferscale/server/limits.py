"""The request size limit: an ASGI middleware that reads a request's body before the application does and
answers 413 ``request_too_large`` when it is over ``max_bytes``, so nothing is parsed or stored.

The declared ``Content-Length`` is checked first (a large upload is refused before its body is parsed); a body sent
without one (chunked) is counted as it streams in and refused as soon as it passes the limit. A body within the
limit is handed to the application as one message; later ``receive`` calls (disconnect notices during a streamed
reply) go to the server as usual.

Before the 413, what is left of a refused body is read and dropped, up to :data:`DRAIN_BYTES` in all: a connection
closed with an upload unread is reset by the kernel, and the client then may never read the reply (the OpenAI SDK
saw a connection error, and sent the whole body again). A client that asked to wait for ``100 Continue`` is
refused before it uploads anything, and a body over :data:`DRAIN_BYTES` is refused unread.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferscale.errors import RequestTooLargeError
from inferscale.server.errors import error_response

DRAIN_BYTES = 16 << 20
"""The most of a refused request body the server reads and drops before answering 413 (bytes, whole body)."""


class BodySizeLimit:
    """ASGI middleware refusing request bodies over ``max_bytes`` with 413.

    Args:
        app: the wrapped application.
        max_bytes: the largest body accepted (bytes, >= 0).
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            waits = headers.get(b"expect", b"").lower() == b"100-continue"  # reading would ask for the body
            if not waits and int(declared) <= DRAIN_BYTES:
                await _drop_rest(receive, DRAIN_BYTES)
            await self._refuse(scope, receive, send, int(declared))
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client went away before sending its whole request
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                if message.get("more_body", False):
                    await _drop_rest(receive, DRAIN_BYTES - len(body))
                await self._refuse(scope, receive, send, len(body))
                return
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(bytes(body), receive), send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, size: int) -> None:
        error = RequestTooLargeError(
            f"the request body has {size:,} bytes or more; this server reads at most {self.max_bytes:,} "
            "(ServerOptions.max_request_bytes): send less per request"
        )
        response: JSONResponse = error_response(error)
        response.headers["connection"] = "close"  # a body past DRAIN_BYTES is left unread
        await response(scope, receive, send)


async def _drop_rest(receive: Receive, budget: int) -> None:
    """Read and drop the request body's messages until its last one, the client's disconnect, or ``budget`` bytes
    (a budget of 0 or less reads nothing)."""
    while budget > 0:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        budget -= len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` as the whole request first, then defers to ``receive``."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
