"""How much CPU the checks of API keys not verified yet may take: :class:`KeyCheckLimits` and :class:`KeyCheckLimiter`.

Checking a key the server has not verified before costs one scrypt (about 40 ms of one core; an unknown key id is
hashed against a dummy, so that the time of a 401 does not tell which ids exist). Without a bound, a client sending
well-formed made-up keys took the server's CPU: 964 such requests from 16 clients slowed a legitimate chat from
0.59 s to 21.7-26.2 s (a tester's find). So such checks:

- run one at a time (:data:`KEY_CHECKS_AT_ONCE`), in the caller's worker thread, at most
  :data:`KEY_CHECKS_WAITING` of them admitted at once (past it, one is refused at once);
- run only while a bucket of :attr:`KeyCheckLimits.failure_burst` tokens, refilled at
  :attr:`KeyCheckLimits.failures_per_s`, holds a whole token when the check's turn comes; a check that fails (or
  raises) spends one, one that verifies its key spends none, so any number of valid keys are verified while no check
  fails. A check whose turn finds no whole token is refused without a scrypt, with
  :class:`~inferscale.errors.RateLimitedError` (HTTP 429 ``rate_limited``, ``Retry-After``).

A key verified before is never checked here (the key store remembers it), so it is neither refused nor delayed. The
refusal does not depend on whether the key's id exists: every key not verified before goes through the same bucket.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from inferscale.errors import ConfigError, RateLimitedError
from inferscale.validation_text import shown_input

KEY_CHECKS_AT_ONCE = 1
"""Scrypt checks of keys not verified yet that run at once (each takes one core for about 40 ms)."""

KEY_CHECKS_WAITING = 32
"""Checks of keys not verified yet admitted at once, waiting for their turn or running; one more is refused at once
(a check whose turn finds the budget spent ends without a scrypt, so the queue drains fast during a flood). Below the
40 threads of the pool the servers check keys on (anyio's default), so a flood cannot hold all of them."""

DEFAULT_FAILED_KEY_CHECKS_PER_S = 5.0
"""The failed key checks a server runs per second once its burst is spent (about a fifth of one core)."""

DEFAULT_FAILED_KEY_CHECK_BURST = 10
"""The failed key checks a server runs back to back before :data:`DEFAULT_FAILED_KEY_CHECKS_PER_S` applies."""

MAX_FAILED_KEY_CHECK_BURST = 1_000_000
"""The largest burst accepted (a million failed checks in a row is no limit at all)."""


@dataclass(frozen=True, slots=True)
class KeyCheckLimits:
    """The budget of failed checks of API keys not verified yet (see the module docstring).

    Attributes:
        failures_per_s: failed checks per second the budget refills with (a finite number > 0).
        failure_burst: failed checks the budget holds (a whole number >= 1).
    """

    failures_per_s: float = DEFAULT_FAILED_KEY_CHECKS_PER_S
    failure_burst: int = DEFAULT_FAILED_KEY_CHECK_BURST

    def __post_init__(self) -> None:
        """Raises:
        ConfigError: for a ``failures_per_s`` that is not a finite number > 0, or a ``failure_burst`` that is not a
            whole number from 1 to :data:`MAX_FAILED_KEY_CHECK_BURST` (each names its ``inferscale serve`` flag; a
            burst of 4,000 digits overflowed the float of the limiter's bucket)."""
        rate = self.failures_per_s
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate < math.inf:
            raise ConfigError(
                "the failed key checks per second (--failed-key-checks-per-s) must be a finite number > 0, "
                f"got {shown_input(rate)}"
            )
        burst = self.failure_burst
        if isinstance(burst, bool) or not isinstance(burst, int) or not 1 <= burst <= MAX_FAILED_KEY_CHECK_BURST:
            raise ConfigError(
                "the failed key check burst (--failed-key-check-burst) must be a whole number from 1 to "
                f"{MAX_FAILED_KEY_CHECK_BURST:,}, got {shown_input(burst)}"
            )


class KeyCheckLimiter:
    """Runs the checks of keys not verified yet within :class:`KeyCheckLimits`. Thread-safe.

    Args:
        limits: the budget.
        clock: a monotonic clock in seconds (tests pass their own).
    """

    def __init__(self, limits: KeyCheckLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._lock = threading.Lock()
        self._one_at_a_time = threading.BoundedSemaphore(KEY_CHECKS_AT_ONCE)
        self._tokens = float(limits.failure_burst)
        self._refilled_at = clock()
        self._admitted = 0  # checks waiting for their turn or running

    @property
    def admitted(self) -> int:
        """Checks admitted and not finished: waiting for their turn or running."""
        with self._lock:
            return self._admitted

    def check(self, verify: Callable[[], bool]) -> bool:
        """Run ``verify`` (one scrypt and a comparison; ``True`` when the key is valid) within the budget; returns
        its result. Blocks while another check runs. A check that does not return ``True`` spends a token.

        Raises:
            RateLimitedError: without calling ``verify``: at once when :data:`KEY_CHECKS_WAITING` checks are admitted
                and unfinished, or at the check's turn when the bucket holds no whole token; its ``retry_after_s``
                is when a token will be back (whole seconds, at least 1).
        """
        with self._lock:
            if self._admitted >= KEY_CHECKS_WAITING:
                raise self._refusal(f"{KEY_CHECKS_WAITING} key checks are waiting", 1)
            self._admitted += 1
        try:
            with self._one_at_a_time:  # one check's turn at a time: the token it finds cannot be taken meanwhile
                self._require_token()
                verified = False
                try:
                    verified = verify()
                finally:
                    if not verified:
                        with self._lock:
                            self._tokens -= 1
                return verified
        finally:
            with self._lock:
                self._admitted -= 1

    def _require_token(self) -> None:
        limits = self.limits
        with self._lock:
            now = self._clock()
            elapsed = max(0.0, now - self._refilled_at)
            self._tokens = min(float(limits.failure_burst), self._tokens + elapsed * limits.failures_per_s)
            self._refilled_at = now
            if self._tokens >= 1:
                return
            wait_s = max(1, math.ceil((1 - self._tokens) / limits.failures_per_s))
        raise self._refusal(
            f"more than {limits.failure_burst} API key checks failed lately (the budget refills at "
            f"{limits.failures_per_s:g} per second)",
            wait_s,
        )

    @staticmethod
    def _refusal(why: str, wait_s: int) -> RateLimitedError:
        return RateLimitedError(
            f"{why}, and this key was not verified before: try again in {wait_s} s (keys this server verified before "
            "are still answered)",
            retry_after_s=wait_s,
        )
