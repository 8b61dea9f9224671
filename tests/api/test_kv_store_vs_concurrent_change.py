"""K/V encoded from a memory that another client changes before they are stored (a multi-process tester's find,
from reading the code). The encoder compared the memory with SQL under its own client's lock, then wrote the
``kv_entries`` row, which checked only that the memory still existed. A re-wording, or a deleted memory's text
scrubbed from this memory's stored context, committed by another process between the two, left a row and a file
under the old text or context: never served (the key names them), but ``reconcile()`` kept an old context's entry,
whose K/V were computed after the deleted text. The row's write now checks, under a lock on the memory's row, the
text hash, context and chain start the K/V were encoded from, and stores nothing when they changed. Two clients on
one database and data folder stand for the two processes; the other's change lands between encoding and storing,
deterministically."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from mem0_fakes import HashEmbedder
from tiny_models import tiny_engine

from inferscale import MemoryClient, MemoryConfig, MemoryNotFoundError
from inferscale.config import KVConfig
from inferscale.fact_kv import IN_CONTEXT
from inferscale.storage.kv_entries import MemoryChangedError
from inferscale.storage.queries import kv_entries_of

DOG, CITY = "My dog is Rex.", "I live in Porto."


@pytest.fixture(scope="module")
def engine() -> Any:
    return tiny_engine("llama")


def _changes(other: MemoryClient, dog: str, city: str) -> dict[str, Any]:
    return {
        "context turn deleted": lambda: other.delete(dog),
        "re-worded": lambda: other.update(city, "I live in Lisbon."),
    }


@pytest.mark.parametrize("change", ["context turn deleted", "re-worded"])
def test_kv_encoded_before_another_clients_change_are_not_stored(
    tmp_path: Path, db_url: str, engine: Any, change: str
) -> None:
    config = MemoryConfig(data_dir=str(tmp_path), db_url=db_url, kv=KVConfig(encode_on_add="lazy"))
    with (
        MemoryClient(config, engine=engine, embedder=HashEmbedder()) as encoding,
        MemoryClient(config, engine=engine, embedder=HashEmbedder()) as other,
    ):
        messages = [{"role": "user", "content": DOG}, {"role": "user", "content": CITY}]
        dog, city = [r["id"] for r in encoding.add(messages, user_id="u", infer=False)["results"]]
        encoding.derived.load_encoder()
        fact_kv = encoding.derived.fact_kv
        record = encoding.db.get(city)
        assert record is not None and record.context == [DOG]  # its K/V are encoded after the dog's text
        wanted = [(record, IN_CONTEXT)]
        encoded = fact_kv.encode(fact_kv.requests(wanted))

        _changes(other, dog, city)[change]()  # committed by the other process between encoding and storing
        with pytest.raises(MemoryChangedError, match="changed after its K/V were encoded") as refused:
            fact_kv.put(wanted, encoded)
        assert isinstance(refused.value, MemoryNotFoundError)  # what the encoder and chats already skip
        assert encoding.db.run_read(kv_entries_of, [city]) == []
        assert list((tmp_path / "kv").rglob("*.safetensors")) == []

        (served,) = fact_kv._put_serving(wanted, encoded)  # a chat's path: its K/V serve it, stored nowhere
        assert torch.equal(served.keys, encoded[0].keys) and encoding.db.run_read(kv_entries_of, [city]) == []

        assert encoding.derived.missing_kv([city]) == [city]  # encoded again from the new state when next used
        encoding.prepare_kv()
        rows = encoding.db.run_read(kv_entries_of, [city])  # with a context, also its context-free encoding
        now = encoding.db.get(city)
        assert now is not None and rows and {row.text_hash for row in rows} == {now.hash}
        assert encoding.derived.missing_kv([city]) == []


def test_the_encoder_stores_a_context_free_encoding_whose_context_was_scrubbed_as_the_memory_is_now(
    tmp_path: Path, db_url: str, engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review's find in the first version of the check: the encoder kept the context-free encoding of a memory
    whose context lost one of its turns during the pass (its key does not depend on the turns while one is left),
    then stored it as the record it had read, whose context the row's check no longer found: ``MemoryChangedError``
    failed the pass. It is stored as the memory is now; the in-context encoding, computed after the deleted text,
    is not."""
    config = MemoryConfig(data_dir=str(tmp_path), db_url=db_url, kv=KVConfig(encode_on_add="lazy"))
    with (
        MemoryClient(config, engine=engine, embedder=HashEmbedder()) as encoding,
        MemoryClient(config, engine=engine, embedder=HashEmbedder()) as other,
    ):
        texts = ["I play the cello.", DOG, CITY]
        messages = [{"role": "user", "content": text} for text in texts]
        _, dog, city = [r["id"] for r in encoding.add(messages, user_id="u", infer=False)["results"]]
        encoding.derived.load_encoder()
        fact_kv = encoding.derived.fact_kv
        encode = fact_kv.encode

        def encode_then_deleted_elsewhere(requests: Any) -> Any:
            encoded = encode(requests)
            if other.get(dog) is not None:
                other.delete(dog)  # its text leaves the city's context
            return encoded

        monkeypatch.setattr(fact_kv, "encode", encode_then_deleted_elsewhere)
        assert encoding.derived.encode_queued([city]) == []
        monkeypatch.setattr(fact_kv, "encode", encode)
        now = encoding.db.get(city)
        assert now is not None and now.context == texts[:1]  # a turn is left: the context-free key is unchanged
        (row,) = encoding.db.run_read(kv_entries_of, [city])  # the context-free one, under the memory as it is
        assert row.text_hash == now.hash and ";w=0;" in row.encoding_key
        assert encoding.prune_kv(dry_run=True).rows_removed == 0  # no entry of the old context
        assert encoding.derived.missing_kv([city]) == [city]  # its in-context one, after the turn left


