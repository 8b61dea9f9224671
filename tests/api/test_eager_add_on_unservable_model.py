"""An ``add`` (or ``import_memories``) that encodes eagerly on a model InferScale cannot load or rotate the keys of:
a tester found the memory committed, then ``UnsupportedModelError`` (Phi-3's fused QKV, GPT-2's learned positions,
a dynamic RoPE) or ``ConfigError`` (Gemma 2 under SDPA) raised from the encoding after the write, and the same add
again returned ``{"results": []}``, so the caller never learned the id. Now the model is loaded before the write,
and the refused call writes nothing, on the sync and the async client. Background and lazy encoding still store the
memory (they load no model in ``add``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import transformers
from mem0_fakes import HashEmbedder
from tiny_models import TINY, byte_chat_tokenizer, tiny_engine, tiny_model

from inferscale import AsyncMemoryClient, ConfigError, MemoryClient, MemoryConfig, UnsupportedModelError
from inferscale.config import EngineConfig, KVConfig
from inferscale.fact_kv import FactKVManager

MEMORY = "5c1f3c52-7e0e-4c55-9a43-7c1d1f6b2a01"
EXPORTED = [{"id": MEMORY, "memory": "Lives in Porto.", "created_at": "2026-03-02T10:00:00+00:00", "user_id": "u"}]


def _save(model: Any, folder: Path) -> str:
    model.save_pretrained(folder)
    byte_chat_tokenizer().save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("unservable")
    gemma2 = transformers.AutoModelForCausalLM.from_config(transformers.Gemma2Config(**{**TINY, "head_dim": 16}))
    return {
        "phi3-fused-qkv": _save(tiny_model("phi3"), root / "phi3"),
        "gemma2-under-sdpa": _save(gemma2, root / "gemma2"),
    }


REFUSALS: dict[str, tuple[type[Exception], str]] = {
    "phi3-fused-qkv": (UnsupportedModelError, "fused"),
    "gemma2-under-sdpa": (ConfigError, r"cannot run engine\.attn_implementation='sdpa_gqa'"),
}


def _config(tmp_path: Path, db_url: str, model: str, encode_on_add: str) -> MemoryConfig:
    engine = EngineConfig(model=model, dtype="float32", device="cpu")
    return MemoryConfig(data_dir=str(tmp_path), db_url=db_url, engine=engine, kv=KVConfig(encode_on_add=encode_on_add))


def _texts(client: MemoryClient) -> list[str]:
    return sorted(m["memory"] for m in client.get_all(user_id="u")["results"])


@pytest.mark.parametrize("model", list(REFUSALS))
def test_an_eager_add_on_such_a_model_is_refused_before_it_writes(
    folders: dict[str, str], tmp_path: Path, db_url: str, model: str
) -> None:
    error, message = REFUSALS[model]
    with MemoryClient(_config(tmp_path, db_url, folders[model], "eager"), embedder=HashEmbedder()) as client:
        for _ in range(2):  # the second try is refused alike: nothing was written by the first
            with pytest.raises(error, match=message):
                client.add("Ana is a nurse in Lisbon.", user_id="u", infer=False)
        with pytest.raises(error, match=message):
            client.import_memories(EXPORTED)
        assert _texts(client) == [] and client.search("nurse", user_id="u")["results"] == []
        client.add("Raj plays chess.", user_id="u", infer=False, encode_kv=False)  # lazy: stored, as documented
        assert _texts(client) == ["Raj plays chess."]
        with pytest.raises(error, match=message):
            client.add("Ana is a nurse in Lisbon.", user_id="u", infer=False, encode_kv=True)
        assert _texts(client) == ["Raj plays chess."]


@pytest.mark.parametrize("model", list(REFUSALS))
def test_the_async_client_refuses_it_alike(folders: dict[str, str], tmp_path: Path, db_url: str, model: str) -> None:
    error, message = REFUSALS[model]

    async def run() -> list[str]:
        config = _config(tmp_path, db_url, folders[model], "eager")
        async with AsyncMemoryClient(config, embedder=HashEmbedder()) as client:
            with pytest.raises(error, match=message):
                await client.add("Ana is a nurse in Lisbon.", user_id="u", infer=False)
            with pytest.raises(error, match=message):
                await client.import_memories(EXPORTED)
            return [m["memory"] for m in (await client.get_all(user_id="u"))["results"]]

    assert asyncio.run(run()) == []


def test_a_background_add_on_such_a_model_stores_the_memory(folders: dict[str, str], tmp_path: Path) -> None:
    """The documented trade-off: a background ``add`` loads no model, so it cannot know; the memory is stored and
    searchable, and a chat names the model's problem."""
    config = _config(tmp_path, f"sqlite:///{tmp_path / 'memories.db'}", folders["phi3-fused-qkv"], "background")
    with MemoryClient(config, embedder=HashEmbedder()) as client:
        added = client.add("Ana is a nurse in Lisbon.", user_id="u", infer=False)["results"]
        assert [r["memory"] for r in added] == ["Ana is a nurse in Lisbon."]
        assert [m["id"] for m in client.search("nurse", user_id="u")["results"]] == [added[0]["id"]]
        with pytest.raises(UnsupportedModelError, match="fused"):
            client.chat("Who is Ana?", user_id="u", mode="kv")


def test_an_eager_encoding_that_fails_after_the_write_still_saves_the_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tester read it in the code: when the eager encoding raised after the commit, ``save_index`` was skipped, so
    the committed memory's vector reached the index file only at a later write or ``close``."""
    config = MemoryConfig(data_dir=str(tmp_path), kv=KVConfig(encode_on_add="eager"))
    with MemoryClient(config, engine=tiny_engine("llama"), embedder=HashEmbedder()) as client:
        saves: list[bool] = []
        real_save = client.derived.save_index

        def save_index(force: bool = False) -> None:
            saves.append(force)
            real_save(force)

        monkeypatch.setattr(client.derived, "save_index", save_index)

        def failing(self: FactKVManager, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError("encoding failed")

        monkeypatch.setattr(FactKVManager, "prepare", failing)
        with pytest.raises(RuntimeError, match="encoding failed"):
            client.add("Ana is a nurse in Lisbon.", user_id="u", infer=False)
        assert saves == [False]
        assert _texts(client) == ["Ana is a nurse in Lisbon."]  # committed: the error says so by its kind
