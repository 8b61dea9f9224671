"""When a remote call is tried again, and how long it waits: tenacity policies shared by both remote clients.

- Every call is retried when the connection cannot be made (the request was never sent).
- An idempotent call (:attr:`ApiCall.idempotent <inferscale.remote.calls.ApiCall.idempotent>`: the GETs, PUT and
  the search/get_all POSTs) is also retried on a 502, 503 or 504 reply from something other than the
  InferScale server (a proxy or load balancer with no server behind it yet). A 5xx that carries an InferScale error
  code (``model_not_available``, ``engine_closed``, ``extraction_failed``) is the server's own answer, the same on
  every attempt, and is raised at once.
- ``add``, ``chat``, ``reset`` and the two DELETEs are never sent twice on a 5xx: it is the caller's answer.
  A proxy's 502 or 504 may come after the server got the request, and a DELETE sent again would then answer for
  what the first one deleted (``memory_not_found``, or 0 memories deleted).
- Every call, those included, is retried on a 429, which refuses a request before it runs: the InferScale server
  answers 429 ``rate_limited`` only from its API key check, before any route (to a key it has not verified while
  too many key checks fail), and a rate-limiting proxy answers 429 instead of forwarding the request.

A reply's ``Retry-After`` header sets the wait before the next attempt, as :mod:`inferscale.http_retry` reads and
waits it out; one that asks for more than :data:`~inferscale.http_retry.MAX_RETRY_AFTER_S` is the caller's answer at
once (a :class:`~inferscale.errors.RateLimitedError` carries the wait in ``retry_after_s``). After the last attempt
the last error is raised as it is.
"""

from __future__ import annotations

import httpx
from tenacity import AsyncRetrying, Retrying, retry_if_exception, stop_after_attempt

from inferscale.http_retry import (
    MAX_RETRY_AFTER_S,
    RETRY_STATUSES,
    Reply,
    RetryableReply,
    WaitRetryAfter,
    asks_to_retry,
    parse_retry_after,
)
from inferscale.remote.errors import is_error_reply


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` is worth another attempt: a connection that could not be made (nothing was sent), or a
    :class:`RetryableReply`."""
    return isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout, RetryableReply))


def check_reply(reply: Reply, idempotent: bool) -> None:
    """Raise :class:`RetryableReply` for a 429 reply to any call, and for a 502/503/504 reply to an idempotent call
    that is not an InferScale error reply, unless its ``Retry-After`` asks for more than :data:`MAX_RETRY_AFTER_S`;
    do nothing otherwise."""
    statuses = RETRY_STATUSES if idempotent and not is_error_reply(reply.content) else frozenset()
    if asks_to_retry(reply, statuses):
        raise RetryableReply(reply)


def retrying(retries: int) -> Retrying:
    """The sync policy: at most ``retries`` more attempts after the first."""
    return Retrying(
        retry=retry_if_exception(is_transient),
        stop=stop_after_attempt(retries + 1),
        wait=WaitRetryAfter(),
        reraise=True,
    )


def aretrying(retries: int) -> AsyncRetrying:
    """The async policy (waits with ``asyncio.sleep``): at most ``retries`` more attempts after the first."""
    return AsyncRetrying(
        retry=retry_if_exception(is_transient),
        stop=stop_after_attempt(retries + 1),
        wait=WaitRetryAfter(),
        reraise=True,
    )


__all__ = [
    "MAX_RETRY_AFTER_S",
    "Reply",
    "RetryableReply",
    "aretrying",
    "check_reply",
    "is_transient",
    "parse_retry_after",
    "retrying",
]
