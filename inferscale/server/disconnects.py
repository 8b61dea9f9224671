"""Work for a request whose client may go away: a non-streamed answer is cancelled once the client has gone, so
that the model stops decoding for nobody (a streamed one stops when its response iterator is closed)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

T = TypeVar("T")

CLIENT_CLOSED_REQUEST = 499
"""The status a cancelled request is logged and counted with (nginx's "client closed request"; no client reads it)."""

POLL_SECONDS = 0.25
"""How often the connection is checked while the work runs (s): the most decoding a gone client can still cost."""


class ClientDisconnected(Exception):
    """The client closed the connection before its answer was ready; the work was cancelled."""


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """``work``'s result, or, once ``request``'s client has disconnected, ``work`` cancelled (an async chat then
    stops decoding within a token: :meth:`inferscale.AsyncMemoryClient.chat`).

    Raises:
        ClientDisconnected: when the client went away first.
        Exception: whatever ``work`` raises.
    """
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=POLL_SECONDS)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientDisconnected(f"{request.method} {request.url.path}: the client went away")
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


__all__ = ["CLIENT_CLOSED_REQUEST", "POLL_SECONDS", "ClientDisconnected", "unless_disconnected"]
