"""A configured device this machine lacks is a ConfigError on every path that uses one: a new user's found
``{"engine": {"device": "cuda"}}`` on a CPU-only torch raising torch's ``AssertionError`` ("Torch not compiled with
CUDA enabled") from the dtype choice, the same from the embedder on ``add``, and ``cuda:5`` failing only at the next
chat. The README's own config example names ``"cuda"``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inferscale import ConfigError, MemoryClient, MemoryConfig
from inferscale.devices import checked_device

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA; this one has it")


def test_auto_and_cpu_name_what_the_machine_has() -> None:
    assert checked_device("auto", "engine.device") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert checked_device("cpu", "engine.device") == "cpu"


@pytest.mark.parametrize("device", ["cuda:99", "cuda:x"])
def test_a_cuda_device_that_is_not_there_is_a_config_error_on_every_machine(device: str) -> None:
    with pytest.raises(ConfigError, match=f"embedder.device is '{device}', but "):
        checked_device(device, "embedder.device")


@NO_CUDA
def test_cuda_without_cuda_says_why_and_what_to_use() -> None:
    with pytest.raises(ConfigError, match=r"engine.device is 'cuda', but this torch build has no CUDA .*use 'cpu'"):
        checked_device("cuda", "engine.device")


@pytest.mark.parametrize(
    "device", ["cuda:99", pytest.param("cuda", marks=NO_CUDA), pytest.param("cuda:5", marks=NO_CUDA)]
)
def test_a_client_whose_engine_or_embedder_names_cuda_refuses_with_a_config_error(tmp_path: Path, device: str) -> None:
    engine_on_cuda = MemoryClient(MemoryConfig(data_dir=str(tmp_path / "a"), engine={"device": device}))
    with engine_on_cuda, pytest.raises(ConfigError, match=r"engine\.device"):
        engine_on_cuda.chat("What is my dog called?", user_id="maya")
    embedder_on_cuda = MemoryClient(MemoryConfig(data_dir=str(tmp_path / "b"), embedder={"device": device}))
    with embedder_on_cuda:
        with pytest.raises(ConfigError, match=r"embedder\.device"):
            embedder_on_cuda.add("My dog is called Biscuit.", user_id="maya", infer=False)
        assert embedder_on_cuda.db.all_memories() == []
