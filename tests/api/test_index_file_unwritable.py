"""An index file that cannot be written (a full or read-only disk). The index is derived from SQL, yet its save
raised OSError from ``add`` after the memory was committed (a retry was skipped as a duplicate and never learnt the
id) and from ``close``, which then released nothing else (tester report). The save is logged and tried again later;
the next process rebuilds what the file lacks from SQL."""

from __future__ import annotations

from pathlib import Path

import pytest
from mem0_fakes import HashEmbedder, fake_config

from inferscale import MemoryClient
from inferscale.retrieval import VectorIndex


def test_a_write_and_close_whose_index_file_cannot_be_saved_go_on(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def full_disk(self: VectorIndex, path: object = None) -> Path:
        raise OSError(28, "No space left on device")

    config = fake_config(tmp_path, db_url)
    client = MemoryClient(config, embedder=HashEmbedder())
    client.add("I like tea.", user_id="u", infer=False)
    monkeypatch.setattr(VectorIndex, "save", full_disk)
    added = client.add("My dog is called Biscuit.", user_id="u", infer=False)["results"]
    assert [r["memory"] for r in added] == ["My dog is called Biscuit."]
    assert client.search("dog", user_id="u", limit=1)["results"][0]["memory"] == "My dog is called Biscuit."
    client.close()
    assert "could not be written ([Errno 28] No space left on device)" in caplog.text
    monkeypatch.undo()
    with MemoryClient(config, embedder=HashEmbedder()) as again:
        assert again.search("dog", user_id="u", limit=1)["results"][0]["memory"] == "My dog is called Biscuit."
        assert again.reconcile().repairs == 0  # the first search repaired the index from SQL
