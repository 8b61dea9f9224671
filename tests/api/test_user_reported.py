"""Regressions for problems found by trying the SDK as a new user (each test holds the failing input)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mem0_fakes import HashEmbedder, ScriptedGenerator, fake_config

from inferscale import AsyncMemoryClient, MemoryClient
from inferscale.config import EngineConfig
from inferscale.engines.transformers import TransformersEngine
from inferscale.errors import InvalidInputError, MemoryNotFoundError
from inferscale.kv import EncodeRequest


@pytest.fixture
def m(tmp_path: Path) -> Iterator[MemoryClient]:
    client = MemoryClient(fake_config(tmp_path), embedder=HashEmbedder(), generator=ScriptedGenerator())
    yield client
    client.close()


def test_id_addressed_calls_can_be_scoped(m: MemoryClient) -> None:
    bob = m.add("Bob likes tennis", user_id="bob", infer=False)["results"][0]["id"]
    assert m.get(bob, user_id="alice") is None
    assert m.get(bob, user_id="bob")["memory"] == "Bob likes tennis"  # type: ignore[index]
    with pytest.raises(MemoryNotFoundError):
        m.update(bob, "Alice wrote this", user_id="alice")
    with pytest.raises(MemoryNotFoundError):
        m.delete(bob, user_id="alice")
    assert m.history(bob, user_id="alice") == []
    assert [h["event"] for h in m.history(bob, user_id="bob")] == ["ADD"]
    assert m.get(bob)["memory"] == "Bob likes tennis"  # type: ignore[index]  # untouched by the refused calls
    m.update(bob, "Bob loves tennis", user_id="bob")
    m.delete(bob, user_id="bob")
    assert m.get(bob) is None


def test_async_id_addressed_calls_can_be_scoped(tmp_path: Path) -> None:
    pytest.importorskip("aiosqlite")

    async def run() -> None:
        client = AsyncMemoryClient(fake_config(tmp_path), embedder=HashEmbedder(), generator=ScriptedGenerator())
        bob = (await client.add("Bob likes tennis", user_id="bob", infer=False))["results"][0]["id"]
        assert await client.get(bob, user_id="alice") is None
        with pytest.raises(MemoryNotFoundError):
            await client.delete(bob, user_id="alice")
        assert (await client.get(bob, user_id="bob"))["memory"] == "Bob likes tennis"  # type: ignore[index]
        await client.close()

    asyncio.run(run())


def test_user_metadata_role_is_kept(m: MemoryClient) -> None:
    added = m.add("meta role key", user_id="alice", metadata={"role": "admin"}, infer=False)["results"][0]
    assert m.get(added["id"])["metadata"] == {"role": "admin"}  # type: ignore[index]
    plain = m.add("no role given", user_id="alice", infer=False)["results"][0]
    assert m.get(plain["id"])["metadata"] == {"role": "user"}  # type: ignore[index]


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda m: m.add("x", user_id="a", infer="no"), "infer"),
        (lambda m: m.add("\ud800 lone surrogate", user_id="a", infer=False), "Unicode"),
        (lambda m: m.search("\ud800", user_id="a"), "Unicode"),
        (lambda m: m.search("x", user_id="a", threshold="0.5"), "threshold"),
        (lambda m: m.get_all(user_id="a", limit=2**70), "at most"),
        (lambda m: m.chat("x", user_id="a", max_new_tokens=-1), "max_new_tokens"),
        (lambda m: m.chat("x", user_id="a", max_new_tokens=0), "max_new_tokens"),
        (lambda m: m.add("My favourite number is 42. " * 4000, user_id="a", infer=False), "max_memory_chars"),
    ],
)
def test_bad_input_gets_a_typed_error_and_loses_nothing(m: MemoryClient, call: Any, match: str) -> None:
    m.add("kept", user_id="a", infer=False)
    with pytest.raises(InvalidInputError, match=match):
        call(m)
    assert [r["memory"] for r in m.get_all(user_id="a")["results"]] == ["kept"]


def test_chat_accepts_v2_top_k(m: MemoryClient) -> None:
    with pytest.raises(InvalidInputError, match="disagree"):  # parsed, then refused for disagreeing with limit
        m.chat("x", user_id="a", limit=3, top_k=2)


@pytest.fixture(scope="module")
def smol(smollm2_fp32: tuple[Any, Any]) -> TransformersEngine:
    model, tokenizer = smollm2_fp32
    return TransformersEngine(EngineConfig(dtype="float32"), "Memories:\n", model=model, tokenizer=tokenizer).load()


def test_prompt_past_the_context_window_is_refused_not_run(smol: TransformersEngine) -> None:
    long_fact = smol.fact_token_ids("My favourite number is 42. " * 1200)  # ~9.6k tokens > 8192
    with pytest.raises(InvalidInputError, match="context"):
        smol.encode_facts([EncodeRequest(long_fact)])
    short = smol.encode_facts([EncodeRequest(smol.fact_token_ids("Maya lives in Porto."))])
    with pytest.raises(InvalidInputError, match="context"):
        smol.generate_kv("Where?", short * 1200, max_new_tokens=4)
    with pytest.raises(InvalidInputError, match="context"):
        smol.generate_prompt("Where?", [long_fact], max_new_tokens=4)


def test_answer_cut_inside_a_character_has_no_replacement_char(smol: TransformersEngine) -> None:
    fact = smol.fact_token_ids("我叫林晓雨，在青木科技做产品经理。")
    for budget in range(1, 9):
        answer = smol.generate_prompt("林晓雨在哪家公司工作？", [fact], max_new_tokens=budget).text
        assert "\ufffd" not in answer
