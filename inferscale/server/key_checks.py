"""How much CPU the checks of API keys not verified yet may take: :class:`KeyCheckLimits` and :class:`KeyCheckLimiter`.

Checking a key the server has not verified before costs one scrypt (about 40 ms of one core; an unknown key id is
hashed against a dummy, so that the time of a 401 does not tell which ids exist). Without a bound, a client sending
well-formed made-up keys took the server's CPU: 964 such requests from 16 clients slowed a legitimate chat from
0.59 s to 21.7-26.2 s (a tester's find). So such checks:

- run one at a time (:data:`KEY_CHECKS_AT_ONCE`), in the caller's worker thread;
- each take a token from a bucket of :attr:`KeyCheckLimits.failure_burst` tokens refilled at
  :attr:`KeyCheckLimits.failures_per_s`; a check that verifies its key gives the token back, so only failed checks
  spend the budget. With no token left (or as many checks waiting as the bucket holds) a check is refused at once
  with :class:`~inferscale.errors.RateLimitedError` (HTTP 429 ``rate_limited``, ``Retry-After``), without a scrypt.

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

KEY_CHECKS_AT_ONCE = 1
"""Scrypt checks of keys not verified yet that run at once (each takes one core for about 40 ms)."""

DEFAULT_FAILED_KEY_CHECKS_PER_S = 5.0
"""The failed key checks a server runs per second once its burst is spent (about a fifth of one core)."""

DEFAULT_FAILED_KEY_CHECK_BURST = 10
"""The failed key checks a server runs back to back before :data:`DEFAULT_FAILED_KEY_CHECKS_PER_S` applies."""


@dataclass(frozen=True, slots=True)
class KeyCheckLimits:
    """The budget of failed checks of API keys not verified yet (see the module docstring).

    Attributes:
        failures_per_s: failed checks per second the budget refills with (a finite number > 0).
        failure_burst: failed checks the budget holds, and the most checks admitted and not yet finished (a whole
            number >= 1).
    """

    failures_per_s: float = DEFAULT_FAILED_KEY_CHECKS_PER_S
    failure_burst: int = DEFAULT_FAILED_KEY_CHECK_BURST

    def __post_init__(self) -> None:
        """Raises:
        ConfigError: for a ``failures_per_s`` that is not a finite number > 0, or a ``failure_burst`` that is not a
            whole number >= 1 (each names its ``inferscale serve`` flag)."""
        rate = self.failures_per_s
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate < math.inf:
            raise ConfigError(
                "the failed key checks per second (--failed-key-checks-per-s) must be a finite number > 0, "
                f"got {rate!r}"
            )
        burst = self.failure_burst
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
            raise ConfigError(
                f"the failed key check burst (--failed-key-check-burst) must be a whole number of at least 1, "
                f"got {burst!r}"
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
        self._admitted = 0  # checks holding a token, waiting or running

    def check(self, verify: Callable[[], bool]) -> bool:
        """Run ``verify`` (one scrypt and a comparison; ``True`` when the key is valid) within the budget; returns
        its result. Blocks while another check runs. A check that does not return ``True`` spends a token.

        Raises:
            RateLimitedError: at once, without calling ``verify``, when no token is left or as many checks as the
                burst are admitted and unfinished; its ``retry_after_s`` is when a token will be back (whole
                seconds, at least 1).
        """
        self._admit()
        verified = False
        try:
            with self._one_at_a_time:
                verified = verify()
        finally:
            with self._lock:
                self._admitted -= 1
                if verified:
                    self._tokens = min(float(self.limits.failure_burst), self._tokens + 1)
        return verified

    def _admit(self) -> None:
        limits = self.limits
        with self._lock:
            now = self._clock()
            elapsed = max(0.0, now - self._refilled_at)
            self._tokens = min(float(limits.failure_burst), self._tokens + elapsed * limits.failures_per_s)
            self._refilled_at = now
            if self._tokens >= 1 and self._admitted < limits.failure_burst:
                self._tokens -= 1
                self._admitted += 1
                return
            wait_s = max(1, math.ceil((1 - self._tokens) / limits.failures_per_s)) if self._tokens < 1 else 1
        raise RateLimitedError(
            f"too many API key checks failed lately (more than {limits.failure_burst} at once or "
            f"{limits.failures_per_s:g} per second), and this key was not verified before: try again in {wait_s} s "
            "(keys this server verified before are still answered)",
            retry_after_s=wait_s,
        )
