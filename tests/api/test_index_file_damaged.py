"""An index file cut short (a backup copy or a save interrupted, a full disk) or emptied: every search and chat
raised ConfigError ("delete it and rebuild") until someone deleted the file by hand (tester report). The index is
derived from the database: the file is set aside, and the client rebuilds the index from SQL on first use."""

from __future__ import annotations

from pathlib import Path

import pytest
from mem0_fakes import HashEmbedder, fake_config

from inferscale import MemoryClient

TEXTS = [f"Maya note {i}: item {i * 7}." for i in range(12)]


@pytest.mark.parametrize("keep", [0.5, 0.0], ids=["cut short", "empty"])
def test_a_client_rebuilds_a_damaged_index_file_from_the_database(tmp_path: Path, db_url: str, keep: float) -> None:
    config = fake_config(tmp_path, db_url)
    with MemoryClient(config, embedder=HashEmbedder()) as writer:
        writer.add([{"role": "user", "content": text} for text in TEXTS], user_id="maya", infer=False)
        expected = writer.search("Maya note 3: item 21.", user_id="maya", limit=3)["results"]
        file = writer.index.path
    assert file is not None
    whole = file.read_bytes()
    file.write_bytes(whole[: int(len(whole) * keep)])
    with MemoryClient(config, embedder=HashEmbedder()) as reader:
        found = reader.search("Maya note 3: item 21.", user_id="maya", limit=3)["results"]
        assert [(r["id"], r["score"]) for r in found] == [(r["id"], r["score"]) for r in expected]
        assert len(reader.index) == len(TEXTS)
    assert len(list(file.parent.glob(f"{file.name}.damaged-*"))) == 1
