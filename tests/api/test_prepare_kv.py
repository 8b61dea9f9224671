"""``prepare_kv``: encode now the K/V a chat would encode on first use, for a scope or the whole database, as a
fresh encoding gives them; after a settings change every memory is encoded again under its new key; a memory that
no longer fits the model's context is reported, not encoded.

On a tiny float32 model with a byte-level tokenizer (fast, real encoding), sync and async clients, both databases.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
from mem0_fakes import HashEmbedder
from served_kv import context_free_request
from tiny_models import tiny_engine

from inferscale import (
    AsyncMemoryClient,
    ConfigError,
    MemoryClient,
    MemoryConfig,
    ModelNotAvailableError,
    ScopeError,
    kv_prepare,
)
from inferscale.config import EngineConfig, KVConfig
from inferscale.fact_kv import CONTEXT_FREE, IN_CONTEXT
from inferscale.kv_prepare import KVPrepareReport
from inferscale.storage import MemoryRecord

MAYA = ["My dog is a beagle named Biscuit.", "I live in Porto.", "My sister Clara teaches in Madrid."]
BOB = ["I play the cello.", "My cat is called Miso."]


@pytest.fixture(scope="module")
def engine() -> Any:
    return tiny_engine("llama")


def _config(data_dir: Path, db_url: str, **kv: Any) -> MemoryConfig:
    """Nothing encoded on add (``"lazy"``), so every K/V below is the one ``prepare_kv`` stored."""
    return MemoryConfig(data_dir=str(data_dir), db_url=db_url, kv=KVConfig(encode_on_add="lazy", **kv))


class Client:
    """A sync or async client's calls as plain calls (the async ones run to the end on one event loop)."""

    def __init__(self, kind: str, config: MemoryConfig, engine: Any) -> None:
        self._runner = asyncio.Runner() if kind == "async" else None
        cls = AsyncMemoryClient if kind == "async" else MemoryClient
        self.client: Any = cls(config, engine=engine, embedder=HashEmbedder())

    def _run(self, result: Any) -> Any:
        return result if self._runner is None else self._runner.run(result)

    def add(self, texts: list[str], user_id: str) -> list[str]:
        messages = [{"role": "user", "content": t} for t in texts]
        added = self._run(self.client.add(messages, user_id=user_id, infer=False))
        return [r["id"] for r in added["results"]]

    def prepare_kv(self, **scope: Any) -> KVPrepareReport:
        report: KVPrepareReport = self._run(self.client.prepare_kv(**scope))
        return report

    def record(self, memory_id: str) -> MemoryRecord:
        record = self.client.db.get(memory_id)
        assert record is not None
        return record

    def close(self) -> None:
        self._run(self.client.close())
        if self._runner is not None:
            self._runner.close()


def _assert_stored_fresh(client: Client, engine: Any, memory_ids: list[str]) -> None:
    """Every encoding of each memory is in the store and equals, bit for bit, what the engine encodes for it now:
    after its context turns, and after the system prefix alone (``kv.first_memory_context_free``)."""
    fact_kv = client.client.derived.fact_kv
    for memory_id in memory_ids:
        record = client.record(memory_id)
        for encoding in (IN_CONTEXT, CONTEXT_FREE):
            stored = fact_kv.store.get(fact_kv.key(record, encoding))
            assert stored is not None, (record.text, encoding)
            if encoding.context_free:
                request = context_free_request(engine, record.text)
            else:
                request = fact_kv.encode_request(record)
            (fresh,) = engine.encode_facts([request])
            assert torch.equal(stored.keys, fresh.keys) and torch.equal(stored.values, fresh.values)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_prepare_kv_encodes_a_scope_then_the_rest_then_nothing(
    kind: str, tmp_path: Path, db_url: str, engine: Any
) -> None:
    client = Client(kind, _config(tmp_path, db_url), engine)
    try:
        maya, bob = client.add(MAYA, "maya"), client.add(BOB, "bob")
        derived = client.client.derived
        assert derived.missing_kv([*maya, *bob]) == [*maya, *bob]  # lazy: nothing encoded on add

        assert client.prepare_kv(user_id="maya") == KVPrepareReport(memories=3, encoded=3, left=())
        _assert_stored_fresh(client, engine, maya)
        assert derived.missing_kv([*maya, *bob]) == bob  # another user's memories are not touched

        assert client.prepare_kv() == KVPrepareReport(memories=5, encoded=2, left=())
        _assert_stored_fresh(client, engine, bob)
        assert client.prepare_kv() == KVPrepareReport(memories=5, encoded=0, left=())
    finally:
        client.close()


