from __future__ import annotations

from collections.abc import Iterator

import pytest

from inferscale.client import MemoryClient
from tests.integration_tests.shared import shared_client


@pytest.fixture(scope="session")
def client() -> Iterator[MemoryClient]:
    yield shared_client()


@pytest.fixture(scope="session", autouse=True)
def _close_shared_client() -> Iterator[None]:
    yield
    if shared_client.cache_info().currsize:
        shared_client().close()
