"""Every memory ``add`` writes fits the model's context once encoded (system prefix + its last w turns + the fact, at
every position bucket), settled before anything is written, in every ``kv.encode_on_add`` mode, on every client: a fact
too long after the system prefix alone is refused with the ``InvalidInputError`` the encoder gives (a batch with one
stores none of it), and a fact that fits only after fewer context turns keeps the last turns that fit. ``update``
refuses a new text too long after its memory's turns. Measuring loads the tokenizer and config alone, never the
weights. A memory stored before that no longer fits after its turns (here: under w = 0, then served with w = 5) is
served from its context-free encoding; one that cannot be encoded at all (stored under a longer context) is left out
of a retrieving ``chat`` rather than failing it, refused when named in ``memory_ids``, and skipped by the background
encoder.

On a tiny float32 model with a byte-level tokenizer (every UTF-8 byte one token) and a 128-token context, so spans
are counted exactly and the texts stay short."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from client_adapter import ClientAdapter, ClientKind, open_client
from mem0_fakes import HashEmbedder
from tiny_models import byte_chat_tokenizer, tiny_model

from inferscale import ContextLengthError, InvalidInputError, MemoryClient, MemoryConfig
from inferscale.config import EngineConfig, KVConfig
from inferscale.encode_queue import THREAD_NAME
from inferscale.engines.transformers import TransformersEngine
from inferscale.fact_kv import CONTEXT_FREE

CONTEXT = 128
"""The tiny model's context window (tokens)."""

SYSTEM_PROMPT = "Memories:\n"
FIRST = "I like tea."
TOO_LONG = "Refused: a fact that fits the context alone but not after its context turns."


def _tiny_engine() -> TransformersEngine:
    return TransformersEngine(
        EngineConfig(dtype="float32", device="cpu"),
        SYSTEM_PROMPT,
        model=tiny_model("llama", max_position_embeddings=CONTEXT),
        tokenizer=byte_chat_tokenizer(),
    )


@pytest.fixture(scope="module")
def engine() -> TransformersEngine:
    return _tiny_engine().load()


def _fact(engine: Any, spare: int) -> str:
    """A fact whose line leaves ``spare`` tokens of the context after the system prefix (negative: too long)."""
    room = CONTEXT - len(engine.system_prefix_ids()) - len(engine.fact_token_ids("")) - spare
    return (TOO_LONG + " " + "x" * room)[:room]


def _long_fact(engine: Any) -> str:
    """A fact whose line fits the context after the system prefix (5 tokens to spare), but not after ``FIRST``."""
    assert len(engine.context_token_ids([FIRST])) > 5
    return _fact(engine, spare=5)


def _config(tmp_path: Path, db_url: str | None, **kv: Any) -> MemoryConfig:
    return MemoryConfig(data_dir=str(tmp_path), db_url=db_url, system_prompt=SYSTEM_PROMPT, kv=KVConfig(**kv))


def _client(kind: ClientKind, config: MemoryConfig, engine: Any = None) -> ClientAdapter:
    if kind in ("remote", "remote-async"):
        pytest.importorskip("fastapi", reason="the server needs FastAPI (pip install 'inferscale-memory[server]')")
    return open_client(kind, config, engine=engine, embedder=HashEmbedder())


@pytest.fixture
def clients() -> Iterator[list[ClientAdapter]]:
    opened: list[ClientAdapter] = []
    yield opened
    for client in opened:
        client.close()


@pytest.mark.parametrize("mode", ["background", "lazy", "eager"])
@pytest.mark.parametrize("kind", ["sync", "async", "remote", "remote-async"])
def test_add_refuses_a_fact_too_long_after_the_system_prefix_alone_and_stores_nothing(
    kind: ClientKind,
    mode: str,
    engine: TransformersEngine,
    tmp_path: Path,
    db_url: str,
    row_counts: Callable[[], tuple[int, int]],
    clients: list[ClientAdapter],
) -> None:
    client = _client(kind, _config(tmp_path, db_url, encode_on_add=mode), engine)
    clients.append(client)
    client.add("My dog is Rex.", user_id="maya", infer=False)
    client.wait_for_encoding()
    before = row_counts()
    batch = [{"role": "user", "content": FIRST}, {"role": "user", "content": _fact(engine, spare=-3)}]
    with pytest.raises(
        InvalidInputError, match=rf"needs positions up to \d+ .* the model's context is {CONTEXT} tokens"
    ):
        client.add(batch, user_id="maya", infer=False)
    assert row_counts() == before  # not even the batch's first, fitting message
    assert [m["memory"] for m in client.get_all(user_id="maya")["results"]] == ["My dog is Rex."]


