"""Bounded chained contexts (``kv.chain_block``, inferscale.chains) through the real client: which memories anchor a
block and which are chained, what is stored, that a chained memory's K/V equal an independent encoding built from the
engine's lower-level calls, that a deletion re-encodes the later memories of its block as an empty store would, that
the background encoder gives the eager K/V, and that only the fact's own tokens are prefilled (issue #16).

The real :class:`TransformersEngine` on a tiny random Llama and the byte-level chat tokenizer.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mem0_fakes import HashEmbedder
from tiny_models import byte_chat_tokenizer, tiny_model

from inferscale import MemoryClient, MemoryConfig
from inferscale.chains import ChainLink, chained_on
from inferscale.config import EngineConfig, KVConfig
from inferscale.engines.transformers import TransformersEngine
from inferscale.fact_kv import IN_CONTEXT
from inferscale.kv.encode import EncodeRequest
from inferscale.kv.fact import FactKV
from inferscale.scope import Scope
from inferscale.storage import MemoryRecord

SYSTEM_PROMPT = "Memories:\n"
MESSAGES = [
    "I have a beagle named Biscuit.",
    "My sister Ana lives in Lisbon.",
    "I play chess on Sundays.",
    "Biscuit is afraid of thunder.",
    "Ana works as a nurse.",
    "I started learning the cello.",
    "My chess club meets at the library.",
]


@pytest.fixture(scope="module")
def engine() -> TransformersEngine:
    return TransformersEngine(
        EngineConfig(dtype="float32", device="cpu"),
        SYSTEM_PROMPT,
        model=tiny_model("llama", seed=0),
        tokenizer=byte_chat_tokenizer(),
    ).load()


def client(tmp_path: Path, engine: TransformersEngine, encode_on_add: str = "eager", **kv: object) -> MemoryClient:
    # One encoding per memory (kv.first_memory_context_free off): the counts below are the chain's; a chained memory
    # served first from its context-free encoding: tests/api/test_first_memory_context_free.py.
    settings = {
        "context_window": 2,
        "chain_block": 3,
        "chain_window": 2,
        "encode_on_add": encode_on_add,
        "first_memory_context_free": False,
        **kv,
    }
    config = MemoryConfig(data_dir=str(tmp_path), system_prompt=SYSTEM_PROMPT, kv=KVConfig(**settings))
    return MemoryClient(config, engine=engine, embedder=HashEmbedder())


def add_each(memory: MemoryClient, texts: list[str]) -> list[MemoryRecord]:
    """Each text added on its own (one ``add(infer=False)`` call each), as the stored records."""
    records = []
    for text in texts:
        (added,) = memory.add([{"role": "user", "content": text}], user_id="maya", infer=False)["results"]
        record = memory.db.get(added["id"])
        assert record is not None
        records.append(record)
    return records


def reference(
    engine: TransformersEngine, texts: list[str], block: int, window: int, context_window: int
) -> list[FactKV]:
    """Each text's K/V built by hand from the engine's encode calls: every ``block``-th text (from the first) encoded
    after the text of the ``context_window`` texts before it; each other one on the K/V of the last ``window`` texts
    of its block before it (the anchor among them), placed right after the system prefix."""
    prefix = engine.system_prefix_ids()
    encoded: list[FactKV] = []
    for i, text in enumerate(texts):
        ids = engine.fact_token_ids(text)
        if i % block == 0:
            turns = engine.context_token_ids(texts[max(0, i - context_window) : i]) if i else []
            request = EncodeRequest(ids, prefix + turns)
        else:
            start = max(i - i % block, i - window)
            request = EncodeRequest(ids, prefix, chained_on=encoded[start:i])
        (fact,) = engine.encode_facts([request])
        encoded.append(fact)
    return encoded


def assert_same(got: FactKV, want: FactKV, what: str) -> None:
    assert got.encoded_at == want.encoded_at, what
    torch.testing.assert_close(got.keys, want.keys, atol=1e-5, rtol=1e-5, msg=f"{what} keys")
    torch.testing.assert_close(got.values, want.values, atol=1e-5, rtol=1e-5, msg=f"{what} values")


def test_every_block_starts_with_an_anchor_and_the_rest_are_stored_chained(
    tmp_path: Path, engine: TransformersEngine
) -> None:
    with client(tmp_path, engine, encode_on_add="lazy") as memory:
        records = add_each(memory, MESSAGES)
    m = MESSAGES
    # block 3: anchors 0, 3, 6; an anchor keeps its last w=2 turns; a chained memory its anchor's turns and the block
    assert [(r.context, r.chain_from) for r in records] == [
        ([], 0),
        ([m[0]], 0),
        ([m[0], m[1]], 0),
        ([m[1], m[2]], 2),
        ([m[1], m[2], m[3]], 2),
        ([m[1], m[2], m[3], m[4]], 2),
        ([m[4], m[5]], 2),
    ]


def test_chained_memories_equal_their_independent_encoding(tmp_path: Path, engine: TransformersEngine) -> None:
    with client(tmp_path, engine, chain_block=4) as memory:
        records = add_each(memory, MESSAGES)
        got = memory.memory_kv(records)
    want = reference(engine, MESSAGES, block=4, window=2, context_window=2)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_same(g, w, f"memory {i}")
    # memory 3 is chained on memories 1 and 2 only (window 2), not on its anchor: the window is honoured
    assert not torch.allclose(got[3].keys, reference(engine, MESSAGES, block=4, window=3, context_window=2)[3].keys)


def test_a_chained_memory_prefills_only_its_own_tokens(tmp_path: Path, engine: TransformersEngine) -> None:
    with client(tmp_path, engine, chain_block=4) as memory:
        add_each(memory, MESSAGES[:2])
        before = engine._encoder.tokens_prefilled
        add_each(memory, MESSAGES[2:3])  # chained on the two before it, both stored
        prefilled = engine._encoder.tokens_prefilled - before
    assert prefilled == len(engine.fact_token_ids(MESSAGES[2]))


def test_a_deleted_memory_re_encodes_the_rest_of_its_block_as_an_empty_store_would(
    tmp_path: Path, engine: TransformersEngine
) -> None:
    with client(tmp_path / "a", engine, chain_block=4) as memory:
        records = add_each(memory, MESSAGES[:4])
        keys_before = [memory.fact_kv.key(r) for r in records]
        memory.delete(records[1].id)
        after = [memory.db.get(r.id) for r in records]
        assert after[1] is None
        kept = [r for r in after if r is not None]
        assert [(r.context, r.chain_from) for r in kept] == [
            ([], 0),
            ([MESSAGES[0]], 0),
            ([MESSAGES[0], MESSAGES[2]], 0),
        ]
        assert memory.fact_kv.key(kept[0]) == keys_before[0]  # the anchor is untouched
        assert memory.fact_kv.key(kept[1]) != keys_before[2] and memory.fact_kv.key(kept[2]) != keys_before[3]
        got = memory.memory_kv(kept)
    # the same memories, chained as they are stored now, in a fresh data directory (nothing stored before)
    fresh_texts = [MESSAGES[0], MESSAGES[2], MESSAGES[3]]
    want = reference(engine, fresh_texts, block=4, window=2, context_window=2)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_same(g, w, f"memory {i} after the deletion")


def test_the_background_encoder_stores_the_eager_k_v_prefilling_as_much(
    tmp_path: Path, engine: TransformersEngine
) -> None:
    """The background encoder takes a chained memory alone, after the calls that store its chain: nothing is
    encoded twice."""
    before = engine._encoder.tokens_prefilled
    with client(tmp_path / "eager", engine) as memory:
        eager = memory.memory_kv(add_each(memory, MESSAGES))
    eager_prefilled = engine._encoder.tokens_prefilled - before
    with client(tmp_path / "background", engine, encode_on_add="background") as memory:
        before = engine._encoder.tokens_prefilled
        records = add_each(memory, MESSAGES)
        assert memory.wait_for_encoding(timeout=120)
        assert engine._encoder.tokens_prefilled - before == eager_prefilled
        assert all(memory.fact_kv.store.contains(memory.fact_kv.key(r)) for r in records)
        before = engine._encoder.tokens_prefilled
        background = memory.memory_kv(records)
        assert engine._encoder.tokens_prefilled == before  # every one was stored by the background encoder
    for i, (b, e) in enumerate(zip(background, eager, strict=True)):
        assert_same(b, e, f"memory {i}")


def test_a_chat_encodes_a_chain_whose_memories_were_never_encoded(tmp_path: Path, engine: TransformersEngine) -> None:
    """Lazy encoding: the first use of the last memory encodes its chain first (in order), and stores all of it."""
    with client(tmp_path, engine, encode_on_add="lazy", chain_block=4) as memory:
        records = add_each(memory, MESSAGES[:4])
        (last,) = memory.memory_kv(records[3:])
        assert all(memory.fact_kv.store.contains(memory.fact_kv.key(r)) for r in records[1:])
    want = reference(engine, MESSAGES[:4], block=4, window=2, context_window=2)
    assert_same(last, want[3], "the last memory")


def test_a_client_without_chains_encodes_stored_chains_as_text(tmp_path: Path, engine: TransformersEngine) -> None:
    with client(tmp_path, engine, encode_on_add="lazy") as memory:
        records = add_each(memory, MESSAGES[:3])
    config = MemoryConfig(
        data_dir=str(tmp_path), system_prompt=SYSTEM_PROMPT, kv=KVConfig(context_window=2, encode_on_add="lazy")
    )
    with MemoryClient(config, engine=engine, embedder=HashEmbedder()) as memory:
        got = memory.memory_kv(records)
    prefix = engine.system_prefix_ids()
    for i, (record, fact) in enumerate(zip(records, got, strict=True)):
        turns = engine.context_token_ids(record.context[-2:]) if record.context else []
        (want,) = engine.encode_facts([EncodeRequest(engine.fact_token_ids(record.text), prefix + turns)])
        assert_same(fact, want, f"memory {i}")


def test_a_chain_is_found_in_its_own_scope_only(tmp_path: Path, engine: TransformersEngine) -> None:
    """Two users store the same texts in the same order: a chain's memories are looked up in exactly the chained
    memory's scope, so the K/V it encodes first are stored under its own user's memories, never the other's."""
    with client(tmp_path, engine, encode_on_add="lazy", chain_block=4) as memory:
        maya = add_each(memory, MESSAGES[:3])
        memory.memory_kv(maya)  # maya's chain, encoded and stored first
        noor = []
        for text in MESSAGES[:3]:
            (added,) = memory.add([{"role": "user", "content": text}], user_id="noor", infer=False)["results"]
            noor.append(memory.db.get(added["id"]))
        assert [(r.context, r.chain_from) for r in noor] == [(r.context, r.chain_from) for r in maya]
        memory.memory_kv([noor[2]])
        assert memory.fact_kv.store.contains(memory.fact_kv.key(noor[1]))  # its chain, under noor's memory
        assert memory.fact_kv.store.contains(memory.fact_kv.key(noor[0]))
        memory.delete_all(user_id="maya")
        assert all(not memory.fact_kv.store.contains(memory.fact_kv.key(r)) for r in maya)
        assert all(memory.fact_kv.store.contains(memory.fact_kv.key(r)) for r in noor)


