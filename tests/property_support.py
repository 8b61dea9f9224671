"""What the property-based suites (tests/properties/) share: their hypothesis profiles and the count of the cases
each generated on each backend.

Profiles (``INFERSCALE_HYPOTHESIS_PROFILE``):

- ``inferscale-ci`` (the default): derandomised (the same examples on every run, so CI is reproducible), no example
  database, no deadline (2 shared cores make timings noisy); each suite's ``max_examples`` keeps it under about a
  minute per backend.
- ``inferscale-explore``: random examples, ten times as many, failures kept in hypothesis' example database
  (``.hypothesis/examples``) to be replayed; for a longer search on a developer machine.

Each suite adds what it ran to :data:`CASES` and the time its calls took to :data:`SECONDS`;
``tests/properties/conftest.py`` writes both at the end of the test output (``property cases: <suite> on <backend>:
<n>``, ``property seconds: <suite> on <backend>: <s>``).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

CI_PROFILE = "inferscale-ci"
EXPLORE_PROFILE = "inferscale-explore"
EXPLORE_SCALE = 10
"""How many times more examples the explore profile runs than the CI one."""

settings.register_profile(
    CI_PROFILE,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
settings.register_profile(EXPLORE_PROFILE, settings.get_profile(CI_PROFILE), derandomize=False)

CASES: Counter[tuple[str, str]] = Counter()
"""Generated cases so far in this session, by ``(suite, backend)``."""

SECONDS: Counter[tuple[str, str]] = Counter()
"""Seconds spent in each suite's calls on each backend, by ``(suite, backend)`` (reported, never asserted)."""


def suite_settings(max_examples: int, **overrides: Any) -> settings:
    """The settings of the selected profile for a suite that runs ``max_examples`` examples in CI (ten times as many
    under the explore profile, which keeps its examples in ``.hypothesis/examples``).

    Raises:
        ValueError: when ``INFERSCALE_HYPOTHESIS_PROFILE`` names another profile.
    """
    name = os.environ.get("INFERSCALE_HYPOTHESIS_PROFILE", CI_PROFILE)
    if name == CI_PROFILE:
        return settings(settings.get_profile(name), max_examples=max_examples, **overrides)
    if name == EXPLORE_PROFILE:
        return settings(
            settings.get_profile(name),
            max_examples=max_examples * EXPLORE_SCALE,
            database=DirectoryBasedExampleDatabase(".hypothesis/examples"),
            **overrides,
        )
    raise ValueError(f"INFERSCALE_HYPOTHESIS_PROFILE={name!r}: use {CI_PROFILE!r} or {EXPLORE_PROFILE!r}")


def backend_of(url: str) -> str:
    """``"sqlite"`` or ``"postgres"``: the backend a database URL names."""
    return "sqlite" if url.startswith("sqlite") else "postgres"


def count_case(suite: str, backend: str, n: int = 1) -> None:
    """Add ``n`` generated cases of ``suite`` on ``backend`` to the session's report."""
    CASES[(suite, backend)] += n


@contextmanager
def timed(suite: str, backend: str) -> Iterator[None]:
    """Add the time the block takes to ``suite`` on ``backend`` in the session's report."""
    start = time.perf_counter()
    try:
        yield
    finally:
        SECONDS[(suite, backend)] += time.perf_counter() - start