def test_a_position_bucket_past_the_context_is_named_in_the_refusal(
    engine: TransformersEngine, tmp_path: Path, clients: list[ClientAdapter]
) -> None:
    """A tester's find: with ``kv.position_buckets=[0, 9000]`` every add of a short fact was refused as needing
    positions past the model's context, advising to shorten the fact; the bucket is what to change."""
    client = _client("sync", _config(tmp_path, None, encode_on_add="eager", position_buckets=(0, CONTEXT)), engine)
    clients.append(client)
    with pytest.raises(InvalidInputError, match=rf"or lower kv.position_buckets \(.* a gap of {CONTEXT} positions\)$"):
        client.add("My cat is called Pixel.", user_id="maya", infer=False)
    assert client.get_all(user_id="maya")["results"] == []


@pytest.mark.parametrize("kind", ["sync", "async", "remote"])
def test_update_refuses_a_text_too_long_with_the_memorys_context_turns(
    kind: ClientKind, engine: TransformersEngine, tmp_path: Path, clients: list[ClientAdapter]
) -> None:
    client = _client(kind, _config(tmp_path, None, encode_on_add="lazy"), engine)
    clients.append(client)
    client.add(FIRST, user_id="maya", infer=False)
    memory_id = client.add("My dog is Rex.", user_id="maya", infer=False)["results"][0]["id"]
    with pytest.raises(InvalidInputError, match=rf"of memory '{memory_id}' needs positions up to"):
        client.update(memory_id, text=_long_fact(engine))
    stored = client.get(memory_id)
    assert stored is not None and stored["memory"] == "My dog is Rex."
    assert len(client.history(memory_id)) == 1


@pytest.mark.parametrize("kind", ["sync", "async", "remote"])
def test_a_fact_that_fits_only_after_fewer_context_turns_keeps_the_last_turns_that_fit(
    kind: ClientKind, engine: TransformersEngine, tmp_path: Path, clients: list[ClientAdapter]
) -> None:
    """Its span counts its context turns: after ``FIRST`` and ``"Hi."`` it does not fit, after ``"Hi."`` alone it
    does. It is stored with that turn only, and eager encoding (which checks the span again) encodes it."""
    client = _client(kind, _config(tmp_path, None, encode_on_add="eager"), engine)
    clients.append(client)
    short = len(engine.context_token_ids(["Hi."]))
    assert short < 10 < short + len(engine.context_token_ids([FIRST]))
    batch = [FIRST, "Hi.", _fact(engine, spare=10)]
    added = client.add([{"role": "user", "content": text} for text in batch], user_id="maya", infer=False)
    records = [client.db.get(r["id"]) for r in added["results"]]
    assert [list(r.context) if r else None for r in records] == [[], [FIRST], ["Hi."]]
    assert all(client.fact_kv.store.contains(client.fact_kv.key(r)) for r in records if r)  # encoded eagerly


