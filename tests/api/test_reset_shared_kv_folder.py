"""``reset()`` removes the K/V of its own database only. Two databases may share a data folder, and with it the K/V
folder (a second SQLite file, or a move to PostgreSQL with the same ``data_dir``): reset emptied the whole K/V
folder, so the other store's memories were all encoded again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mem0_fakes import HashEmbedder
from tiny_models import tiny_engine

from inferscale import MemoryClient, MemoryConfig
from inferscale.config import KVConfig


@pytest.fixture(scope="module")
def engine() -> Any:
    return tiny_engine("llama")


def _files(folder: Path, memory_ids: list[str]) -> list[Path]:
    return sorted(p for memory_id in memory_ids for p in (folder / memory_id).glob("*.safetensors"))


def test_reset_keeps_the_k_v_of_another_database_in_the_same_folder(engine: Any, tmp_path: Path) -> None:
    def client(name: str) -> MemoryClient:
        config = MemoryConfig(
            data_dir=str(tmp_path), db_url=f"sqlite:///{tmp_path / name}", kv=KVConfig(encode_on_add="eager")
        )
        return MemoryClient(config, engine=engine, embedder=HashEmbedder())

    kv = tmp_path / "kv"
    with client("a.db") as a, client("b.db") as b:
        kept = [r["id"] for r in a.add("My dog is called Biscuit.", user_id="u", infer=False)["results"]]
        wiped = [r["id"] for r in b.add("I live in Porto.", user_id="u", infer=False)["results"]]
        deleted = [r["id"] for r in b.add("I like tea.", user_id="v", infer=False)["results"]]
        b.delete(deleted[0])
        kept_files = _files(kv, kept)
        assert kept_files and _files(kv, wiped)
        b.reset()
        assert _files(kv, wiped) == [] and _files(kv, kept) == kept_files
        (served,) = a.memory_kv(kept)  # read from its file, not encoded again
        assert served.source is not None and Path(served.source) in kept_files
        a.reset()
        assert _files(kv, kept) == []


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_reset_cut_short_after_its_commit_leaves_no_k_v_behind(
    engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """A process killed in reset() after the SQL commit left every memory's K/V files on disk for good: the reset
    history no longer named them as this database's, so reconciliation kept them as another database's, and a
    second reset did not see them either. Their K/V are now removed before the commit."""
    import asyncio

    from inferscale import AsyncMemoryClient
    from inferscale.derived import DerivedStores

    config = MemoryConfig(data_dir=str(tmp_path), kv=KVConfig(encode_on_add="eager"))
    with MemoryClient(config, engine=engine, embedder=HashEmbedder()) as client:
        ids = [r["id"] for r in client.add("I live in Porto.", user_id="u", infer=False)["results"]]
        ids += [r["id"] for r in client.add("I like tea.", user_id="v", infer=False)["results"]]
    assert _files(tmp_path / "kv", ids)

    def killed(self: DerivedStores, memory_ids: object) -> None:
        raise KeyboardInterrupt  # as a SIGKILL right after the commit: nothing after it runs

    monkeypatch.setattr(DerivedStores, "reset", killed)
    if kind == "sync":
        with MemoryClient(config, engine=engine, embedder=HashEmbedder()) as client, pytest.raises(KeyboardInterrupt):
            client.reset()
    else:

        async def reset() -> None:
            async with AsyncMemoryClient(config, engine=engine, embedder=HashEmbedder()) as client:
                await client.reset()

        with pytest.raises(KeyboardInterrupt):
            asyncio.run(reset())
    monkeypatch.undo()
    with MemoryClient(config, engine=engine, embedder=HashEmbedder()) as client:
        assert client.get_all(user_id="u")["results"] == [] and client.get_all(user_id="v")["results"] == []
        assert client.reconcile().kv_folders_kept == 0
    assert _files(tmp_path / "kv", ids) == []
