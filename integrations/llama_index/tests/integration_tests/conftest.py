"""One InferScale client on the embedded models (SmolLM2-135M + MiniLM, float32, offline) for the whole session,
with memories for two users; the tests run against the real llama-index-core."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from inferscale import MemoryClient
from tests.integration_tests.shared import ALICE_FACTS, BOB_FACTS


@pytest.fixture(scope="session")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MemoryClient]:
    import torch

    torch.set_num_threads(2)
    data_dir: Path = tmp_path_factory.mktemp("inferscale")
    client = MemoryClient({"data_dir": str(data_dir), "engine": {"dtype": "float32"}})
    for fact in ALICE_FACTS:
        client.add(fact, user_id="alice", infer=False)
    for fact in BOB_FACTS:
        client.add(fact, user_id="bob", infer=False)
    yield client
    client.close()


@pytest.fixture(scope="session")
def memory_ids(client: MemoryClient) -> dict[str, set[str]]:
    """Each user's memory ids (stored before any test ran)."""
    return {u: {m["id"] for m in client.get_all(user_id=u)["results"]} for u in ("alice", "bob")}
