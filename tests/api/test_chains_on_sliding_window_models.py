"""Chains (``kv.chain_block``) on a model with sliding-window layers, whose cache the chained encoding cannot lay
out (a K/V settings fuzzer's find, tiny Gemma 3): the config and client were accepted, and the second ``add``
committed its memory, then raised ``UnsupportedModelError`` from the eager encoding, so the caller never learned the
id. Now an ``add`` or re-wording ``update`` is refused before anything is written (the model's config file alone
says so; no weights load)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mem0_fakes import HashEmbedder
from tiny_models import tiny_engine

from inferscale import MemoryClient, MemoryConfig, UnsupportedModelError
from inferscale.config import KVConfig


def _config(tmp_path: Path, db_url: str, encode_on_add: Any = "eager") -> MemoryConfig:
    return MemoryConfig(data_dir=str(tmp_path), db_url=db_url, kv=KVConfig(chain_block=3, encode_on_add=encode_on_add))


@pytest.mark.parametrize("encode_on_add", ["eager", "background", "lazy"])
def test_an_add_with_chains_on_a_sliding_window_model_is_refused_before_it_is_written(
    tmp_path: Path, db_url: str, encode_on_add: str
) -> None:
    with MemoryClient(
        _config(tmp_path, db_url, encode_on_add), engine=tiny_engine("gemma3"), embedder=HashEmbedder()
    ) as c:
        assert c.engine.encodes_chains is False
        for texts in (["I like tea."], ["I like tea.", "I own a cat."]):
            with pytest.raises(UnsupportedModelError, match=r"kv.chain_block needs a model without sliding-window"):
                c.add([{"role": "user", "content": t} for t in texts], user_id="u", infer=False)
        assert c.get_all(user_id="u")["results"] == [] and c.db.all_kv_entries() == []


def test_a_re_wording_in_a_store_chained_under_another_model_is_refused_before_it_is_written(
    tmp_path: Path, db_url: str
) -> None:
    """Chained under a Llama, then opened with a sliding-window model: a new text would be encoded on stored K/V.
    It is refused and the memory keeps its text; a delete, which encodes nothing, is answered."""
    with MemoryClient(_config(tmp_path, db_url, "lazy"), engine=tiny_engine("llama"), embedder=HashEmbedder()) as c:
        messages = [{"role": "user", "content": t} for t in ["I like tea.", "I own a cat.", "I live in Porto."]]
        ids = [r["id"] for r in c.add(messages, user_id="u", infer=False)["results"]]
    with MemoryClient(_config(tmp_path, db_url), engine=tiny_engine("gemma3"), embedder=HashEmbedder()) as c:
        with pytest.raises(UnsupportedModelError, match=r"kv.chain_block needs a model without sliding-window"):
            c.update(ids[2], "I live in Lisbon.")
        assert c.get(ids[2])["memory"] == "I live in Porto."
        assert [h["event"] for h in c.history(ids[2])] == ["ADD"]
        assert c.delete(ids[1]) == {"message": "Memory deleted successfully!"}