def test_one_add_of_many_messages_chains_as_single_adds_do_when_turns_are_cut(tmp_path: Path) -> None:
    """With a 200-token model, an anchor's two 75-character turns do not fit: it keeps one, and the messages after
    it in the same call are chained anew from it as stored, so no memory is chained on a chain no stored memory
    holds (found by a review: they kept the plan made before the fitting, and every chat retrieving them failed)."""
    small = TransformersEngine(
        EngineConfig(dtype="float32", device="cpu"),
        SYSTEM_PROMPT,
        model=tiny_model("llama", seed=0, max_position_embeddings=200),
        tokenizer=byte_chat_tokenizer(),
    ).load()
    long = [f"L{i:02d} " + "x" * 70 for i in range(7)]
    stored = {}
    for how in ("one call", "single adds"):
        with client(tmp_path / how, small, encode_on_add="lazy", chain_block=4) as memory:
            if how == "one call":
                memory.add([{"role": "user", "content": t} for t in long], user_id="maya", infer=False)
                records = sorted(memory.db.list(Scope(user_id="maya")), key=lambda r: r.vector_id)
            else:
                records = add_each(memory, long)
            links = {ChainLink.of(r) for r in records}
            for record in records:
                assert all(link in links for link in chained_on(ChainLink.of(record), 2)), record.text
            facts = memory.memory_kv(records)
            assert max(f.encoded_at + f.n_tokens for f in facts) <= 200
            stored[how] = [(r.context, r.chain_from) for r in records]
    assert stored["one call"] == stored["single adds"]
    assert any(chain_from is not None and chain_from < len(context) for context, chain_from in stored["one call"])


