"""The remote clients against a scripted server (:class:`remote_wire.Wire`): ``wire`` runs each test on both remote
clients ("remote": :class:`RemoteMemoryClient`, "remote-async": :class:`AsyncRemoteMemoryClient`), behind
:class:`client_adapter.ClientAdapter`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from remote_wire import Wire

from inferscale import http_retry as retry


@pytest.fixture(params=["remote", "remote-async"])
def wire(request: pytest.FixtureRequest) -> Iterator[Wire]:
    """A scripted server and a factory of remote clients of this test's kind on it."""
    scripted = Wire(request.param)
    yield scripted
    scripted.close()


@pytest.fixture(autouse=True)
def _short_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Waits between attempts of 10 ms, doubling, with no jitter (the policy's shape, at a test's pace)."""
    monkeypatch.setattr(retry, "FIRST_WAIT_S", 0.01)
    monkeypatch.setattr(retry, "JITTER_S", 0.0)
