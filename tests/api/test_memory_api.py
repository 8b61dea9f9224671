"""Mem0 parity of both clients with fakes (no model loads): call shapes v1 and v2, update/delete/history,
scoping, reset, and add(infer=True) reconcile. Every test runs on MemoryClient and AsyncMemoryClient (through
``client_adapter``), each on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from client_adapter import ClientAdapter, ClientKind, MakeClient, open_client
from mem0_fakes import (
    HashEmbedder,
    ScriptedGenerator,
    facts,
    fake_config,
    shown_memories,
)

from inferscale import MemoryConfig
from inferscale.errors import ExtractionError, InvalidInputError, MemoryNotFoundError, ScopeError


@pytest.fixture
def make(tmp_path: Path, db_url: str, client_kind: ClientKind) -> Iterator[MakeClient]:
    """Builds clients of this test's kind on ``db_url``: ``make(generator=None, *, config=None, embedder=None)``
    (defaults: the fake config, a HashEmbedder, an empty ScriptedGenerator). Closes them after the test."""
    built: list[ClientAdapter] = []

    def build(
        generator: ScriptedGenerator | None = None,
        *,
        config: MemoryConfig | None = None,
        embedder: HashEmbedder | None = None,
    ) -> ClientAdapter:
        client = open_client(
            client_kind,
            config or fake_config(tmp_path, db_url),
            embedder=embedder or HashEmbedder(),
            generator=generator or ScriptedGenerator(),
        )
        built.append(client)
        return client

    yield build
    for client in built:
        client.close()


@pytest.fixture
def m(make: MakeClient) -> ClientAdapter:
    return make()


def texts(results: dict[str, list[dict[str, object]]]) -> list[object]:
    return [r["memory"] for r in results["results"]]


# ---- call shapes -------------------------------------------------------------------------------------------


def test_v1_and_v2_call_shapes_agree(m: ClientAdapter) -> None:
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


def test_every_read_and_write_needs_an_id(m: ClientAdapter) -> None:
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


def test_metadata_can_never_set_an_id(m: ClientAdapter) -> None:
    for key in ("user_id", "agent_id", "run_id"):
        with pytest.raises(InvalidInputError, match=key):
            m.add("Likes chess", user_id="alice", metadata={key: "mallory"}, infer=False)
    memory_id = m.add("Likes chess", user_id="alice", metadata={"topic": "games"}, infer=False)["results"][0]["id"]
    with pytest.raises(InvalidInputError, match="user_id"):
        m.update(memory_id, metadata={"user_id": "mallory"})
    stored = m.get(memory_id)
    assert stored is not None
    assert stored["user_id"] == "alice" and stored["metadata"] == {"topic": "games", "role": "user"}


def test_user_metadata_role_is_kept(m: ClientAdapter) -> None:
    added = m.add("meta role key", user_id="alice", metadata={"role": "admin"}, infer=False)["results"][0]
    assert m.get(added["id"])["metadata"] == {"role": "admin"}  # type: ignore[index]
    plain = m.add("no role given", user_id="alice", infer=False)["results"][0]
    assert m.get(plain["id"])["metadata"] == {"role": "user"}  # type: ignore[index]


def test_id_addressed_calls_can_be_scoped(m: ClientAdapter) -> None:
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


# ---- bad input -----------------------------------------------------------------------------------------------


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
def test_bad_input_gets_a_typed_error_and_loses_nothing(m: ClientAdapter, call: Any, match: str) -> None:
    m.add("kept", user_id="a", infer=False)
    with pytest.raises(InvalidInputError, match=match):
        call(m)
    assert [r["memory"] for r in m.get_all(user_id="a")["results"]] == ["kept"]


def test_chat_accepts_v2_top_k(m: ClientAdapter) -> None:
    with pytest.raises(InvalidInputError, match="disagree"):  # parsed, then refused for disagreeing with limit
        m.chat("x", user_id="a", limit=3, top_k=2)


# ---- get / update / delete / history -----------------------------------------------------------------------


def test_api_round_trip(m: ClientAdapter) -> None:
    a = m.add("Likes chess", user_id="alice", metadata={"kind": "game"}, infer=False)["results"]
    m.add("Likes tennis", user_id="bob", infer=False)
    assert texts(m.search("chess", user_id="alice", limit=1)) == ["Likes chess"]
    assert texts(m.search("chess", filters={"user_id": "alice"}, top_k=1)) == ["Likes chess"]
    assert texts(m.get_all(filters={"AND": [{"user_id": "alice"}, {"kind": "game"}]})) == ["Likes chess"]
    assert m.get_all(user_id="alice", filters={"kind": "sport"})["results"] == []
    memory_id = a[0]["id"]
    assert m.get(memory_id)["memory"] == "Likes chess"  # type: ignore[index]
    m.update(memory_id, data="Likes chess and go")
    assert texts(m.search("go", user_id="alice", limit=1)) == ["Likes chess and go"]
    m.delete(memory_id)
    assert m.get(memory_id) is None
    rows = m.history(memory_id)
    assert [r["event"] for r in rows] == ["ADD", "UPDATE", "DELETE"]
    assert rows[-1]["old_memory"] == "Likes chess and go"
    with pytest.raises(MemoryNotFoundError):
        m.delete(memory_id)
    with pytest.raises(ScopeError):
        m.delete_all()
    with pytest.raises(ScopeError):
        m.search("x")
    with pytest.raises(InvalidInputError):
        m.add("x", user_id="a", metadata={"agent_id": "g"}, infer=False)
    assert m.delete_all(user_id="bob")["deleted"] == 1
    m.reset()
    m.add("Likes go", user_id="alice", infer=False)
    assert texts(m.get_all(user_id="alice")) == ["Likes go"]


def test_add_update_delete_history(m: ClientAdapter) -> None:
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


def test_add_update_delete_gives_three_history_rows(m: ClientAdapter) -> None:
    memory_id = m.add("Drinks tea", user_id="u", infer=False)["results"][0]["id"]
    m.update(memory_id, "Drinks green tea")
    m.delete(memory_id)
    rows = m.history(memory_id)
    assert [r["event"] for r in rows] == ["ADD", "UPDATE", "DELETE"]
    assert [r["created_at"] for r in rows] == sorted(r["created_at"] for r in rows)
    assert rows[2]["old_memory"] == "Drinks green tea"


def test_delete_all_keeps_other_scopes(m: ClientAdapter) -> None:
    m.add("Likes chess", user_id="alice", infer=False)
    bob_id = m.add("Likes tennis", user_id="bob", infer=False)["results"][0]["id"]
    out = m.delete_all(user_id="alice")
    assert out["deleted"] == 1
    assert m.get_all(user_id="alice")["results"] == []
    assert texts(m.get_all(user_id="bob")) == ["Likes tennis"]
    bob = m.db.get(bob_id)
    assert bob is not None
    if m.kind == "sync":  # the async client has no public index
        assert bob.vector_id in set(m.index.ids().tolist())
    assert texts(m.search("tennis", user_id="bob")) == ["Likes tennis"]
    with pytest.raises(ScopeError):
        m.delete_all()
    assert texts(m.get_all(user_id="bob")) == ["Likes tennis"]


def test_reset_then_add_works(m: ClientAdapter) -> None:
    m.add("Likes chess", user_id="alice", infer=False)
    m.reset()
    assert m.get_all(user_id="alice")["results"] == []
    if m.kind == "sync":  # the async client has no public index
        assert len(m.index) == 0
    m.add("Likes go", user_id="alice", infer=False)
    assert texts(m.search("go", user_id="alice")) == ["Likes go"]


def test_filters_restrict_search_and_get_all(m: ClientAdapter) -> None:
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


def test_same_fact_twice_is_one_memory(make: MakeClient) -> None:
    gen = ScriptedGenerator(facts=facts(PIP))
    m = make(gen)
    first = m.add(PIP, user_id="u")["results"]
    assert [(r["memory"], r["event"]) for r in first] == [(PIP, "ADD")]
    assert m.add(PIP, user_id="u")["results"] == []
    assert texts(m.get_all(user_id="u")) == [PIP]
    assert [r["event"] for r in m.history(first[0]["id"])] == ["ADD"]
    # The exact duplicate never reached the reconcile LLM.
    assert gen.titles() == ["ExtractedFacts", "ExtractedFacts"]


def test_thai_food_preference_is_updated(make: MakeClient) -> None:
    def update(messages: list[dict[str, str]]) -> str:
        (old,) = shown_memories(messages)
        answer = {"id": old["id"], "text": "Hates Thai food", "event": "UPDATE", "old_memory": old["text"]}
        return json.dumps({"memory": [answer]})

    gen = ScriptedGenerator(facts=[facts("Loves Thai food"), facts("Hates Thai food")], decisions=update)
    m = make(gen)
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


def test_thai_food_as_delete_plus_add_is_atomic(make: MakeClient) -> None:
    decisions = json.dumps(
        {
            "memory": [
                {"id": "0", "text": "", "event": "DELETE"},
                {"id": "new", "text": "Hates Thai food", "event": "ADD"},
            ]
        }
    )
    gen = ScriptedGenerator(facts=[facts("Loves Thai food"), facts("Hates Thai food")], decisions=decisions)
    m = make(gen)
    old_id = m.add("I love Thai food", user_id="u", run_id="r1")["results"][0]["id"]
    events = [(r["event"], r["memory"]) for r in m.add("I hate Thai food", user_id="u", run_id="r1")["results"]]
    assert events == [("DELETE", "Loves Thai food"), ("ADD", "Hates Thai food")]
    assert texts(m.get_all(user_id="u", run_id="r1")) == ["Hates Thai food"]
    assert [r["event"] for r in m.history(old_id)] == ["ADD", "DELETE"]
    assert m.history(old_id)[-1]["old_memory"] == "Loves Thai food"


def test_unknown_id_is_skipped_with_a_warning(make: MakeClient, caplog: pytest.LogCaptureFixture) -> None:
    answer = (
        '{"memory":[{"id":"0","text":"Lives in Porto","event":"UPDATE","old_memory":"Lives in Lisbon"},'
        '{"id":"9","text":"x","event":"DELETE"}]}'
    )
    gen = ScriptedGenerator(facts=facts("Lives in Porto"), decisions=answer)
    m = make(gen)
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


def test_reconcile_update_and_unknown_id(make: MakeClient) -> None:
    def update(messages: list[dict[str, str]]) -> str:
        shown = shown_memories(messages)
        lisbon = next(s["id"] for s in shown if s["text"] == "Lives in Lisbon")
        return json.dumps(
            {
                "memory": [
                    {"id": lisbon, "text": "Lives in Porto", "event": "UPDATE", "old_memory": "Lives in Lisbon"},
                    {"id": "9", "text": "x", "event": "DELETE"},
                ]
            }
        )

    gen = ScriptedGenerator(facts=[facts("Lives in Lisbon"), facts("Lives in Porto")], decisions=update)
    m = make(gen)
    first = m.add("I live in Lisbon", user_id="u")["results"]
    second = m.add("I moved to Porto", user_id="u")["results"]
    assert [(r["id"], r["event"]) for r in second] == [(first[0]["id"], "UPDATE")]
    assert texts(m.get_all(user_id="u")) == ["Lives in Porto"]


def test_prose_and_fenced_json_from_an_endpoint(make: MakeClient) -> None:
    raw = 'Sure! Here is what I found:\n```json\n{"facts": ["Owns a red bicycle"]}\n```\nLet me know if you need more.'
    m = make(ScriptedGenerator(facts=raw))
    assert texts(m.add("I ride my red bike to work", user_id="u")) == ["Owns a red bicycle"]
    assert texts(m.get_all(user_id="u")) == ["Owns a red bicycle"]


def test_unparseable_reconcile_answer_writes_nothing(make: MakeClient) -> None:
    gen = ScriptedGenerator(facts=[facts("Likes tea"), facts("Likes green tea")], decisions="I cannot help with that.")
    m = make(gen)
    m.add("I like tea", user_id="u")
    with pytest.raises(ExtractionError):
        m.add("I like green tea", user_id="u")
    assert texts(m.get_all(user_id="u")) == ["Likes tea"]


def test_chinese_fact_is_kept_verbatim(make: MakeClient) -> None:
    fact = "林晓雨在青木科技做产品经理"
    m = make(ScriptedGenerator(facts=facts("名字是林晓雨", fact)))
    m.add([{"role": "user", "content": "我叫林晓雨，在青木科技做产品经理。"}], user_id="cn1")
    stored = texts(m.get_all(user_id="cn1"))
    assert stored == ["名字是林晓雨", fact]
    assert texts(m.search("林晓雨在哪里工作？", user_id="cn1", limit=1)) == [fact]
    assert m.get_all(user_id="cn1", filters={"user_id": "cn1"})["results"][1]["memory"] == fact


def test_long_conversation_is_extracted_in_chunks(make: MakeClient) -> None:
    seen: list[str] = []

    def extract(messages: list[dict[str, str]]) -> str:
        conversation = messages[-1]["content"]
        seen.append(conversation)
        marker = re.search(r"topic\d+", conversation)
        return facts(f"Discussed {marker.group(0) if marker else 'nothing'}")

    embedder = HashEmbedder()
    m = make(ScriptedGenerator(facts=extract), embedder=embedder)
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


def test_ungrounded_facts_are_dropped_and_the_turn_kept(make: MakeClient) -> None:
    message = "我叫林晓雨，在青木科技做产品经理。"
    gen = ScriptedGenerator(facts=facts("User will fly to Rome on 3 July", "User hates flying"))
    m = make(gen)
    assert texts(m.add(message, user_id="cn1")) == [message]
    gen = ScriptedGenerator(facts=facts("User will eat walnuts on 3 July", "User has a nut allergy"))
    m = make(gen)
    assert texts(m.add("I'm allergic to walnuts.", user_id="a")) == ["User has a nut allergy"]


def test_reconcile_off_only_adds(tmp_path: Path, db_url: str, make: MakeClient) -> None:
    from inferscale.config import LLMConfig

    gen = ScriptedGenerator(facts=[facts("Likes tea"), facts("Likes green tea")])
    config = fake_config(tmp_path, db_url, llm=LLMConfig(reconcile=False))
    m = make(gen, config=config)
    m.add("I like tea", user_id="u")
    m.add("I like green tea", user_id="u")
    assert texts(m.get_all(user_id="u")) == ["Likes tea", "Likes green tea"]
    assert gen.titles() == ["ExtractedFacts", "ExtractedFacts"]


def test_index_catches_up_with_another_client(make: MakeClient) -> None:
    a = make()
    b = make()
    a.add("Likes chess", user_id="u", infer=False)
    # Both clients load their index now (a search does, on either kind), before b adds behind a's back.
    assert texts(a.search("chess", user_id="u", limit=1)) == texts(b.search("chess", user_id="u", limit=1))
    if a.kind == "sync":  # the async client has no public index
        assert len(a.index) == 1
        assert len(b.index) == 1
    b.add("Likes tennis", user_id="u", infer=False)
    assert texts(a.search("tennis", user_id="u", limit=1)) == ["Likes tennis"]
    if a.kind == "sync":
        assert np.isin(b.index.ids(), a.index.ids()).all()