def test_the_background_encoder_puts_a_chain_never_encoded_ahead_of_its_memory(
    tmp_path: Path, engine: TransformersEngine
) -> None:
    """Queued alone (its chain added lazily, never encoded), the last memory of a block gets its chain's stored
    memories encoded first, each once and in order, each as its own pass outside the request of the memory."""
    with client(tmp_path, engine, encode_on_add="lazy", chain_block=4) as memory:
        records = add_each(memory, MESSAGES[:4])
        ahead = memory.fact_kv.chain_first([(records[3], IN_CONTEXT)])
        assert [r.id for r, _ in ahead] == [r.id for r in records]  # anchor, then each after its own chain
        before = engine._encoder.tokens_prefilled
        memory.derived.encode_queued([records[3].id])
        assert all(memory.fact_kv.store.contains(memory.fact_kv.key(r)) for r in records)
        assert engine._encoder.tokens_prefilled - before == sum(len(engine.fact_token_ids(t)) for t in MESSAGES[:4])
        got = memory.memory_kv(records)
    for i, (g, w) in enumerate(
        zip(got, reference(engine, MESSAGES[:4], block=4, window=2, context_window=2), strict=True)
    ):
        assert_same(g, w, f"memory {i}")


def small_engine() -> TransformersEngine:
    """The tiny Llama with a 200-token context: a chain of two 75-character memories does not fit it."""
    return TransformersEngine(
        EngineConfig(dtype="float32", device="cpu"),
        SYSTEM_PROMPT,
        model=tiny_model("llama", seed=0, max_position_embeddings=200),
        tokenizer=byte_chat_tokenizer(),
    ).load()


