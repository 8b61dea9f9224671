"""Waiting out an HTTP reply that asks to be sent again later: its ``Retry-After`` header read (RFC 9110 §10.2.3)
and a tenacity wait that honours it, shared by the remote clients (:mod:`inferscale.remote.retry`) and the
OpenAI-compatible extraction LLM (:class:`~inferscale.memory.llm.OpenAIJSONGenerator`).

A reply's ``Retry-After`` (seconds, or an HTTP date) sets the wait before the next attempt (:func:`parse_retry_after`).
One that asks for more than :data:`MAX_RETRY_AFTER_S` is not waited for: the reply is the caller's answer at once.
Without the header, waits grow exponentially from :data:`FIRST_WAIT_S` to at most :data:`MAX_WAIT_S`. A little jitter
is added to every wait, so that clients that failed together do not come back together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx
from tenacity import RetryCallState, wait_exponential, wait_random
from tenacity.wait import wait_base

RETRY_STATUSES = frozenset({502, 503, 504})
"""Replies from a proxy or an overloaded server (bad gateway, unavailable, gateway timeout): a request that may be
sent twice is tried again on them."""

TOO_MANY_REQUESTS = 429
"""A reply refusing a request before it runs (rate limited): tried again."""

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


def asks_to_retry(reply: Reply, statuses: frozenset[int]) -> bool:
    """Whether ``reply`` is worth another attempt: its status is 429 or one of ``statuses``, and its ``Retry-After``
    (when it has one) asks for at most :data:`MAX_RETRY_AFTER_S`."""
    if reply.retry_after_s is not None and reply.retry_after_s > MAX_RETRY_AFTER_S:
        return False
    return reply.status == TOO_MANY_REQUESTS or reply.status in statuses


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


__all__ = [
    "FIRST_WAIT_S",
    "JITTER_S",
    "MAX_RETRY_AFTER_S",
    "MAX_WAIT_S",
    "RETRY_STATUSES",
    "TOO_MANY_REQUESTS",
    "Reply",
    "RetryableReply",
    "WaitRetryAfter",
    "asks_to_retry",
    "parse_retry_after",
]
