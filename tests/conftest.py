"""Shared fixtures: the database URL of each backend, the embedded SmolLM2 (converted once into the shared cache)
and the MiniLM embedder; and the check that every test loading a model through them is marked slow."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from databases import database_url, postgres_base_url

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _torch_threads() -> int:
    """``OMP_NUM_THREADS`` when set (``make test-core`` sets 1 for each pytest-xdist worker), else up to 2."""
    configured = os.environ.get("OMP_NUM_THREADS", "")
    return int(configured) if configured.isdigit() and int(configured) > 0 else max(1, min(2, os.cpu_count() or 1))


torch.set_num_threads(_torch_threads())


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The converted SmolLM2-135M-Instruct folder (converted on first use, then reused)."""
    from inferscale.models import default_llm_path

    return default_llm_path()


@pytest.fixture(scope="session")
def smollm2_fp32(smollm2_path: Path) -> tuple[Any, Any]:
    """(model, tokenizer) of SmolLM2 in float32 with eager attention, for exactness tests."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    model = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32, attn_implementation="eager")
    return model.eval(), tokenizer


@pytest.fixture(scope="session")
def embedder() -> Any:
    """The embedded all-MiniLM-L6-v2 embedder, loaded once."""
    from inferscale.retrieval import SentenceTransformerEmbedder

    emb = SentenceTransformerEmbedder()
    emb.embed(["warm up"])
    return emb


# ---- databases -------------------------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database URL per backend: a SQLite file under ``tmp_path``, then a fresh, empty schema on the PostgreSQL
    server, dropped after the test (:func:`databases.database_url`). The PostgreSQL case is skipped when psycopg is
    missing or no server answers."""
    with database_url(request.param, tmp_path) as url:
        yield url


@pytest.fixture
def postgres_url_or_none(tmp_path: Path) -> Iterator[str | None]:
    """A fresh, empty PostgreSQL schema's URL as ``db_url`` gives it, or ``None`` when psycopg is missing or no server
    answers: for a test that compares the backends side by side and still runs on SQLite alone without a server."""
    if postgres_base_url() is None:
        yield None
        return
    with database_url("postgres", tmp_path) as url:
        yield url


# ---- the slow marker ---------------------------------------------------------------------------------------------

MODEL_FIXTURES = frozenset({"smollm2_path", "smollm2_fp32", "embedder"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse a test that loads a model through a fixture (SmolLM2, MiniLM) without saying ``@pytest.mark.slow``
    (or a module's ``pytestmark``): ``-m "not slow"`` must leave every model load out. The mark stays explicit in
    each file; a test that loads a model another way (the demo CLI) carries it all the same."""
    unmarked = [
        item.nodeid
        for item in items
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())) and item.get_closest_marker("slow") is None
    ]
    if unmarked:
        raise pytest.UsageError("tests that load a model need @pytest.mark.slow:\n  " + "\n  ".join(unmarked))