def test_a_memory_changed_between_the_encoders_check_and_its_row_is_skipped_and_the_rest_stored(
    tmp_path: Path, db_url: str, engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process re-words one memory of a chunk after the encoder compared the chunk with SQL: that memory is
    skipped (encoded again when next used), the others are stored, and the chunk is not retried (the first version
    of the check failed the whole chunk, which the queue then encoded again one memory at a time)."""
    config = MemoryConfig(
        data_dir=str(tmp_path), db_url=db_url, kv=KVConfig(encode_on_add="lazy", first_memory_context_free=False)
    )
    with (
        MemoryClient(config, engine=engine, embedder=HashEmbedder()) as encoding,
        MemoryClient(config, engine=engine, embedder=HashEmbedder()) as other,
    ):
        texts = [DOG, CITY, "I play the cello."]
        ids = [r["id"] for r in encoding.add(texts[0], user_id="u", infer=False)["results"]]
        ids += [r["id"] for r in encoding.add(texts[1], user_id="v", infer=False)["results"]]
        ids += [r["id"] for r in encoding.add(texts[2], user_id="w", infer=False)["results"]]
        encoding.derived.load_encoder()
        fact_kv = encoding.derived.fact_kv
        put_one = fact_kv._put_one

        def put_after_a_change_elsewhere(record: Any, key: Any, fact: Any) -> Any:
            if record.id == ids[1] and other.get(ids[1])["memory"] == CITY:
                other.update(ids[1], "I live in Lisbon.")  # committed after the encoder's check
            return put_one(record, key, fact)

        monkeypatch.setattr(fact_kv, "_put_one", put_after_a_change_elsewhere)
        assert encoding.derived.encode_queued(ids) == []  # no error for the queue to retry the chunk on
        stored = {row.memory_id for row in encoding.db.all_kv_entries()}
        assert stored == {ids[0], ids[2]}
        assert encoding.derived.missing_kv(ids) == [ids[1]]  # its new text, encoded when next used
