"""When a remote call is tried again, and how long it waits: tenacity policies shared by both remote clients.

- Every call is retried when the connection cannot be made (the request was never sent).
- An idempotent call (:attr:`ApiCall.idempotent <inferscale.remote.calls.ApiCall.idempotent>`: the GETs, PUT and
  the search/get_all POSTs) is also retried on a 502, 503 or 504 reply from something other than the
  InferScale server (a proxy or load balancer with no server behind it yet). A 5xx that carries an InferScale error
  code (``model_not_available``, ``engine_closed``, ``extraction_failed``) is the server's own answer, the same on
  every attempt, and is raised at once.
- ``add``, ``chat``, ``reset`` and the two DELETEs are never sent twice: a 5xx reply to them is the caller's answer.
  A proxy's 502 or 504 may come after the server got the request, and a DELETE sent again would then answer for
  what the first one deleted (``memory_not_found``, or 0 memories deleted).

Waits grow exponentially from :data:`FIRST_WAIT_S` to at most :data:`MAX_WAIT_S`, with a little jitter so that
clients that failed together do not come back together. After the last attempt the last error is raised as it is.
"""

from __future__ import annotations

import httpx
from tenacity import (
    AsyncRetrying,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_combine,
    wait_exponential,
    wait_random,
)

from inferscale.remote.errors import is_error_reply

RETRY_STATUSES = frozenset({502, 503, 504})
"""Replies an idempotent call is tried again on."""

FIRST_WAIT_S = 0.25
"""The wait before the second attempt (seconds); it doubles for each further one."""

MAX_WAIT_S = 4.0
"""The longest wait between two attempts (seconds)."""

JITTER_S = 0.1
"""Up to this much (seconds) is added at random to each wait."""


class RetryableReply(Exception):
    """An idempotent call's 502/503/504 reply, raised to have the policy try again; the transport turns the last one
    into the reply's own error.

    Attributes:
        status: the HTTP status.
        content: the reply's body.
    """

    def __init__(self, status: int, content: bytes) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.content = content


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` is worth another attempt: a connection that could not be made (nothing was sent), or a
    :class:`RetryableReply`."""
    return isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout, RetryableReply))


def check_reply(status: int, content: bytes, idempotent: bool) -> None:
    """Raise :class:`RetryableReply` for a 502/503/504 reply to an idempotent call that is not an InferScale error
    reply; do nothing otherwise."""
    if idempotent and status in RETRY_STATUSES and not is_error_reply(content):
        raise RetryableReply(status, content)


def _wait() -> wait_combine:
    return wait_combine(wait_exponential(multiplier=FIRST_WAIT_S, max=MAX_WAIT_S), wait_random(0, JITTER_S))


def retrying(retries: int) -> Retrying:
    """The sync policy: at most ``retries`` more attempts after the first."""
    return Retrying(
        retry=retry_if_exception(is_transient), stop=stop_after_attempt(retries + 1), wait=_wait(), reraise=True
    )


def aretrying(retries: int) -> AsyncRetrying:
    """The async policy (waits with ``asyncio.sleep``): at most ``retries`` more attempts after the first."""
    return AsyncRetrying(
        retry=retry_if_exception(is_transient), stop=stop_after_attempt(retries + 1), wait=_wait(), reraise=True
    )