# ---- no model load in add ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model and its tokenizer saved as a model folder, for an engine that loads from files."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    tiny_model("llama", max_position_embeddings=CONTEXT).save_pretrained(folder)
    byte_chat_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads that ran ``TransformersEngine.load`` on an engine that was not loaded yet."""
    seen: list[str] = []
    load = TransformersEngine.load

    def recording(self: TransformersEngine) -> TransformersEngine:
        if not self._ready:
            seen.append(threading.current_thread().name)
        return load(self)

    monkeypatch.setattr(TransformersEngine, "load", recording)
    return seen


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_background_add_measures_with_the_tokenizer_alone_and_loads_no_weights(
    kind: ClientKind,
    engine: TransformersEngine,
    model_folder: Path,
    loads: list[str],
    tmp_path: Path,
    clients: list[ClientAdapter],
) -> None:
    config = _config(tmp_path, None, encode_on_add="background").model_copy(
        update={"engine": EngineConfig(model=str(model_folder), dtype="float32", device="cpu")}
    )
    client = _client(kind, config)  # the client builds its engine from the folder
    clients.append(client)
    client.add(FIRST, user_id="maya", infer=False)
    with pytest.raises(InvalidInputError, match=f"the model's context is {CONTEXT} tokens"):
        client.add(_fact(engine, spare=-3), user_id="maya", infer=False)
    assert [name for name in loads if name != THREAD_NAME] == []  # only the background encoder loads the model
    assert client.wait_for_encoding(timeout=60)
    assert loads == [THREAD_NAME]
    assert [m["memory"] for m in client.get_all(user_id="maya")["results"]] == [FIRST]


def test_a_lazy_add_loads_no_model_at_all(
    model_folder: Path, loads: list[str], tmp_path: Path, clients: list[ClientAdapter]
) -> None:
    config = _config(tmp_path, None, encode_on_add="lazy").model_copy(
        update={"engine": EngineConfig(model=str(model_folder), dtype="float32", device="cpu")}
    )
    client = _client("sync", config)
    clients.append(client)
    client.add(FIRST, user_id="maya", infer=False)
    assert loads == []
    assert client.chat("tea?", user_id="maya", max_new_tokens=1).memory_ids  # the layout the chat uses agrees


# ---- a too-long memory stored before: chat and the encoder go on ---------------------------------------------


FILLERS = [
    "Filler one: I drink green tea.",
    "Filler two: my car is blue now.",
    "Filler three: I swim on Mondays.",
    "Filler four: my cat is called Tom.",
]
ZEBRA = "Zebra: mine is named Stripe."
"""Stored after ``FILLERS`` in one ``add``: it fits after the system prefix alone, but not after them (w = 5)."""


def _stored_before(kind: ClientKind, engine: TransformersEngine, tmp_path: Path) -> tuple[list[str], str]:
    """``FILLERS`` and ``ZEBRA`` added under w = 0 (where every memory fits), in one call: their ids."""
    prefix = len(engine.system_prefix_ids())
    assert prefix + len(engine.context_token_ids(FILLERS)) + len(engine.fact_token_ids(ZEBRA)) > CONTEXT
    assert prefix + len(engine.fact_token_ids(FILLERS[0])) + len(engine.fact_token_ids(ZEBRA)) < CONTEXT - 30
    with contextlib.closing(
        _client(kind, _config(tmp_path, None, encode_on_add="lazy", context_window=0), engine)
    ) as c:
        batch = [{"role": "user", "content": text} for text in [*FILLERS, ZEBRA]]
        *fillers, zebra = [r["id"] for r in c.add(batch, user_id="maya", infer=False)["results"]]
    return fillers, zebra


@pytest.mark.parametrize("kind", ["sync", "async", "remote"])
def test_chat_serves_a_stored_memory_that_fits_only_without_its_turns_from_its_context_free_encoding(
    kind: ClientKind,
    engine: TransformersEngine,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    clients: list[ClientAdapter],
) -> None:
    """Stored under w = 0, where it fits; served with w = 5 its encoding after its turns needs more than the
    context. Every chat that retrieved it failed, then left it out (a user who moved to vLLM's shorter
    ``max_model_len`` lost the memory from every answer while search still found it); it is served from its
    encoding after the system prefix alone, which depends on no turn, and a warning names it once."""
    fillers, zebra = _stored_before(kind, engine, tmp_path)
    client = _client(kind, _config(tmp_path, None, encode_on_add="background", context_window=5), engine)
    clients.append(client)
    with caplog.at_level(logging.WARNING, logger="inferscale.fact_kv"):
        for mode in ("kv", "prompt", "kv"):
            result = client.chat("zebra?", user_id="maya", limit=1, max_new_tokens=1, mode=mode)
            assert result.memory_ids == [zebra]
        named = client.chat("tea?", user_id="maya", memory_ids=[fillers[0], zebra], max_new_tokens=1)
        assert named.memory_ids == [fillers[0], zebra]  # laid out second: not the first memory's context-free rule
    warnings = [r.getMessage() for r in caplog.records if zebra in r.getMessage()]
    if kind == "sync":  # the others may log it in the server's or the worker's client too
        assert len(warnings) == 1, warnings
    assert "chats serve it from its encoding after the system prefix alone" in warnings[0]


def test_the_served_k_v_of_such_a_memory_equal_a_fresh_encoding_after_the_prefix_alone(
    engine: TransformersEngine, tmp_path: Path
) -> None:
    """Laid out second, its K/V are a plain encoding of its line right after the system prefix, to the bit."""
    import torch

    from inferscale.kv.encode import EncodeRequest

    fillers, zebra = _stored_before("sync", engine, tmp_path)
    with MemoryClient(_config(tmp_path, None, context_window=5), engine=engine, embedder=HashEmbedder()) as client:
        found = client.db.get_many([fillers[0], zebra])
        fact_kv = client.derived.fact_kv
        assert (fact_kv.fit(found[fillers[0]]), fact_kv.fit(found[zebra])) == ("context", "alone")
        served = client.derived.memory_kv([found[fillers[0]], found[zebra]])
        (fresh,) = fact_kv.encode([EncodeRequest(engine.fact_token_ids(ZEBRA), engine.system_prefix_ids())])
        torch.testing.assert_close(served[1].keys, fresh.keys, rtol=0, atol=0)
        torch.testing.assert_close(served[1].values, fresh.values, rtol=0, atol=0)


def test_a_stored_memory_too_long_even_alone_is_left_out_of_chats_and_refused_when_named(
    engine: TransformersEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture, clients: list[ClientAdapter]
) -> None:
    """Stored under a model with a longer context, it cannot be encoded at all here: chats answer with the other
    memories and name it in a warning; ``memory_ids`` naming it is refused."""
    longer = TransformersEngine(
        EngineConfig(dtype="float32", device="cpu"),
        SYSTEM_PROMPT,
        model=tiny_model("llama", max_position_embeddings=2 * CONTEXT),
        tokenizer=byte_chat_tokenizer(),
    )
    before = _client("sync", _config(tmp_path, None, encode_on_add="lazy", context_window=0), longer)
    clients.append(before)
    too_long = _fact(engine, spare=-20)
    batch = [{"role": "user", "content": FIRST}, {"role": "user", "content": too_long}]
    first_id, long_id = [r["id"] for r in before.add(batch, user_id="maya", infer=False)["results"]]
    before.close()
    client = _client("sync", _config(tmp_path, None, encode_on_add="background", context_window=0), engine)
    clients.append(client)
    with caplog.at_level(logging.WARNING, logger="inferscale.fact_kv"):
        assert client.chat("Refused fact or tea?", user_id="maya", max_new_tokens=1).memory_ids == [first_id]
    assert f"memory {long_id}" in caplog.text and "even without its context turns" in caplog.text
    with pytest.raises(InvalidInputError, match=rf"memory '{long_id}' needs positions up to"):
        client.chat("tea?", user_id="maya", memory_ids=[long_id], max_new_tokens=1)
    with pytest.raises(InvalidInputError, match=rf"memory '{long_id}' needs positions up to"):
        client.client.memory_kv([first_id, long_id])  # named the encoder's request, not the memory
    report = client.client.prepare_kv(user_id="maya")
    assert (report.encoded, report.left) == (0, (long_id,))  # FIRST was encoded by the chat; this one cannot be


def test_the_background_encoder_encodes_such_a_memory_context_free(engine: TransformersEngine, tmp_path: Path) -> None:
    """It raised ``InvalidInputError`` for the whole batch once, then skipped the memory: now it stores the one
    encoding chats serve it from."""
    fillers, zebra = _stored_before("sync", engine, tmp_path)
    with MemoryClient(_config(tmp_path, None, context_window=5), engine=engine, embedder=HashEmbedder()) as client:
        client.derived.encode_queued([fillers[0], zebra])
        record = client.db.get_many([zebra])[zebra]
        keys = [row.encoding_key for row in client.db.all_kv_entries() if row.memory_id == zebra]
        assert keys == [client.derived.fact_kv.encoding_key(record, CONTEXT_FREE)]
        assert {row.memory_id for row in client.db.all_kv_entries()} == {fillers[0], zebra}


def test_chat_measures_a_retrieved_memory_once_then_remembers_that_it_fits(
    engine: TransformersEngine, tmp_path: Path, clients: list[ClientAdapter], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fit check sits on every chat's hot path: a memory known to fit (same id, text, model, settings and
    context turns) is not tokenised again, whether the eager add or a chat measured it first; a re-worded one is."""
    from inferscale.encoding_layout import EncodingLayout

    measured: list[str] = []
    fits = EncodingLayout.fits

    def counting_fits(self: EncodingLayout, record: Any) -> bool:
        measured.append(record.id)
        return fits(self, record)

    monkeypatch.setattr(EncodingLayout, "fits", counting_fits)
    client = _client("sync", _config(tmp_path, None, encode_on_add="eager", context_window=5), engine)
    clients.append(client)
    (memory_id,) = [
        r["id"] for r in client.add([{"role": "user", "content": FIRST}], user_id="maya", infer=False)["results"]
    ]
    for _ in range(3):
        assert client.chat("tea?", user_id="maya", max_new_tokens=1).memory_ids == [memory_id]
    assert measured == [memory_id]
    client.update(memory_id, text="I like green tea.")
    assert client.chat("tea?", user_id="maya", max_new_tokens=1).memory_ids == [memory_id]
    assert measured == [memory_id, memory_id]


