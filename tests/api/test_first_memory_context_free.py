"""``kv.first_memory_context_free``: the memory segment's first memory is served from its context-free encoding (right
after the system prefix, no context turns), the K/V prompt mode computes for its first pasted line; every other
memory from its context-window encoding. On every client and both databases, on a tiny float32 model (real math)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from client_adapter import ClientAdapter, ClientKind, open_client
from mem0_fakes import HashEmbedder
from tiny_models import tiny_engine

from inferscale import MemoryConfig
from inferscale.config import EngineConfig, KVConfig
from inferscale.engines.transformers import TransformersEngine
from inferscale.fact_kv import CONTEXT_FREE, IN_CONTEXT, FactKVManager
from inferscale.kv.encode import EncodeRequest
from inferscale.kv.fact import FactKV
from inferscale.storage import MemoryRecord

MESSAGES = [
    {"role": "user", "content": "I live in Porto."},
    {"role": "assistant", "content": "Porto is lovely."},
    {"role": "user", "content": "My dog is a beagle named Biscuit."},
    {"role": "user", "content": "My sister Clara is a teacher in Madrid."},
]
QUESTION = "What is my dog called?"
EXACT = 1e-4
"""Largest logit difference that counts as the same K/V in float32 (the plain-prefill reference's tolerance)."""


@pytest.fixture(scope="module")
def engine() -> Any:
    return tiny_engine("llama")


def _config(tmp_path: Path, db_url: str, **kv: Any) -> MemoryConfig:
    settings = {"context_window": 2, "first_memory_context_free": True, "encode_on_add": "eager", **kv}
    return MemoryConfig(data_dir=str(tmp_path), db_url=db_url, kv=KVConfig(**settings))


@pytest.fixture
def c(tmp_path: Path, db_url: str, client_kind: ClientKind, engine: Any) -> Iterator[ClientAdapter]:
    client = open_client(client_kind, _config(tmp_path, db_url), engine=engine, embedder=HashEmbedder())
    client.add(MESSAGES, user_id="alice", infer=False)
    yield client
    client.close()


def _records(c: ClientAdapter) -> list[MemoryRecord]:
    """alice's memories, oldest first (the first has no turn before it, every later one has)."""
    by_text = {r["memory"]: r["id"] for r in c.get_all(user_id="alice")["results"]}
    records = [c.db.get(by_text[m["content"]]) for m in MESSAGES]
    assert all(r is not None for r in records)
    return [r for r in records if r is not None]


def _fresh(engine: Any, record: MemoryRecord, turns: list[str]) -> FactKV:
    """``record``'s K/V encoded now, by hand, after the system prefix and ``turns``."""
    context = engine.system_prefix_ids() + (engine.context_token_ids(turns) if turns else [])
    return engine.encode_facts([EncodeRequest(engine.fact_token_ids(record.text), context)])[0]


def _max_gap(a: FactKV, b: FactKV) -> float:
    return max(float((a.keys - b.keys).abs().max()), float((a.values - b.values).abs().max()))


def test_one_memory_with_context_turns_is_served_exactly_as_prompt_mode_pastes_it(c: ClientAdapter) -> None:
    last = _records(c)[-1]
    assert last.context  # it was added after three turns
    engine = c.engine
    prompt = engine.first_token_logits(QUESTION, None, [engine.fact_token_ids(last.text)])
    (served,) = c.fact_kv.ensure([last])
    assert float((engine.first_token_logits(QUESTION, [served]) - prompt).abs().max()) < EXACT
    # the control: its context-window encoding (after two turns) is not prompt mode's first line
    in_context = c.fact_kv.store.get(c.fact_kv.key(last, IN_CONTEXT))
    assert in_context is not None
    assert float((engine.first_token_logits(QUESTION, [in_context]) - prompt).abs().max()) > 100 * EXACT
    # the product path: the same greedy answer as pasting it
    kv = c.chat(QUESTION, user_id="alice", memory_ids=[last.id], mode="kv", max_new_tokens=8)
    pasted = c.chat(QUESTION, user_id="alice", memory_ids=[last.id], mode="prompt", max_new_tokens=8)
    assert kv.answer == pasted.answer


def test_add_stores_both_encodings_of_a_memory_with_turns_and_one_of_a_memory_without(c: ClientAdapter) -> None:
    records = _records(c)
    engine = c.engine
    for record in records:
        rows = [e for e in c.db.all_kv_entries() if e.memory_id == record.id]
        turns = record.context[-2:]
        expected = {c.fact_kv.key(record, IN_CONTEXT).encoding_key, c.fact_kv.key(record, CONTEXT_FREE).encoding_key}
        assert {row.encoding_key for row in rows} == expected
        assert len(rows) == (2 if turns else 1)
        free = c.fact_kv.store.get(c.fact_kv.key(record, CONTEXT_FREE))
        assert free is not None and _max_gap(free, _fresh(engine, record, [])) < 1e-5
        in_context = c.fact_kv.store.get(c.fact_kv.key(record, IN_CONTEXT))
        assert in_context is not None and _max_gap(in_context, _fresh(engine, record, turns)) < 1e-5
    assert c.fact_kv.key(records[1], CONTEXT_FREE).encoding_key.startswith("v3;w=0;prefix=system;gap=0;")


def test_only_the_first_slot_is_served_context_free_whatever_memory_stands_there(c: ClientAdapter) -> None:
    records = _records(c)
    prefix = len(c.engine.system_prefix_ids())
    for order in (records[1:], records[::-1]):
        served = c.fact_kv.ensure(order)
        expected = [prefix] + [prefix + len(c.engine.context_token_ids(r.context[-2:])) for r in order[1:]]
        assert [f.encoded_at for f in served] == expected
        assert torch.equal(served[0].keys, c.fact_kv.store.get(c.fact_kv.key(order[0], CONTEXT_FREE)).keys)  # type: ignore[union-attr]


def test_the_background_encoder_stores_every_encoding_before_a_chat_needs_one(
    tmp_path: Path, db_url: str, client_kind: ClientKind, engine: Any
) -> None:
    config = _config(tmp_path, db_url, encode_on_add="background")
    client = open_client(client_kind, config, engine=engine, embedder=HashEmbedder())
    try:
        client.add(MESSAGES, user_id="alice", infer=False)
        assert client.wait_for_encoding(timeout=60)
        records = _records(client)
        wanted = client.fact_kv.every_encoding(records)
        assert len(wanted) == 2 * len(records) - 1  # the first memory's one encoding serves both
        assert client.fact_kv.missing(wanted) == []
    finally:
        client.close()


def test_a_chained_memory_is_served_first_from_its_prefix_alone(
    tmp_path: Path, db_url: str, client_kind: ClientKind, engine: Any
) -> None:
    config = _config(tmp_path, db_url, chain_block=3)
    client = open_client(client_kind, config, engine=engine, embedder=HashEmbedder())
    try:
        client.add(MESSAGES, user_id="alice", infer=False)
        records = _records(client)
        chained = records[1]
        assert client.fact_kv.chained(chained)
        served = client.fact_kv.ensure([chained, records[0]])
        assert _max_gap(served[0], _fresh(client.engine, chained, [])) < 1e-5
        # its in-context encoding is the chained one, on its block's stored K/V
        stored = client.fact_kv.store.get(client.fact_kv.key(chained, IN_CONTEXT))
        assert stored is not None and stored.encoded_at > served[0].encoded_at
    finally:
        client.close()


def test_the_context_free_key_follows_what_its_kv_depend_on_and_nothing_else(engine: Any) -> None:
    """The context-free encoding's K/V depend on the model, the system prefix, the text and the storage format, not on
    the memory's turns, w or position buckets: its key changes with the first and not with the second."""

    def key(kv: KVConfig, record: MemoryRecord, on: Any = engine) -> str:
        manager = FactKVManager(on, cast(Any, None), cast(Any, None), kv)
        return str(manager.key(record, CONTEXT_FREE))

    now = datetime.now(UTC)
    record = MemoryRecord(
        id="m1",
        vector_id=1,
        text="My dog is a beagle.",
        hash="a" * 64,
        user_id="alice",
        agent_id=None,
        run_id=None,
        metadata={},
        context=["I live in Porto.", "Porto is lovely."],
        created_at=now,
        updated_at=now,
    )
    base = KVConfig(context_window=2)
    same = key(base, record)
    assert "w=0;prefix=system;gap=0;" in same
    assert key(base, replace(record, context=["Another turn.", "And one more."])) == same
    assert key(KVConfig(context_window=1), record) == same
    assert key(KVConfig(context_window=2, position_buckets=(0, 64)), record) == same
    other_prompt = TransformersEngine(
        EngineConfig(dtype="float32", device="cpu"), "Other notes:\n", model=engine.model, tokenizer=engine.tokenizer
    )
    changed = [
        key(KVConfig(context_window=2, storage_format="int8"), record),
        key(KVConfig(context_window=2, encode_after_system_prefix=False), record),
        key(base, replace(record, hash="b" * 64)),
        key(base, record, other_prompt),
    ]
    assert all(k != same for k in changed) and len(set(changed)) == len(changed)
    # with no turns it is the in-context encoding's key (one encoding serves both)
    bare = replace(record, context=[])
    assert str(FactKVManager(engine, cast(Any, None), cast(Any, None), base).key(bare, IN_CONTEXT)) == key(base, bare)


def test_with_position_buckets_the_first_slot_is_context_free_and_the_others_at_their_buckets(
    tmp_path: Path, db_url: str, engine: Any
) -> None:
    buckets = (0, 10, 1000)
    config = _config(tmp_path, db_url, position_buckets=buckets)
    client = open_client("sync", config, engine=engine, embedder=HashEmbedder())
    try:
        client.add(MESSAGES, user_id="alice", infer=False)
        records = _records(client)
        wanted = client.fact_kv.every_encoding(records)
        # one encoding per bucket, then a context-free one for each memory with turns (the first has none)
        assert len(wanted) == 3 * len(records) + len(records) - 1
        assert client.fact_kv.missing(wanted) == []  # add stored them all (eager)
        order = records[::-1]
        served = client.fact_kv.ensure(order)
        prefix = len(client.engine.system_prefix_ids())
        assert served[0].encoded_at == prefix  # context-free, no turns, no gap
        assert _max_gap(served[0], _fresh(client.engine, order[0], [])) < 1e-5
        for fact, record in zip(served[1:], order[1:], strict=True):
            turns = len(client.engine.context_token_ids(record.context[-2:])) if record.context else 0
            assert fact.encoded_at - prefix in {max(turns, b) for b in buckets}  # at one of its buckets
    finally:
        client.close()
