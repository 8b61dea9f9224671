"""The property-based suites' report: how many cases each generated on each backend, and how long their calls took
(see :mod:`property_support`), written at the end of the test output whatever pytest's verbosity."""

from __future__ import annotations

import pytest
from property_support import CASES, SECONDS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Write the cases each suite generated on each backend, and the seconds they took."""
    if not CASES:
        return
    terminalreporter.section("property cases")
    for (suite, backend), n in sorted(CASES.items()):
        terminalreporter.write_line(f"property cases: {suite} on {backend}: {n}")
    for (suite, backend), seconds in sorted(SECONDS.items()):
        terminalreporter.write_line(f"property seconds: {suite} on {backend}: {seconds:.1f}")
