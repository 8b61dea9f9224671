"""A retrieving chat whose memory another process deletes while the chat encodes its K/V still answers, with the
K/V it encoded (the memory existed when it was retrieved), and stores nothing for the deleted memory. It raised
``MemoryNotFoundError`` (2 chats in 12 of a user's two-process test): storing the K/V found the row gone. Two clients
on one database stand for the two processes; the delete lands inside the chat's encoding, deterministically. The
delete also scrubs the deleted text from the other memories' contexts, so their K/V, encoded after it, are not stored
either."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mem0_fakes import HashEmbedder
from tiny_models import tiny_engine

from inferscale import MemoryClient, MemoryConfig
from inferscale.config import KVConfig
from inferscale.kv.encode import EncodeRequest


@pytest.fixture(scope="module")
def engine() -> Any:
    return tiny_engine("llama")


def test_a_memory_deleted_while_a_chat_encodes_it_serves_that_chat_unstored(
    engine: Any, tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = MemoryConfig(data_dir=str(tmp_path), db_url=db_url, kv=KVConfig(encode_on_add="lazy"))
    with (
        MemoryClient(config, engine=engine, embedder=HashEmbedder()) as chatting,
        MemoryClient(config, engine=engine, embedder=HashEmbedder()) as deleting,
    ):
        texts = ["My dog is called Biscuit.", "My dog likes the river.", "I live in Porto."]
        ids = [
            r["id"]
            for r in chatting.add([{"role": "user", "content": t} for t in texts], user_id="u", infer=False)["results"]
        ]
        fact_kv = chatting.derived.fact_kv
        encode = fact_kv.encode

        def encode_then_deleted_elsewhere(requests: list[EncodeRequest]) -> Any:
            encoded = encode(requests)
            if deleting.get(ids[0]) is not None:
                deleting.delete(ids[0])
            return encoded

        monkeypatch.setattr(fact_kv, "encode", encode_then_deleted_elsewhere)
        result = chatting.chat("What is my dog called?", user_id="u", max_new_tokens=2)
        assert ids[0] in result.memory_ids  # retrieved while it existed, and served
        monkeypatch.setattr(fact_kv, "encode", encode)
        # The other two were encoded after the deleted text, which the delete scrubbed from their contexts: K/V
        # computed after it are stored for neither (they were, until the row's write checked the context).
        assert chatting.db.all_kv_entries() == []
        again = chatting.chat("What is my dog called?", user_id="u", max_new_tokens=2)
        assert ids[0] not in again.memory_ids
        rows = chatting.db.all_kv_entries()  # encoded again, after their contexts as they are now: keys chats serve
        assert {row.memory_id for row in rows} == set(again.memory_ids)
        assert chatting.prune_kv(dry_run=True).rows_removed == 0
