"""``chat`` with conversations on both clients and both databases, on a tiny float32 model with a byte-level
tokenizer (fast, real generation): which memories a conversation gets, streaming, sampling, and typed errors
raised before anything is generated."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from client_adapter import ClientAdapter, ClientKind, open_client
from mem0_fakes import HashEmbedder, fake_config
from tiny_models import counted_forwards, tiny_engine

from inferscale import ChatMessage, InvalidInputError, MemoryNotFoundError, ScopeError

FACTS = ["My dog is a beagle named Biscuit.", "I live in Porto.", "My sister Clara is a teacher in Madrid."]
# Its user turns have the words of two memories (HashEmbedder: the closest), not their texts: a memory whose text is
# a message of the conversation is not injected (test_a_memory_repeating_a_message_of_the_conversation_...).
CONVERSATION = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "I live in Porto!"},
    {"role": "assistant", "content": "Porto is lovely."},
    {"role": "user", "content": "My dog is a beagle named Biscuit!"},
]


@pytest.fixture(scope="module")
def engine() -> Any:
    return tiny_engine("llama")


@pytest.fixture
def c(tmp_path: Path, db_url: str, client_kind: ClientKind, engine: Any) -> Iterator[ClientAdapter]:
    client = open_client(client_kind, fake_config(tmp_path, db_url), engine=engine, embedder=HashEmbedder())
    for fact in FACTS:
        client.add(fact, user_id="alice", infer=False)
    client.add("Bob's dog is a poodle named Rex.", user_id="bob", infer=False)
    yield client
    client.close()


def _ids(c: ClientAdapter, query: str, limit: int) -> list[str]:
    return [r["id"] for r in c.search(query, user_id="alice", limit=limit)["results"]]


def test_a_conversation_retrieves_with_its_last_user_turn_or_the_search_query(c: ClientAdapter) -> None:
    result = c.chat(messages=CONVERSATION, user_id="alice", limit=1, max_new_tokens=4)
    assert result.memory_ids == _ids(c, CONVERSATION[-1]["content"], 1)
    assert result.memories == ["My dog is a beagle named Biscuit."]  # HashEmbedder: the same text is closest
    asked = c.chat(messages=CONVERSATION, user_id="alice", limit=1, search_query="I live in Porto.", max_new_tokens=4)
    assert asked.memory_ids == _ids(c, "I live in Porto.", 1) != result.memory_ids
    # every turn is prefilled: a longer conversation is more prompt tokens, the same memory tokens
    one_turn = c.chat(CONVERSATION[-1]["content"], user_id="alice", limit=1, max_new_tokens=4)
    assert one_turn.memory_ids == result.memory_ids
    turns = c.engine.conversation_token_ids([ChatMessage(m["role"], m["content"]) for m in CONVERSATION])
    query = c.engine.query_token_ids(CONVERSATION[-1]["content"])
    assert result.prompt_tokens - one_turn.prompt_tokens == len(turns) - len(query) > 0
    assert result.memory_tokens == one_turn.memory_tokens


def test_a_memory_repeating_a_message_of_the_conversation_is_not_injected(c: ClientAdapter) -> None:
    """A new user's report: a server's chats spent memory slots on stored copies of the question (written back by
    an earlier session), which then ranked first; under a tight answer budget the fact was the memory left out. The
    prompt holds that text already: the next memories take the slots."""
    question = "What is my dog called?"
    copy = c.add(question, user_id="alice", infer=False)["results"][0]["id"]
    ranked = _ids(c, question, 4)
    assert ranked[0] == copy
    result = c.chat(question, user_id="alice", limit=2, max_new_tokens=2)
    assert sorted(result.memory_ids) == sorted(ranked[1:3])
    said = [{"role": "user", "content": " My dog is a beagle named Biscuit. "}, {"role": "assistant", "content": "Hi"}]
    dog = next(r["id"] for r in c.get_all(user_id="alice")["results"] if r["memory"] == FACTS[0])
    turns = [*said, {"role": "user", "content": question}]
    conversation = c.chat(messages=turns, user_id="alice", limit=2, max_new_tokens=2)
    assert sorted(conversation.memory_ids) == sorted(set(ranked) - {copy, dog})  # the other two of the four
    assert c.chat(question, user_id="alice", memory_ids=[copy], max_new_tokens=2).memory_ids == [copy]  # as named


def test_a_text_stored_many_times_still_leaves_limit_memories(c: ClientAdapter) -> None:
    """A review's find: retrieval asked for one memory more per message, so a question stored by three earlier
    sessions (one run id each), or with other whitespace, took every slot and the chat injected none."""
    question = "What is my dog called?"
    copies = {c.add(question, user_id="alice", run_id=f"s{i}", infer=False)["results"][0]["id"] for i in range(3)}
    copies.add(c.add(f"  {question}\n", user_id="alice", infer=False)["results"][0]["id"])
    ranked = _ids(c, question, 7)
    assert set(ranked[:4]) == copies
    for limit in (1, 2, 3):
        result = c.chat(question, user_id="alice", limit=limit, max_new_tokens=2)
        assert sorted(result.memory_ids) == sorted(ranked[4 : 4 + limit])
    every = c.chat(question, user_id="alice", limit=5, max_new_tokens=2).memory_ids  # more than the scope's three
    assert sorted(every) == sorted(ranked[4:]) and len(every) == 3


@pytest.mark.parametrize("call", ["query", "messages", "stream"])
def test_a_chat_message_holding_nul_is_answered_and_retrieves_as_without_it(c: ClientAdapter, call: str) -> None:
    """Chat messages are not stored, so they may hold NUL (docs/api.md); the query a chat searches with is derived
    from them. A helper's ``chat(messages=[{"content": "a\\x00b"}])`` was refused as "query holds a NUL", naming an
    argument it never passed, and so was ``chat("a\\x00b", memory_ids=[])``, which searches nothing. A ``search``
    query and an explicit ``search_query`` are still refused (tests/api/test_unstorable_input.py)."""
    text = "My dog is a beagle named Biscuit."
    held = text.replace("beagle", "beagle\x00")
    if call == "messages":
        result = c.chat(messages=[{"role": "user", "content": held}], user_id="alice", limit=1, max_new_tokens=2)
    elif call == "stream":
        result = c.chat_stream(held, user_id="alice", limit=1, max_new_tokens=2)[-1].result
    else:
        result = c.chat(held, user_id="alice", limit=1, max_new_tokens=2)
    assert result is not None and result.memories == [text]  # HashEmbedder: the closest text is the one without NUL
    named = c.chat(held, user_id="alice", memory_ids=[], max_new_tokens=2)
    assert named.memory_ids == []
    with pytest.raises(InvalidInputError, match="query holds a NUL"):
        c.search(held, user_id="alice")


def test_memory_ids_inject_exactly_those_memories_of_the_scope(c: ClientAdapter) -> None:
    all_ids = [r["id"] for r in c.get_all(user_id="alice")["results"]]
    chosen = [all_ids[2], all_ids[0]]
    for mode in ("kv", "prompt"):
        result = c.chat(messages=CONVERSATION, user_id="alice", memory_ids=chosen, mode=mode, max_new_tokens=4)
        assert result.memory_ids == chosen
        assert result.memories == [(c.get(i) or {}).get("memory") for i in chosen]
    assert c.chat("Anything?", user_id="alice", memory_ids=[], max_new_tokens=2).memory_ids == []
    v2 = c.chat("Anything?", filters={"user_id": "alice"}, memory_ids=chosen, max_new_tokens=2)  # scope-only filters
    assert v2.memory_ids == chosen
    bobs = c.get_all(user_id="bob")["results"][0]["id"]
    with pytest.raises(MemoryNotFoundError, match="in scope"):  # another tenant's memory is never injected
        c.chat("What is my dog called?", user_id="alice", memory_ids=[bobs], max_new_tokens=2)


@pytest.mark.parametrize("mode", ["kv", "prompt"])
def test_streamed_chunks_join_to_the_answer_and_end_with_the_report(c: ClientAdapter, mode: str) -> None:
    whole = c.chat(messages=CONVERSATION, user_id="alice", mode=mode, max_new_tokens=20)
    chunks = c.chat_stream(messages=CONVERSATION, user_id="alice", mode=mode, max_new_tokens=20)
    final = chunks[-1].result
    assert final is not None and chunks[-1].delta == ""
    assert all(chunk.result is None and chunk.delta for chunk in chunks[:-1])
    assert "".join(chunk.delta for chunk in chunks) == final.answer == whole.answer
    assert final.memory_ids == whole.memory_ids
    assert (final.generated_tokens, final.prompt_tokens, final.finish_reason) == (
        whole.generated_tokens,
        whole.prompt_tokens,
        whole.finish_reason,
    )
    timings = final.timings
    assert 0 < timings.retrieval_ms <= timings.ttft_ms <= timings.total_ms


def test_a_stored_layout_lays_the_retrieved_memories_out_oldest_first(
    tmp_path: Path, db_url: str, client_kind: ClientKind, engine: Any
) -> None:
    config = fake_config(tmp_path, db_url, memory_layout="added")
    client = open_client(client_kind, config, engine=engine, embedder=HashEmbedder())
    try:
        for fact in FACTS:
            client.add(fact, user_id="alice", infer=False)
        id_of = {r["memory"]: r["id"] for r in client.get_all(user_id="alice")["results"]}
        query = FACTS[-1].replace(".", "?")  # its words (HashEmbedder: the closest), not its text (never injected)
        by_score = _ids(client, query, 2)
        assert by_score[0] == id_of[FACTS[-1]]  # search ranks best first: the last fact added before an older one
        oldest_first = [id_of[fact] for fact in FACTS if id_of[fact] in by_score]
        assert oldest_first != by_score
        for mode in ("kv", "prompt"):
            laid = client.chat(query, user_id="alice", limit=2, mode=mode, max_new_tokens=6)
            assert laid.memory_ids == oldest_first
            # the same prompt as the caller laying those memories out in that order: the same greedy answer
            chosen = client.chat(query, user_id="alice", memory_ids=oldest_first, mode=mode, max_new_tokens=6)
            assert (laid.answer, laid.prompt_tokens, laid.memory_tokens) == (
                chosen.answer,
                chosen.prompt_tokens,
                chosen.memory_tokens,
            )
            # memory_ids keep the caller's order under this layout too
            assert client.chat(query, user_id="alice", memory_ids=by_score, mode=mode, max_new_tokens=2).memory_ids == (
                by_score
            )
    finally:
        client.close()


def test_a_streamed_answer_with_memory_ids_reports_them(c: ClientAdapter) -> None:
    chosen = [r["id"] for r in c.get_all(user_id="alice")["results"]][:2]
    chunks = c.chat_stream(messages=CONVERSATION, user_id="alice", memory_ids=chosen, max_new_tokens=6)
    assert chunks[-1].result is not None and chunks[-1].result.memory_ids == chosen


def test_a_seed_repeats_a_sample_and_temperature_zero_is_greedy(c: ClientAdapter) -> None:
    def answer(**kwargs: Any) -> str:
        return c.chat(messages=CONVERSATION, user_id="alice", max_new_tokens=12, **kwargs).answer

    greedy = answer()
    assert answer(temperature=0) == greedy
    assert answer(temperature=1.5, seed=4) == answer(temperature=1.5, seed=4)
    assert len({answer(temperature=1.5, seed=s) for s in (1, 2, 3)}) > 1


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"messages": []}, InvalidInputError, "empty"),
        ({"messages": [{"role": "tool", "content": "x"}]}, InvalidInputError, "role 'tool'"),
        ({"messages": [{"role": "system", "content": "Be brief."}]}, InvalidInputError, "no user message"),
        ({"query": "Hi", "messages": CONVERSATION}, InvalidInputError, "either a query"),
        ({}, InvalidInputError, "neither was given"),
        ({"query": "Hi", "temperature": -1}, InvalidInputError, "temperature"),
        ({"query": "Hi", "top_p": 0}, InvalidInputError, "top_p"),
        ({"query": "Hi", "top_p": 1.5}, InvalidInputError, "top_p"),
        ({"query": "Hi", "top_k": 0}, InvalidInputError, "top_k"),
        ({"query": "Hi", "stop": [""]}, InvalidInputError, "stop"),
        ({"query": "Hi", "memory_ids": ["x"], "limit": 2}, InvalidInputError, "memory_ids chooses"),
        ({"query": "Hi", "memory_ids": [], "limit": 0}, InvalidInputError, "memory_ids chooses"),
        ({"query": "Hi", "memory_ids": ["x"], "filters": {"topic": "pets"}}, InvalidInputError, "chooses"),
        ({"query": "Hi", "memory_ids": "abc"}, InvalidInputError, "list of memory id"),
        ({"query": "Hi", "memory_ids": ["a", "a"]}, InvalidInputError, "twice"),
        ({"query": "Hi", "search_query": " "}, InvalidInputError, "query"),
        ({"query": "Hi", "mode": "paste"}, InvalidInputError, "mode"),
        ({"query": "Hi", "max_new_tokens": 0}, InvalidInputError, "max_new_tokens"),
        ({"query": "Hi", "user_id": None}, ScopeError, "user_id"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_bad_input_is_refused_before_anything_runs(
    c: ClientAdapter,
    kwargs: dict[str, Any],
    error: type[Exception],
    match: str,
    stream: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The error comes from the ``chat`` call itself (a stream is opened, never read), and the engine is never
    asked to generate."""

    def no_generation(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("bad input reached the engine")

    for name in ("stream_kv", "stream_prompt", "generate_kv", "generate_prompt"):
        monkeypatch.setattr(c.engine, name, no_generation)
    before = c.get_all(user_id="alice")["results"]
    call = {"user_id": "alice", **kwargs}
    query = call.pop("query", None)
    with pytest.raises(error, match=match):
        if stream:
            c.chat_stream_open(query, **call)
        else:
            c.chat(query, **call)
    assert c.get_all(user_id="alice")["results"] == before


def test_leaving_an_async_stream_early_stops_decoding(tmp_path: Path, engine: Any) -> None:
    """The async stream's thread runs at most one chunk ahead: after ``break`` (the iterator still referenced) the
    engine runs no more than a couple of forward passes, not the whole budget."""
    import asyncio

    from inferscale import AsyncMemoryClient

    async def run() -> int:
        client = AsyncMemoryClient(fake_config(tmp_path), engine=engine, embedder=HashEmbedder())
        try:
            await client.add(FACTS[0], user_id="alice", infer=False)
            stream = await client.chat("Tell me a long story.", user_id="alice", max_new_tokens=60, stream=True)
            with counted_forwards(engine) as forwards:
                async for _ in stream:
                    break
                await asyncio.sleep(0.5)  # 60 tiny forward passes take a few tens of ms
                seen = len(forwards)
            await stream.aclose()  # type: ignore[attr-defined]
            return seen
        finally:
            await client.close()

    assert asyncio.run(run()) <= 3


def test_cancelling_an_async_chat_stops_decoding(tmp_path: Path, engine: Any) -> None:
    """A non-streamed async chat ran on its worker thread to the end of its budget after the caller's timeout or
    cancel, holding the model from the next chat; it now stops within a token. A chat after it answers as before."""
    import asyncio

    from inferscale import AsyncMemoryClient

    async def run() -> tuple[int, int, str, str]:
        client = AsyncMemoryClient(fake_config(tmp_path), engine=engine, embedder=HashEmbedder())
        try:
            await client.add(FACTS[0], user_id="alice", infer=False)
            before = await client.chat("Tell me a long story.", user_id="alice", max_new_tokens=8)
            with counted_forwards(engine, delay_s=0.02) as forwards:
                with contextlib.suppress(TimeoutError):
                    long_chat = client.chat("Tell me a long story.", user_id="alice", max_new_tokens=200)
                    await asyncio.wait_for(long_chat, 0.3)
                await asyncio.sleep(1.0)  # the rest of 200 forward passes would take over 4 s
                seen = len(forwards)
                await asyncio.sleep(0.5)
                settled = len(forwards)
            after = await client.chat("Tell me a long story.", user_id="alice", max_new_tokens=8)
            return seen, settled, before.answer, after.answer
        finally:
            await client.close()

    seen, settled, before, after = asyncio.run(run())
    assert seen < 60 and settled == seen  # stopped, not still decoding
    assert after == before


def test_closing_the_client_ends_a_chat_another_thread_waits_for(tmp_path: Path, engine: Any) -> None:
    """``close()`` waited for a non-streamed chat running on another thread to decode its whole budget (14 s in a
    user's test, while the streams open beside it also ran to their end); that chat now raises EngineClosedError
    within a token, as a stream does, and ``close()`` returns at once. The client answers again afterwards."""
    import threading
    import time

    from inferscale import EngineClosedError, MemoryClient

    client = MemoryClient(fake_config(tmp_path), engine=engine, embedder=HashEmbedder())
    client.add(FACTS[0], user_id="alice", infer=False)
    before = client.chat("Tell me a long story.", user_id="alice", max_new_tokens=8).answer
    raised: list[BaseException] = []

    def long_chat() -> None:
        try:
            client.chat("Tell me a long story.", user_id="alice", max_new_tokens=200)
        except BaseException as exc:  # reported below; a thread cannot raise into the test
            raised.append(exc)

    with counted_forwards(engine, delay_s=0.02) as forwards:
        worker = threading.Thread(target=long_chat)
        worker.start()
        while len(forwards) < 5:
            time.sleep(0.01)
        started = time.perf_counter()
        client.close()
        closed_s = time.perf_counter() - started
        worker.join(timeout=30)
    assert not worker.is_alive() and closed_s < 1.0 and len(forwards) < 60, (closed_s, len(forwards))
    assert [type(e) for e in raised] == [EngineClosedError]
    assert client.chat("Tell me a long story.", user_id="alice", max_new_tokens=8).answer == before
    client.close()


def test_a_stream_not_read_yet_when_the_client_closes_raises_engine_closed(tmp_path: Path, engine: Any) -> None:
    """A new user's find: a stream opened, then the client closed before the stream was read, raised a bare
    AttributeError on the first read, sync and async (a remote client's raised EngineClosedError)."""
    import asyncio

    from inferscale import AsyncMemoryClient, EngineClosedError, MemoryClient

    client = MemoryClient(fake_config(tmp_path / "sync"), engine=engine, embedder=HashEmbedder())
    client.add(FACTS[0], user_id="alice", infer=False)
    stream = client.chat("What is my dog called?", user_id="alice", max_new_tokens=8, stream=True)
    client.close()
    with pytest.raises(EngineClosedError, match="closed"):
        "".join(chunk.delta for chunk in stream)

    async def async_case() -> None:
        aclient = AsyncMemoryClient(fake_config(tmp_path / "async"), engine=engine, embedder=HashEmbedder())
        await aclient.add(FACTS[0], user_id="alice", infer=False)
        astream = await aclient.chat("What is my dog called?", user_id="alice", max_new_tokens=8, stream=True)
        await aclient.close()
        with pytest.raises(EngineClosedError, match="closed"):
            async for _ in astream:
                pass

    asyncio.run(async_case())
