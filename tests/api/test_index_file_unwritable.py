"""An index file that cannot be written (a full or read-only disk). The index is derived from SQL, yet its save
raised OSError from ``add`` after the memory was committed (a retry was skipped as a duplicate and never learnt the
id) and from ``close``, which then released nothing else (tester report). The save is logged and tried again later;
the next process rebuilds what the file lacks from SQL."""

from __future__ import annotations

from pathlib import Path

import pytest
from mem0_fakes import HashEmbedder, fake_config

import inferscale.derived
from inferscale import MemoryClient
from inferscale.retrieval import VectorIndex


def test_a_write_and_close_whose_index_file_cannot_be_saved_go_on(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def full_disk(self: VectorIndex, path: object = None) -> Path:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(inferscale.derived, "INDEX_SAVE_INTERVAL_S", 0.0)  # every write saves: the add itself does
    monkeypatch.setattr(inferscale.derived, "INDEX_SAVE_SHARE", float("inf"))
    config = fake_config(tmp_path, db_url)
    client = MemoryClient(config, embedder=HashEmbedder())
    client.add("I like tea.", user_id="u", infer=False)
    monkeypatch.setattr(VectorIndex, "save", full_disk)
    added = client.add("My dog is called Biscuit.", user_id="u", infer=False)["results"]
    assert [r["memory"] for r in added] == ["My dog is called Biscuit."]
    assert client.search("dog", user_id="u", limit=1)["results"][0]["memory"] == "My dog is called Biscuit."
    assert "could not be written ([Errno 28] No space left on device)" in caplog.text
    client.close()
    monkeypatch.undo()
    with MemoryClient(config, embedder=HashEmbedder()) as again:
        assert again.search("dog", user_id="u", limit=1)["results"][0]["memory"] == "My dog is called Biscuit."
        assert again.reconcile().repairs == 0  # the first search repaired the index from SQL


def test_a_reset_whose_index_file_cannot_be_saved_returns(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """reset() saved its empty index unguarded: it raised OSError after its commit."""

    def full_disk(self: VectorIndex, path: object = None) -> Path:
        raise OSError(28, "No space left on device")

    config = fake_config(tmp_path, db_url)
    with MemoryClient(config, embedder=HashEmbedder()) as client:
        client.add("I like tea.", user_id="u", infer=False)
        monkeypatch.setattr(VectorIndex, "save", full_disk)
        client.reset()
        assert client.get_all(user_id="u")["results"] == []
        assert client.search("tea", user_id="u")["results"] == []
        monkeypatch.undo()
    with MemoryClient(config, embedder=HashEmbedder()) as again:
        assert again.search("tea", user_id="u")["results"] == []