def test_a_chain_a_deletion_makes_too_long_is_encoded_as_an_anchor_as_a_fresh_store_would(tmp_path: Path) -> None:
    """Deleting a short memory slides a long one into a chained memory's window, and the chain no longer fits the
    model: that memory is encoded after the last of its turns that fit instead (found by a bug hunt: every chat
    retrieving the memories after it failed with InvalidInputError)."""
    small = small_engine()
    long_one, long_two = "L" + "l" * 110, "M" + "m" * 80
    texts = ["anchor", long_one, "short one", long_two, "short two"]
    settings = {"context_window": 1, "chain_window": 1, "chain_block": 8, "encode_on_add": "lazy"}
    with client(tmp_path / "a", small, **settings) as memory:
        records = add_each(memory, texts)
        memory.delete(records[2].id)
        kept = [memory.db.get(r.id) for r in (records[0], records[1], records[3], records[4])]
        assert all(r is not None for r in kept)
        (_, _, second, last) = [r for r in kept if r is not None]
        assert ChainLink.of(second) == ChainLink(long_two, ("anchor", long_one), 0)
        assert memory.fact_kv.encode_request(second).span > 200  # as text; its chain does not fit either
        got = memory.memory_kv([second, last])
    with client(tmp_path / "fresh", small, **settings) as memory:  # the same memories, never deleted from
        fresh = add_each(memory, [t for t in texts if t != "short one"])
        assert [(r.context, r.chain_from) for r in fresh[2:]] == [(second.context, 0), (last.context, 0)]
        want = memory.memory_kv(fresh[2:])
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_same(g, w, f"memory {i}")
    assert got[0].encoded_at == len(small.system_prefix_ids())  # alone: not on its chain, and no turn fits


def test_a_chain_member_deleted_while_a_chat_encodes_it_still_serves_that_chat(
    tmp_path: Path, engine: TransformersEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another client deletes a memory of the chain between its encoding and its storing: the chat that needed it
    gets its answer, not the other memory's MemoryNotFoundError (found by a bug hunt)."""
    with client(tmp_path, engine, encode_on_add="lazy", chain_block=4) as memory, client(tmp_path, engine) as other:
        records = add_each(memory, MESSAGES[:4])
        fact_kv = memory.fact_kv
        encode = fact_kv.encode
        deleted: list[str] = []

        def encode_then_delete(requests: list[EncodeRequest]) -> list[FactKV]:
            out = encode(requests)
            if not deleted:
                deleted.append(records[1].id)
                other.delete(records[1].id)
            return out

        monkeypatch.setattr(fact_kv, "encode", encode_then_delete)
        (last,) = memory.memory_kv(records[3:])
    assert deleted == [records[1].id]
    assert_same(last, reference(engine, MESSAGES[:4], block=4, window=2, context_window=2)[3], "the last memory")