def test_a_chained_memory_whose_anchor_no_longer_fits_after_its_turns_is_served_context_free(
    engine: TransformersEngine, tmp_path: Path
) -> None:
    """With chains, a memory is encoded on its block's anchor, and the anchor after its own turns: stored under a
    longer context, the anchor no longer fits after them here, so the chain cannot be built. The chained memory
    measured as fitting (its chain span alone fits) and every chat naming or retrieving it failed with the encoder's
    "needs positions up to 175"; it is served from its context-free encoding, as its anchor is."""
    longer = TransformersEngine(
        EngineConfig(dtype="float32", device="cpu"),
        SYSTEM_PROMPT,
        model=tiny_model("llama", max_position_embeddings=2 * CONTEXT),
        tokenizer=byte_chat_tokenizer(),
    )
    kv = {"context_window": 5, "chain_block": 4, "encode_on_add": "lazy"}
    texts = [*FILLERS[:3], ZEBRA, "Bird: mine is Tweety.", "Cat: Tom."]
    with MemoryClient(_config(tmp_path, None, **kv), engine=longer, embedder=HashEmbedder()) as before:
        ids = [
            r["id"]
            for r in before.add([{"role": "user", "content": t} for t in texts], user_id="maya", infer=False)["results"]
        ]
    with MemoryClient(_config(tmp_path, None, **kv), engine=engine, embedder=HashEmbedder()) as client:
        records = client.db.get_many(ids)
        anchor, chained = records[ids[4]], records[ids[5]]
        assert (anchor.chain_from, chained.chain_from) == (4, 4)  # Bird anchors the second block, Cat is chained
        fact_kv = client.derived.fact_kv
        assert (fact_kv.fit(anchor), fact_kv.fit(chained)) == ("alone", "alone")
        result = client.chat("bird?", user_id="maya", memory_ids=[ids[0], ids[5]], max_new_tokens=1)
        assert result.memory_ids == [ids[0], ids[5]]
        keys = [row.encoding_key for row in client.db.all_kv_entries() if row.memory_id == ids[5]]
        assert keys == [fact_kv.encoding_key(chained, CONTEXT_FREE)]


