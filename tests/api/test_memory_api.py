"""Mem0 parity of the sync client with fakes (no model loads): call shapes v1 and v2, update/delete/history,
scoping, reset, and add(infer=True) reconcile. Every test runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from mem0_fakes import (
    HashEmbedder,
    ScriptedGenerator,
    facts,
    fake_config,
    shown_memories,
)

from inferscale import Memory, MemoryClient
from inferscale.errors import ExtractionError, InvalidInputError, MemoryNotFoundError, ScopeError


def make(tmp_path: Path, db_url: str, generator: ScriptedGenerator | None = None) -> MemoryClient:
    return Memory(fake_config(tmp_path, db_url), embedder=HashEmbedder(), generator=generator or ScriptedGenerator())


@pytest.fixture
def m(tmp_path: Path, db_url: str) -> Iterator[MemoryClient]:
    client = make(tmp_path, db_url)
    yield client
    client.close()


def texts(results: dict[str, list[dict[str, object]]]) -> list[object]:
    return [r["memory"] for r in results["results"]]


# ---- call shapes -------------------------------------------------------------------------------------------


def test_v1_and_v2_call_shapes_agree(m: MemoryClient) -> None:
    m.add("I like chess", user_id="alice", agent_id="coach", infer=False)
    m.add("I like tennis", user_id="alice", infer=False)
    m.add("I like chess too", user_id="bob", infer=False)

    v1 = m.search("chess", user_id="alice", limit=1)
    v2 = m.search("chess", filters={"user_id": "alice"}, top_k=1)
    v2_and = m.search("chess", filters={"AND": [{"user_id": "alice"}]}, top_k=1, version="v2")
    assert texts(v1) == texts(v2) == texts(v2_and) == ["I like chess"]
    assert {r["user_id"] for r in m.search("like", filters={"user_id": "alice"})["results"]} == {"alice"}

    assert texts(m.get_all(user_id="alice")) == ["I like chess", "I like tennis"]
    assert texts(m.get_all(filters={"user_id": "alice"})) == ["I like chess", "I like tennis"]
    assert texts(m.get_all(filters={"AND": [{"user_id": "alice"}, {"agent_id": "coach"}]})) == ["I like chess"]
    assert texts(m.get_all(user_id="alice", agent_id="coach")) == ["I like chess"]
    assert texts(m.get_all(user_id="alice", limit=1)) == ["I like chess"]
    assert texts(m.get_all(filters={"user_id": "alice"}, top_k=1)) == ["I like chess"]
    # The same id given both ways is fine; different values are refused.
    assert len(m.get_all(user_id="alice", filters={"user_id": "alice"})["results"]) == 2
    with pytest.raises(InvalidInputError, match="disagrees"):
        m.search("chess", user_id="alice", filters={"user_id": "bob"})
    with pytest.raises(InvalidInputError, match="top_k"):
        m.search("chess", user_id="alice", limit=1, top_k=2)
    with pytest.raises(InvalidInputError, match="version"):
        m.get_all(user_id="alice", version="v3")


def test_every_read_and_write_needs_an_id(m: MemoryClient) -> None:
    m.add("Likes chess", user_id="alice", infer=False)
    with pytest.raises(ScopeError):
        m.add("Likes chess", infer=False)
    with pytest.raises(ScopeError):
        m.search("chess")
    with pytest.raises(ScopeError):
        m.get_all()
    # An id only under OR, or a wildcard, pins no scope.
    with pytest.raises(ScopeError):
        m.get_all(filters={"OR": [{"user_id": "alice"}, {"user_id": "bob"}]})
    with pytest.raises(ScopeError):
        m.search("chess", filters={"user_id": "*"})
    with pytest.raises(ScopeError):
        m.delete_all()
    assert len(m.get_all(user_id="alice")["results"]) == 1


def test_metadata_can_never_set_an_id(m: MemoryClient) -> None:
    for key in ("user_id", "agent_id", "run_id"):
        with pytest.raises(InvalidInputError, match=key):
            m.add("Likes chess", user_id="alice", metadata={key: "mallory"}, infer=False)
    memory_id = m.add("Likes chess", user_id="alice", metadata={"topic": "games"}, infer=False)["results"][0]["id"]
    with pytest.raises(InvalidInputError, match="user_id"):
        m.update(memory_id, metadata={"user_id": "mallory"})
    stored = m.get(memory_id)
    assert stored is not None
    assert stored["user_id"] == "alice" and stored["metadata"] == {"topic": "games", "role": "user"}


# ---- get / update / delete / history -----------------------------------------------------------------------


def test_add_update_delete_history(m: MemoryClient) -> None:
    memory_id = m.add("Lives in Lisbon", user_id="alice", infer=False)["results"][0]["id"]
    got = m.get(memory_id)
    assert got is not None and got["memory"] == "Lives in Lisbon" and got["user_id"] == "alice"
    assert set(got) >= {"id", "memory", "hash", "metadata", "created_at", "updated_at", "user_id"}

    out = m.update(memory_id, "Lives in Porto")
    assert out["result"]["memory"] == "Lives in Porto" and "message" in out
    assert texts(m.search("Porto", user_id="alice")) == ["Lives in Porto"]
    m.update(memory_id, data="Lives in Porto, Portugal")  # Mem0's name for the text
    m.update(memory_id, metadata={"city": "Porto"})
    assert m.get(memory_id)["metadata"] == {"city": "Porto"}  # type: ignore[index]
    with pytest.raises(InvalidInputError):
        m.update(memory_id)
    with pytest.raises(InvalidInputError, match="text and data"):
        m.update(memory_id, text="a", data="b")
    with pytest.raises(MemoryNotFoundError):
        m.update("no-such-id", "x")

    assert m.delete(memory_id)["message"]
    assert m.get(memory_id) is None
    with pytest.raises(MemoryNotFoundError):
        m.delete(memory_id)

    rows = m.history(memory_id)
    assert [r["event"] for r in rows] == ["ADD", "UPDATE", "UPDATE", "UPDATE", "DELETE"]
    stamps = [datetime.fromisoformat(r["created_at"]) for r in rows]
    assert stamps == sorted(stamps) and all(s.tzinfo is not None for s in stamps)
    assert rows[0]["old_memory"] is None and rows[0]["new_memory"] == "Lives in Lisbon"
    assert rows[1]["old_memory"] == "Lives in Lisbon" and rows[1]["new_memory"] == "Lives in Porto"
    assert rows[-1]["old_memory"] == "Lives in Porto, Portugal" and rows[-1]["new_memory"] is None
    assert rows[-1]["is_deleted"] is True
    assert m.history("never-existed") == []


def test_add_update_delete_gives_three_history_rows(m: MemoryClient) -> None:
    memory_id = m.add("Drinks tea", user_id="u", infer=False)["results"][0]["id"]
    m.update(memory_id, "Drinks green tea")
    m.delete(memory_id)
    rows = m.history(memory_id)
    assert [r["event"] for r in rows] == ["ADD", "UPDATE", "DELETE"]
    assert [r["created_at"] for r in rows] == sorted(r["created_at"] for r in rows)
    assert rows[2]["old_memory"] == "Drinks green tea"


def test_delete_all_keeps_other_scopes(m: MemoryClient) -> None:
    m.add("Likes chess", user_id="alice", infer=False)
    bob_id = m.add("Likes tennis", user_id="bob", infer=False)["results"][0]["id"]
    out = m.delete_all(user_id="alice")
    assert out["deleted"] == 1
    assert m.get_all(user_id="alice")["results"] == []
    assert texts(m.get_all(user_id="bob")) == ["Likes tennis"]
    bob = m.db.get(bob_id)
    assert bob is not None and bob.vector_id in set(m.index.ids().tolist())
    assert texts(m.search("tennis", user_id="bob")) == ["Likes tennis"]
    with pytest.raises(ScopeError):
        m.delete_all()
    assert texts(m.get_all(user_id="bob")) == ["Likes tennis"]


def test_reset_then_add_works(m: MemoryClient) -> None:
    m.add("Likes chess", user_id="alice", infer=False)
    m.reset()
    assert m.get_all(user_id="alice")["results"] == []
    assert len(m.index) == 0
    m.add("Likes go", user_id="alice", infer=False)
    assert texts(m.search("go", user_id="alice")) == ["Likes go"]


def test_filters_restrict_search_and_get_all(m: MemoryClient) -> None:
    m.add("Rated the film", user_id="u", metadata={"score": 9, "kind": "film"}, infer=False)
    m.add("Rated the book", user_id="u", metadata={"score": 4, "kind": "book"}, infer=False)
    m.add("Rated the song", user_id="u", metadata={"kind": "song"}, infer=False)
    assert texts(m.search("rated", user_id="u", filters={"score": {"gte": 5}})) == ["Rated the film"]
    assert texts(m.get_all(user_id="u", filters={"kind": {"in": ["book", "song"]}})) == [
        "Rated the book",
        "Rated the song",
    ]
    assert texts(m.get_all(user_id="u", filters={"score": "*"})) == ["Rated the film", "Rated the book"]
    assert texts(m.get_all(user_id="u", filters={"NOT": [{"kind": "film"}]})) == ["Rated the book", "Rated the song"]
    assert texts(m.get_all(filters={"AND": [{"user_id": "u"}, {"OR": [{"kind": "song"}, {"score": {"lt": 5}}]}]})) == [
        "Rated the book",
        "Rated the song",
    ]
    assert texts(m.get_all(user_id="u", filters={"kind": {"icontains": "FIL"}})) == ["Rated the film"]
    assert texts(m.get_all(user_id="u", filters={"created_at": {"gte": "2000-01-01"}, "kind": {"ne": "book"}})) == [
        "Rated the film",
        "Rated the song",
    ]
    assert m.get_all(user_id="u", filters={"updated_at": {"lt": "2000-01-01"}})["results"] == []
    with pytest.raises(InvalidInputError, match="unknown operator"):
        m.get_all(user_id="u", filters={"score": {"between": [1, 2]}})
    with pytest.raises(InvalidInputError, match="'in'"):
        m.get_all(user_id="u", filters={"kind": ["book"]})


# ---- add(infer=True): extraction and reconcile ---------------------------------------------------------------

PIP = "Pip the beagle was adopted from the Riverside shelter in 2019."


def test_same_fact_twice_is_one_memory(tmp_path: Path, db_url: str) -> None:
    gen = ScriptedGenerator(facts=facts(PIP))
    m = make(tmp_path, db_url, gen)
    first = m.add(PIP, user_id="u")["results"]
    assert [(r["memory"], r["event"]) for r in first] == [(PIP, "ADD")]
    assert m.add(PIP, user_id="u")["results"] == []
    assert texts(m.get_all(user_id="u")) == [PIP]
    assert [r["event"] for r in m.history(first[0]["id"])] == ["ADD"]
    # The exact duplicate never reached the reconcile LLM.
    assert gen.titles() == ["ExtractedFacts", "ExtractedFacts"]


def test_thai_food_preference_is_updated(tmp_path: Path, db_url: str) -> None:
    def update(messages: list[dict[str, str]]) -> str:
        (old,) = shown_memories(messages)
        answer = {"id": old["id"], "text": "Hates Thai food", "event": "UPDATE", "old_memory": old["text"]}
        return json.dumps({"memory": [answer]})

    gen = ScriptedGenerator(facts=[facts("Loves Thai food"), facts("Hates Thai food")], decisions=update)
    m = make(tmp_path, db_url, gen)
    added = m.add("I love Thai food", user_id="u", run_id="r1")["results"]
    assert texts(m.get_all(user_id="u", run_id="r1")) == ["Loves Thai food"]
    changed = m.add("I hate Thai food", user_id="u", run_id="r1")["results"]
    assert changed == [
        {"id": added[0]["id"], "memory": "Hates Thai food", "event": "UPDATE", "previous_memory": "Loves Thai food"}
    ]
    assert texts(m.get_all(user_id="u", run_id="r1")) == ["Hates Thai food"]
    rows = m.history(added[0]["id"])
    assert [(r["event"], r["old_memory"], r["new_memory"]) for r in rows] == [
        ("ADD", None, "Loves Thai food"),
        ("UPDATE", "Loves Thai food", "Hates Thai food"),
    ]
    assert texts(m.search("Thai food", user_id="u", run_id="r1")) == ["Hates Thai food"]


def test_thai_food_as_delete_plus_add_is_atomic(tmp_path: Path, db_url: str) -> None:
    decisions = json.dumps(
        {
            "memory": [
                {"id": "0", "text": "", "event": "DELETE"},
                {"id": "new", "text": "Hates Thai food", "event": "ADD"},
            ]
        }
    )
    gen = ScriptedGenerator(facts=[facts("Loves Thai food"), facts("Hates Thai food")], decisions=decisions)
    m = make(tmp_path, db_url, gen)
    old_id = m.add("I love Thai food", user_id="u", run_id="r1")["results"][0]["id"]
    events = [(r["event"], r["memory"]) for r in m.add("I hate Thai food", user_id="u", run_id="r1")["results"]]
    assert events == [("DELETE", "Loves Thai food"), ("ADD", "Hates Thai food")]
    assert texts(m.get_all(user_id="u", run_id="r1")) == ["Hates Thai food"]
    assert [r["event"] for r in m.history(old_id)] == ["ADD", "DELETE"]
    assert m.history(old_id)[-1]["old_memory"] == "Loves Thai food"


def test_unknown_id_is_skipped_with_a_warning(tmp_path: Path, db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    answer = (
        '{"memory":[{"id":"0","text":"Lives in Porto","event":"UPDATE","old_memory":"Lives in Lisbon"},'
        '{"id":"9","text":"x","event":"DELETE"}]}'
    )
    gen = ScriptedGenerator(facts=facts("Lives in Porto"), decisions=answer)
    m = make(tmp_path, db_url, gen)
    stored = ["Lives in Lisbon", "Works as a nurse", "Has two cats"]
    ids = [m.add(text, user_id="u", infer=False)["results"][0]["id"] for text in stored]
    with caplog.at_level(logging.WARNING, logger="inferscale.memory.reconcile"):
        results = m.add("I moved to Porto", user_id="u")["results"]
    assert [(r["id"], r["event"], r["memory"]) for r in results] == [(ids[0], "UPDATE", "Lives in Porto")]
    assert any("'9'" in record.getMessage() for record in caplog.records)
    assert texts(m.get_all(user_id="u")) == ["Lives in Porto", "Works as a nurse", "Has two cats"]
    # The LLM saw short ids only, never a UUID.
    _, prompt = gen.calls[-1]
    assert [s["id"] for s in shown_memories(prompt)] == ["0", "1", "2"]
    assert not any(memory_id in prompt[-1]["content"] for memory_id in ids)


def test_prose_and_fenced_json_from_an_endpoint(tmp_path: Path, db_url: str) -> None:
    raw = 'Sure! Here is what I found:\n```json\n{"facts": ["Owns a red bicycle"]}\n```\nLet me know if you need more.'
    m = make(tmp_path, db_url, ScriptedGenerator(facts=raw))
    assert texts(m.add("I ride my red bike to work", user_id="u")) == ["Owns a red bicycle"]
    assert texts(m.get_all(user_id="u")) == ["Owns a red bicycle"]


def test_unparseable_reconcile_answer_writes_nothing(tmp_path: Path, db_url: str) -> None:
    gen = ScriptedGenerator(facts=[facts("Likes tea"), facts("Likes green tea")], decisions="I cannot help with that.")
    m = make(tmp_path, db_url, gen)
    m.add("I like tea", user_id="u")
    with pytest.raises(ExtractionError):
        m.add("I like green tea", user_id="u")
    assert texts(m.get_all(user_id="u")) == ["Likes tea"]


def test_chinese_fact_is_kept_verbatim(tmp_path: Path, db_url: str) -> None:
    fact = "林晓雨在青木科技做产品经理"
    m = make(tmp_path, db_url, ScriptedGenerator(facts=facts("名字是林晓雨", fact)))
    m.add([{"role": "user", "content": "我叫林晓雨，在青木科技做产品经理。"}], user_id="cn1")
    stored = texts(m.get_all(user_id="cn1"))
    assert stored == ["名字是林晓雨", fact]
    assert texts(m.search("林晓雨在哪里工作？", user_id="cn1", limit=1)) == [fact]
    assert m.get_all(user_id="cn1", filters={"user_id": "cn1"})["results"][1]["memory"] == fact


def test_long_conversation_is_extracted_in_chunks(tmp_path: Path, db_url: str) -> None:
    seen: list[str] = []

    def extract(messages: list[dict[str, str]]) -> str:
        conversation = messages[-1]["content"]
        seen.append(conversation)
        marker = re.search(r"topic\d+", conversation)
        return facts(f"Discussed {marker.group(0) if marker else 'nothing'}")

    embedder = HashEmbedder()
    m = MemoryClient(fake_config(tmp_path, db_url), embedder=embedder, generator=ScriptedGenerator(facts=extract))
    sentence = "We talked about the weather, the harbour and the trains again today. "
    turns = [{"role": "user", "content": f"topic{i}: " + sentence * 8} for i in range(90)]
    turns[10]["content"] = "topic10: " + sentence * 200  # one message longer than a chunk
    total_bytes = sum(len(t["content"].encode()) for t in turns)
    assert total_bytes / 4 > 12_000  # about 12k tokens or more
    results = m.add(turns, user_id="u")["results"]
    budget = m.config.llm.max_input_tokens
    assert len(seen) > 1 and all(len(c.encode()) / 3 <= budget + 40 for c in seen)
    stored = [r["memory"] for r in results]
    assert len(stored) == len(set(stored)) >= len(seen) - 2  # pieces of topic10 repeat its marker
    assert stored[0] == "Discussed topic0"
    assert embedder.max_chars_seen < 100  # only short facts were embedded


def test_ungrounded_facts_are_dropped_and_the_turn_kept(tmp_path: Path, db_url: str) -> None:
    message = "我叫林晓雨，在青木科技做产品经理。"
    gen = ScriptedGenerator(facts=facts("User will fly to Rome on 3 July", "User hates flying"))
    m = make(tmp_path, db_url, gen)
    assert texts(m.add(message, user_id="cn1")) == [message]
    gen = ScriptedGenerator(facts=facts("User will eat walnuts on 3 July", "User has a nut allergy"))
    m = make(tmp_path, db_url, gen)
    assert texts(m.add("I'm allergic to walnuts.", user_id="a")) == ["User has a nut allergy"]


def test_reconcile_off_only_adds(tmp_path: Path, db_url: str) -> None:
    from inferscale.config import LLMConfig

    gen = ScriptedGenerator(facts=[facts("Likes tea"), facts("Likes green tea")])
    config = fake_config(tmp_path, db_url, llm=LLMConfig(reconcile=False))
    m = MemoryClient(config, embedder=HashEmbedder(), generator=gen)
    m.add("I like tea", user_id="u")
    m.add("I like green tea", user_id="u")
    assert texts(m.get_all(user_id="u")) == ["Likes tea", "Likes green tea"]
    assert gen.titles() == ["ExtractedFacts", "ExtractedFacts"]


def test_index_catches_up_with_another_client(tmp_path: Path, db_url: str) -> None:
    a = make(tmp_path, db_url)
    b = make(tmp_path, db_url)
    a.add("Likes chess", user_id="u", infer=False)
    assert len(a.index) == 1
    assert len(b.index) == 1
    b.add("Likes tennis", user_id="u", infer=False)
    assert texts(a.search("tennis", user_id="u", limit=1)) == ["Likes tennis"]
    assert np.isin(b.index.ids(), a.index.ids()).all()
