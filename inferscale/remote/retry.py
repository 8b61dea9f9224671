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

A reply's ``Retry-After`` header (seconds, or an HTTP date; RFC 9110 §10.2.3) sets the wait before the next attempt
(:func:`parse_retry_after`).
One that asks for more than :data:`MAX_RETRY_AFTER_S` is not waited for: the reply is the caller's answer at once
(a :class:`~inferscale.errors.RateLimitedError` carries the wait in ``retry_after_s``). Without the header, waits grow
exponentially from :data:`FIRST_WAIT_S` to at most :data:`MAX_WAIT_S`. A little jitter is added to every wait, so
that clients that failed together do not come back together. After the last attempt the last error is raised as it
is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)
from tenacity.wait import wait_base

from inferscale.remote.errors import is_error_reply

RETRY_STATUSES = frozenset({502, 503, 504})
"""Replies an idempotent call is tried again on."""

TOO_MANY_REQUESTS = 429
"""The reply every call is tried again on."""

FIRST_WAIT_S = 0.25
"""The wait before the second attempt (seconds); it doubles for each further one."""

MAX_WAIT_S = 4.0
"""The longest wait between two attempts (seconds)."""

JITTER_S = 0.1
"""Up to this much (seconds) is added at random to each wait."""

MAX_RETRY_AFTER_S = 60.0
"""The longest wait (seconds) a reply's ``Retry-After`` may ask for and still be waited out."""


@dataclass(frozen=True, slots=True)
class Reply:
    """What one attempt got back.

    Attributes:
        status: the HTTP status.
        content: the body.
        retry_after_s: the wait its ``Retry-After`` header asks for (seconds, >= 0), or ``None`` without a header
            this client can read.
    """

    status: int
    content: bytes
    retry_after_s: float | None = None

    @classmethod
    def of(cls, response: httpx.Response) -> Reply:
        """The reply of a response whose body was read."""
        return cls(response.status_code, response.content, parse_retry_after(response.headers))


class RetryableReply(Exception):
    """A reply the policy tries again on (see the module's docstring); the transport turns the last one into the
    reply's own error.

    Attributes:
        reply: the reply.
    """

    def __init__(self, reply: Reply) -> None:
        super().__init__(f"HTTP {reply.status}")
        self.reply = reply


def parse_retry_after(headers: httpx.Headers) -> float | None:
    """The wait (seconds, finite, >= 0) a ``Retry-After`` header asks for: a count of seconds, or an HTTP date from
    which the wait is counted against this machine's clock (RFC 9110 §10.2.3; the obsolete RFC 850 and asctime forms
    too, read as GMT, §5.6.7). ``None`` when there is no such header or it holds neither, or a count too large for a
    float (the header is advice: a value this client cannot read is ignored, not an error)."""
    value = headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        seconds = float(value)
        return seconds if math.isfinite(seconds) else None
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, OverflowError):  # not a date (also the empty string), or a year past datetime's
        return None
    if when.tzinfo is None:  # asctime (no zone) or "-0000": HTTP dates are GMT
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` is worth another attempt: a connection that could not be made (nothing was sent), or a
    :class:`RetryableReply`."""
    return isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout, RetryableReply))


def check_reply(reply: Reply, idempotent: bool) -> None:
    """Raise :class:`RetryableReply` for a 429 reply to any call, and for a 502/503/504 reply to an idempotent call
    that is not an InferScale error reply, unless its ``Retry-After`` asks for more than :data:`MAX_RETRY_AFTER_S`;
    do nothing otherwise."""
    if reply.retry_after_s is not None and reply.retry_after_s > MAX_RETRY_AFTER_S:
        return
    if reply.status == TOO_MANY_REQUESTS or (
        idempotent and reply.status in RETRY_STATUSES and not is_error_reply(reply.content)
    ):
        raise RetryableReply(reply)


class WaitRetryAfter(wait_base):
    """The wait the last reply's ``Retry-After`` asked for, else exponential from :data:`FIRST_WAIT_S` to
    :data:`MAX_WAIT_S`; plus up to :data:`JITTER_S` at random."""

    def __call__(self, retry_state: RetryCallState) -> float:
        outcome = retry_state.outcome
        error = outcome.exception() if outcome is not None else None
        asked = error.reply.retry_after_s if isinstance(error, RetryableReply) else None
        if asked is None:
            asked = wait_exponential(multiplier=FIRST_WAIT_S, max=MAX_WAIT_S)(retry_state)
        return float(asked) + wait_random(0, JITTER_S)(retry_state)


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