@pytest.mark.parametrize("mode", ["kv", "prompt"])
@pytest.mark.parametrize("kind", ["sync", "async", "remote"])
def test_a_memory_that_fits_alone_but_not_with_the_chat_is_left_out_of_it(
    kind: ClientKind,
    mode: str,
    engine: TransformersEngine,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    clients: list[ClientAdapter],
) -> None:
    """``add`` stores a memory that fits after the system prefix, but the chat also needs the conversation and the
    answer budget: a helper stored "饼" * 2708 (8,136 of SmolLM2's 8,192 tokens) and every chat of the scope then
    failed, whatever its ``limit``, since the memory ranked first. It is left out of the chat, with a warning."""
    client = _client(kind, _config(tmp_path, None, encode_on_add="lazy", context_window=0), engine)
    clients.append(client)
    first_id = client.add(FIRST, user_id="maya", infer=False)["results"][0]["id"]
    long_id = client.add(_fact(engine, spare=5), user_id="maya", infer=False)["results"][0]["id"]
    with caplog.at_level(logging.WARNING, logger="inferscale.client_core"):
        result = client.chat("Refused fact or tea?", user_id="maya", max_new_tokens=2, mode=mode)
    assert result.memory_ids == [first_id]
    if kind == "sync":  # the others log it in the server's or the worker's client
        assert f"memory {long_id}" in caplog.text and "would not fit the context of" in caplog.text
    with pytest.raises(ContextLengthError, match=r"the prompt needs \d+ tokens") as refused:  # the caller chose it
        client.chat("tea?", user_id="maya", memory_ids=[long_id], max_new_tokens=2, mode=mode)
    assert "retrieve fewer memories (limit), send a shorter conversation or lower max_new_tokens" in str(refused.value)


