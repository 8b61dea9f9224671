"""A tier-budget tester's finds on the client: a GPU K/V budget on an engine without CUDA was accepted, and an eager
``add`` then committed its memory before the K/V store failed to build (``ConfigError``), with every later chat
failing too; ``reconcile()`` counted a deleted memory's K/V as removed when removing them failed."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from mem0_fakes import HashEmbedder
from pydantic import ValidationError
from tiny_models import tiny_engine

from inferscale import AsyncMemoryClient, ConfigError, MemoryClient, MemoryConfig
from inferscale.config import EngineConfig, KVConfig
from inferscale.kv import KVStore
from inferscale.kv.tiers import DiskTier
from inferscale.mem0_config import config_from_dict

GPU_TIER_ON_CPU = {"engine": {"device": "cpu"}, "kv": {"device_budget_bytes": 1_000_000}}


def test_a_gpu_kv_budget_with_a_cpu_engine_is_refused_with_the_config() -> None:
    for build in (config_from_dict, MemoryClient, AsyncMemoryClient):
        with pytest.raises(ConfigError, match=r"device_budget_bytes=1000000 asks for a GPU K/V tier.*'cpu'"):
            build(GPU_TIER_ON_CPU)
    for budget in (0, None):  # no GPU tier: accepted
        config_from_dict({"engine": {"device": "cpu"}, "kv": {"device_budget_bytes": budget}})
    with pytest.raises(ValidationError, match="asks for a GPU K/V tier"):  # built directly: pydantic's error
        MemoryConfig(engine=EngineConfig(device="cpu"), kv=KVConfig(device_budget_bytes=1))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the engine runs on CUDA here: the budget is used")
def test_with_device_auto_and_no_cuda_the_gpu_budget_is_ignored_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = MemoryConfig(data_dir=str(tmp_path), kv=KVConfig(device_budget_bytes=1_000_000, encode_on_add="eager"))
    assert config.engine.device == "auto"
    with (
        caplog.at_level(logging.WARNING, logger="inferscale.derived"),
        MemoryClient(config, engine=tiny_engine("llama"), embedder=HashEmbedder()) as client,
    ):
        client.add("Ana is a nurse in Lisbon.", user_id="u", infer=False)
        assert [m["memory"] for m in client.get_all(user_id="u")["results"]] == ["Ana is a nurse in Lisbon."]
        stats = client.derived.kv_stats()
        assert stats is not None and "device" not in stats.entries and stats.entries["host"] == 1
    assert "kv.device_budget_bytes=1000000 is ignored: the engine runs on cpu" in caplog.text


def test_an_eager_add_whose_kv_store_cannot_be_built_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kind of the find: whatever stops the K/V store from being built stops an eager add before its write."""

    def refused(self: KVStore, *args: Any, **kwargs: Any) -> None:
        raise ConfigError("this K/V store cannot be built")

    monkeypatch.setattr(KVStore, "__init__", refused)
    config = MemoryConfig(data_dir=str(tmp_path), kv=KVConfig(encode_on_add="eager"))
    with MemoryClient(config, engine=tiny_engine("llama"), embedder=HashEmbedder()) as client:
        with pytest.raises(ConfigError, match="cannot be built"):
            client.add("Ana is a nurse in Lisbon.", user_id="u", infer=False)
        assert client.get_all(user_id="u")["results"] == []


def test_reconcile_counts_only_the_kv_it_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kv = KVConfig(encode_on_add="eager", host_budget_bytes=0)  # on disk only: no cached copy to count
    config = MemoryConfig(data_dir=str(tmp_path), kv=kv)
    with MemoryClient(config, engine=tiny_engine("llama"), embedder=HashEmbedder()) as client:
        texts = ["Ana is a nurse in Lisbon.", "Raj plays chess."]
        ids = [client.add(text, user_id="u", infer=False)["results"][0]["id"] for text in texts]
        store_dir = client.fact_kv.store.directory
        assert store_dir is not None
        for memory_id in ids:
            client.db.delete(memory_id)  # the transaction alone: their K/V folders stay for reconciliation

        def read_only(self: KVStore, memory_id: str) -> int:
            raise PermissionError(13, "Read-only file system")

        with monkeypatch.context() as patched:
            patched.setattr(KVStore, "delete_memory", read_only)
            assert client.reconcile().kv_memories_removed == 0  # it said 2, and 2 again once removal worked
        assert all((store_dir / memory_id).is_dir() for memory_id in ids)
        listed = DiskTier(store_dir).entry_files()
        shutil.rmtree(store_dir / ids[0])  # another process, between this reconcile's listing and its removal
        with monkeypatch.context() as patched:
            patched.setattr(DiskTier, "entry_files", lambda self: listed)
            assert client.reconcile().kv_memories_removed == 1  # the folder this reconcile removed
        assert not any((store_dir / memory_id).exists() for memory_id in ids)
        assert client.reconcile().kv_memories_removed == 0
