"""Shared fixtures: the embedded SmolLM2 (converted once into the shared cache) and the MiniLM embedder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


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