def test_pages_and_batches_smaller_than_the_database_give_the_same_report_and_store(
    tmp_path: Path, db_url: str, engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five memories checked two at a time (pages of 2, the last of 1) and encoded one at a time."""
    monkeypatch.setattr(kv_prepare, "PAGE_SIZE", 2)
    client = Client("sync", _config(tmp_path, db_url, encode_batch_size=1), engine)
    try:
        ids = client.add(MAYA, "maya") + client.add(BOB, "bob")
        assert client.prepare_kv() == KVPrepareReport(memories=5, encoded=5, left=())
        _assert_stored_fresh(client, engine, ids)
    finally:
        client.close()


def test_a_memory_deleted_while_prepare_kv_runs_is_skipped_and_not_counted(
    tmp_path: Path, db_url: str, engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race a tester's review named: a memory deleted after its batch was read and before its K/V rows are
    written (an async client commits outside the client's lock) made the whole call fail with
    ``MemoryNotFoundError``, and a deleted memory was counted as encoded."""
    client = Client("sync", _config(tmp_path, db_url), engine)
    try:
        ids = client.add(MAYA, "maya")
        fact_kv = client.client.derived.fact_kv
        put_one = fact_kv._put_one
        deleted: list[str] = []

        def put_after_a_delete(record: Any, key: Any, fact: Any) -> Any:
            if not deleted:
                deleted.append(ids[1])
                client.client.db.delete(ids[1])  # straight to SQL, as another writer commits
            return put_one(record, key, fact)

        monkeypatch.setattr(fact_kv, "_put_one", put_after_a_delete)
        assert client.prepare_kv() == KVPrepareReport(memories=3, encoded=2, left=())
        assert deleted == [ids[1]] and client.client.db.get(ids[1]) is None
        _assert_stored_fresh(client, engine, [ids[0], ids[2]])
    finally:
        client.close()


def test_prepare_kv_after_a_settings_change_encodes_every_memory_under_its_new_key(
    tmp_path: Path, db_url: str, engine: Any
) -> None:
    client = Client("sync", _config(tmp_path, db_url), engine)
    try:
        ids = client.add(MAYA, "maya")
        assert client.prepare_kv().encoded == 3
    finally:
        client.close()
    client = Client("sync", _config(tmp_path, db_url, storage_format="int8"), engine)
    try:
        assert client.client.derived.missing_kv(ids) == ids  # the int8 keys are new
        assert client.prepare_kv(user_id="maya") == KVPrepareReport(memories=3, encoded=3, left=())
        assert client.client.derived.missing_kv(ids) == []
    finally:
        client.close()


def test_a_memory_that_no_longer_fits_at_a_far_bucket_gets_its_context_free_encoding(
    tmp_path: Path, db_url: str, engine: Any
) -> None:
    """It was reported as left without K/V, and every chat left it out; chats serve it from its context-free
    encoding now, so that is what prepare_kv stores (one too long even so is reported: tests/api/
    test_add_span_check.py)."""
    from inferscale.fact_kv import CONTEXT_FREE

    long_text = "A long memory that no bucket near the end of the context can hold. " * 2
    client = Client("sync", _config(tmp_path, db_url), engine)
    try:
        ids = client.add([MAYA[0], long_text, MAYA[1]], "maya")
    finally:
        client.close()
    # a bucket 1900 tokens from the prefix: the short facts still fit there (2048 positions), the long one not
    client = Client("sync", _config(tmp_path, db_url, position_buckets=(0, 1900)), engine)
    try:
        report = client.prepare_kv(user_id="maya")
        assert report == KVPrepareReport(memories=3, encoded=3, left=())
        assert client.client.derived.missing_kv(ids) == []
        fact_kv = client.client.derived.fact_kv
        long_record = client.client.db.get_many([ids[1]])[ids[1]]
        assert fact_kv.fit(long_record) == "alone"
        keys = [row.encoding_key for row in client.client.db.all_kv_entries() if row.memory_id == ids[1]]
        assert set(keys) == {fact_kv.encoding_key(long_record, CONTEXT_FREE)}
    finally:
        client.close()


def test_a_bad_scope_id_is_refused_before_anything_is_encoded(tmp_path: Path, engine: Any) -> None:
    client = MemoryClient(_config(tmp_path, None), engine=engine, embedder=HashEmbedder())
    with client, pytest.raises(ScopeError, match="user_id"):
        client.prepare_kv(user_id="")


def test_a_model_that_cannot_be_loaded_is_refused_on_an_empty_store_too(tmp_path: Path) -> None:
    """A tester's report: on a store with nothing to encode, a misspelt ``--model`` reported success."""
    config = MemoryConfig(data_dir=str(tmp_path), engine=EngineConfig(model=str(tmp_path / "no-such-model")))
    with MemoryClient(config, embedder=HashEmbedder()) as client, pytest.raises(ModelNotAvailableError, match="model"):
        client.prepare_kv()


@pytest.mark.parametrize("folder", ["empty", "bad-config"])
def test_a_model_folder_holding_no_model_is_a_config_error(tmp_path: Path, engine: Any, folder: str) -> None:
    """An empty folder, or one whose config.json is not JSON, raised transformers' bare ValueError or OSError from
    every add, chat and prepare_kv, no InferScale error (tester report); the store's memories stay readable."""
    with MemoryClient(_config(tmp_path, None), engine=engine, embedder=HashEmbedder()) as client:
        client.add("I like tea.", user_id="u", infer=False)
    model = tmp_path / folder
    model.mkdir()
    if folder == "bad-config":
        (model / "config.json").write_text("{not json")
    config = _config(tmp_path, None).model_copy(update={"engine": EngineConfig(model=str(model))})
    with MemoryClient(config, embedder=HashEmbedder()) as client:
        for call in (
            lambda: client.add("I like coffee.", user_id="u", infer=False),
            client.prepare_kv,
            lambda: client.chat("What do I like?", user_id="u", max_new_tokens=2),
        ):
            with pytest.raises(ConfigError, match=r"engine.model '.*' holds no model that can be loaded"):
                call()
        assert [r["memory"] for r in client.get_all(user_id="u")["results"]] == ["I like tea."]