@pytest.mark.parametrize("mode", ["kv", "prompt"])
def test_memories_that_fit_alone_but_not_together_give_way_by_rank_and_only_those_kept_are_encoded(
    mode: str,
    engine: TransformersEngine,
    tmp_path: Path,
    clients: list[ClientAdapter],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each memory fits with the chat, all of them together do not: kv mode encoded every retrieved memory's K/V
    (58 s for 30 memories on a helper's 2-core machine) before the engine refused the prompt, and then every chat of
    the scope was refused (a review: the same kind as one long memory). The memories ranked first are kept while the
    prompt fits, the others are left out with a warning, and only the kept ones are encoded, from token counts."""
    client = _client("sync", _config(tmp_path, None, encode_on_add="lazy", context_window=0), engine)
    clients.append(client)
    facts = [f"Note {i}: " + "y" * 30 for i in range(4)]  # ~45 tokens each with the line: 4 pass 128 with the prefix
    client.add([{"role": "user", "content": fact} for fact in facts], user_id="maya", infer=False)
    ranked = [r["id"] for r in client.search("Which note?", user_id="maya", limit=4)["results"]]
    prefix = len(engine.system_prefix_ids())
    rest = len(engine.conversation_token_ids("Which note?")) + 2
    fit, total = 0, prefix + rest
    for memory_id in ranked:
        tokens = len(engine.fact_token_ids(client.get(memory_id)["memory"]))
        if total + tokens > engine.max_context_tokens:
            break
        fit, total = fit + 1, total + tokens
    assert 0 < fit < len(ranked)
    with caplog.at_level(logging.WARNING, logger="inferscale.fact_kv"):
        result = client.chat("Which note?", user_id="maya", limit=4, max_new_tokens=2, mode=mode)
    assert result.memory_ids == ranked[:fit]  # memory_layout "score": best first
    assert all(f"memory {memory_id}" in caplog.text for memory_id in ranked[fit:])
    encoded = {row.memory_id for row in client.client.db.all_kv_entries()}
    assert encoded == (set(ranked[:fit]) if mode == "kv" else set())


@pytest.mark.parametrize("mode", ["kv", "prompt"])
def test_a_chat_whose_conversation_and_budget_alone_pass_the_context_is_refused_before_any_kv_is_encoded(
    mode: str,
    engine: TransformersEngine,
    tmp_path: Path,
    clients: list[ClientAdapter],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Refused before any memory is looked at: a new user's find, each retrieved memory was first logged as left
    out "with the 0 memories ranked above it that fit", a warning that misleads when no memory could help."""
    client = _client("sync", _config(tmp_path, None, encode_on_add="lazy", context_window=0), engine)
    clients.append(client)
    client.add("Note: tea.", user_id="maya", infer=False)
    budget = engine.max_context_tokens - len(engine.system_prefix_ids()) - len(engine.conversation_token_ids("tea?"))
    needs = r"the prompt needs \d+ tokens \(system prefix \d+, memories 0,"
    with (
        caplog.at_level(logging.WARNING, logger="inferscale.fact_kv"),
        pytest.raises(ContextLengthError, match=needs) as refused,
    ):
        client.chat("tea?", user_id="maya", max_new_tokens=budget + 1, mode=mode)
    assert "left out" not in caplog.text
    # every memory was left out already: fewer would not help (the advice said "retrieve fewer memories")
    assert str(refused.value).endswith("; send a shorter conversation or lower max_new_tokens")
    assert client.client.db.all_kv_entries() == []  # no memory was encoded for a chat bound to fail
    assert client.client.kv_store.stats().misses == 0
    assert client.chat("tea?", user_id="maya", max_new_tokens=2, mode=mode).memory_ids
