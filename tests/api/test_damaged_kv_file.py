"""A damaged K/V file (cut short by a full disk or an interrupted copy) made every chat that retrieved its memory
raise safetensors' own error, which is no InferScaleError, and nothing repaired it. The chat now encodes the memory
again, stores it anew and answers as on an undamaged store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from mem0_fakes import HashEmbedder
from safetensors.torch import load_file
from tiny_models import tiny_engine

from inferscale import MemoryClient, MemoryConfig
from inferscale.config import KVConfig


@pytest.fixture(scope="module")
def engine() -> Any:
    return tiny_engine("llama")


def test_a_chat_re_encodes_a_memory_whose_k_v_file_is_cut_short(engine: Any, tmp_path: Path) -> None:
    config = MemoryConfig(data_dir=str(tmp_path), kv=KVConfig(encode_on_add="eager", host_budget_bytes=0))
    with MemoryClient(config, engine=engine, embedder=HashEmbedder()) as client:
        (memory_id,) = [r["id"] for r in client.add("My dog is called Biscuit.", user_id="u", infer=False)["results"]]
        answer = client.chat("What is my dog called?", user_id="u", max_new_tokens=4)
        (path,) = (tmp_path / "kv" / memory_id).glob("*.safetensors")
        intact = path.read_bytes()
        path.write_bytes(intact[: len(intact) // 2])
        again = client.chat("What is my dog called?", user_id="u", max_new_tokens=4)
        assert (again.memory_ids, again.answer) == (answer.memory_ids, answer.answer)
        before = tmp_path / "intact.safetensors"
        before.write_bytes(intact)
        assert load_file(path).keys() == load_file(before).keys()
        for name, tensor in load_file(path).items():  # encoded again, bit for bit as before
            assert torch.equal(tensor, load_file(before)[name]), name
