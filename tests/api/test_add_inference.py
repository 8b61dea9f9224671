"""add(infer=True) on both clients with fakes (no model loads): fact extraction, the reconcile decisions and their
atomic writes, chunking, grounding, and the index catching up with another client. Every test runs on MemoryClient
and AsyncMemoryClient (through ``client_adapter``), each on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest
from client_adapter import REMOTE_KINDS, MakeClient
from mem0_fakes import (
    HashEmbedder,
    ScriptedGenerator,
    facts,
    fake_config,
    shown_memories,
)

from inferscale.config import LLMConfig
from inferscale.errors import ExtractionError
from inferscale.server.errors import EXTRACTION_FAILED_MESSAGE


def texts(results: dict[str, list[dict[str, object]]]) -> list[object]:
    return [r["memory"] for r in results["results"]]


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


def test_a_fact_only_a_narrower_scope_holds_is_stored_for_the_broader_one(make: MakeClient) -> None:
    """The duplicate check used to match the scope's ids ANDed, so a fact stored for run r1 of agent a1 of u1 made
    the same fact for u1 alone a duplicate, dropped; ``delete_all(user_id="u1", agent_id="a1")`` then took it, and
    u1 was left without it. A duplicate is now a text stored in exactly the scope."""
    add_it = json.dumps({"memory": [{"id": "new", "text": PIP, "event": "ADD"}]})
    m = make(ScriptedGenerator(facts=facts(PIP), decisions=add_it))
    m.add(PIP, user_id="u1", agent_id="a1", run_id="r1")
    assert [(r["memory"], r["event"]) for r in m.add(PIP, user_id="u1")["results"]] == [(PIP, "ADD")]
    assert m.add(PIP, user_id="u1")["results"] == []  # stored in exactly u1 now: a duplicate there
    assert m.delete_all(user_id="u1", agent_id="a1")["deleted"] == 1
    kept = m.get_all(user_id="u1")["results"]
    assert [(r["memory"], r.get("agent_id"), r.get("run_id")) for r in kept] == [(PIP, None, None)]


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


def test_an_update_to_the_text_another_memory_holds_deletes_the_updated_memory(make: MakeClient) -> None:
    """The last stop's find: the LLM updated "Likes cheese pizza" to the text "Loves cheese and pepperoni pizza"
    already held, and the user had two memories with one text (an ADD of it was skipped as a duplicate). The memory
    it meant to rewrite is deleted instead: its new text is held, and its old one superseded."""
    likes, loves = "Likes cheese pizza", "Loves cheese and pepperoni pizza"

    def update(messages: list[dict[str, str]]) -> str:
        old = next(m for m in shown_memories(messages) if m["text"] == likes)
        return json.dumps({"memory": [{"id": old["id"], "text": loves, "event": "UPDATE", "old_memory": likes}]})

    m = make(ScriptedGenerator(facts=facts("Loves pepperoni and cheese pizza"), decisions=update))
    kept = [m.add(text, user_id="u", infer=False)["results"][0]["id"] for text in (likes, loves)]
    results = m.add("I love pepperoni and cheese pizza", user_id="u")["results"]
    assert [(r["id"], r["memory"], r["event"]) for r in results] == [(kept[0], likes, "DELETE")]
    assert texts(m.get_all(user_id="u")) == [loves]
    assert [[h["event"] for h in m.history(memory_id)] for memory_id in kept] == [["ADD", "DELETE"], ["ADD"]]


def test_an_update_decided_by_add_takes_the_calls_metadata(make: MakeClient) -> None:
    """A tester's find: the UPDATE kept only the memory's old metadata, so a caller tagging each add (its source, its
    session) lost the tag of the call that changed the memory. Merged key by key, as update() merges."""

    def update(messages: list[dict[str, str]]) -> str:
        (old,) = shown_memories(messages)
        answer = {"id": old["id"], "text": "Lives in Lisbon", "event": "UPDATE", "old_memory": old["text"]}
        return json.dumps({"memory": [answer]})

    m = make(ScriptedGenerator(facts=[facts("Lives in Porto"), facts("Lives in Lisbon")], decisions=update))
    memory_id = m.add("I live in Porto", user_id="u", metadata={"src": 1, "kept": "yes"})["results"][0]["id"]
    changed = m.add("I moved to Lisbon", user_id="u", metadata={"src": 2})["results"]
    assert [(r["id"], r["event"]) for r in changed] == [(memory_id, "UPDATE")]
    got = m.get(memory_id)
    assert got is not None and (got["memory"], got["metadata"]) == ("Lives in Lisbon", {"src": 2, "kept": "yes"})
    last = m.history(memory_id)[-1]
    assert (last["old_metadata"], last["new_metadata"]) == ({"src": 1, "kept": "yes"}, {"src": 2, "kept": "yes"})


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


def test_unparseable_reconcile_answer_adds_the_fact(make: MakeClient) -> None:
    """Issue 15 item 6 (more classes in test_malformed_llm_answers.py): asked once more, then the fact is added."""
    gen = ScriptedGenerator(facts=[facts("Likes tea"), facts("Likes green tea")], decisions="I cannot help with that.")
    m = make(gen)
    m.add("I like tea", user_id="u")
    assert texts(m.add("I like green tea", user_id="u")) == ["Likes green tea"]
    assert texts(m.get_all(user_id="u")) == ["Likes tea", "Likes green tea"]
    assert gen.titles() == ["ExtractedFacts", "ExtractedFacts", "MemoryDecisions", "MemoryDecisions"]


def test_a_failing_llm_backend_is_an_extraction_error_and_writes_nothing(make: MakeClient) -> None:
    """An LLM that gives no answer at all (unreachable, an HTTP error) is not a malformed answer: add raises
    ExtractionError, stores nothing, and the caller may try again later."""

    def down(messages: list[dict[str, str]]) -> str:
        raise ExtractionError("request to http://llm.local/v1/chat/completions failed: ConnectError")

    m = make(ScriptedGenerator(facts=[facts("Likes tea"), down]))
    m.add("I like tea", user_id="u")
    with pytest.raises(ExtractionError) as failed:
        m.add("I like green tea", user_id="u")
    # a server keeps the backend's URL and reply to its log (tests/server/test_server_errors.py)
    told = f"{EXTRACTION_FAILED_MESSAGE} (request " if m.kind in REMOTE_KINDS else "request to http://llm.local"
    assert str(failed.value).startswith(told)
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
    turn = "I'm allergic to walnuts."
    assert texts(m.add(turn, user_id="a")) == ["User has a nut allergy", turn]  # a fact was dropped: the turn too


def test_a_dropped_fact_with_only_stored_ones_beside_it_keeps_the_turn(make: MakeClient) -> None:
    """The grounding check dropped one fact and the other was stored already: ``add`` stored nothing and answered
    ``results: []``, so the move to Paris was lost (found by the embedded SmolLM2 on these turns). The user's turn is
    now stored verbatim whenever a fact was dropped."""
    pizza = "User loves pizza"
    moved = "I moved from Berlin to Paris. I no longer love pizza."
    gen = ScriptedGenerator(facts=[facts(pizza), facts("User will move to Paris on 3 July", pizza)])
    m = make(gen)
    assert texts(m.add("I live in Berlin and I love pizza.", user_id="z")) == [pizza]
    assert [(r["memory"], r["event"]) for r in m.add(moved, user_id="z")["results"]] == [(moved, "ADD")]
    assert sorted(texts(m.get_all(user_id="z"))) == sorted([pizza, moved])
    # the same turn again: the fallback is stored already too, so nothing is new
    gen.answers["ExtractedFacts"] = [facts("User will move to Paris on 3 July", pizza)]
    assert m.add(moved, user_id="z")["results"] == []


@pytest.mark.parametrize(
    ("decisions", "why"),
    [
        ("", "the other fact is new"),
        (json.dumps({"memory": [{"id": "0", "text": "User loves pizza", "event": "NONE"}]}), "reconcile says NONE"),
    ],
)
def test_a_dropped_fact_keeps_the_turn_whatever_becomes_of_the_others(
    make: MakeClient, decisions: str, why: str
) -> None:
    """The review's two other cases of the same loss: the other fact is new (only it was stored), or it paraphrases a
    stored memory and reconcile answers NONE (nothing was stored). The turn is stored in both."""
    moved = "I moved from Berlin to Paris. I no longer love pizza."
    other = "User has a cat" if why == "the other fact is new" else "User likes pizza"
    gen = ScriptedGenerator(facts=[facts("User loves pizza"), facts("User will move to Paris on 3 July", other)])
    gen.answers["MemoryDecisions"] = [decisions]
    m = make(gen)
    m.add("I love pizza.", user_id="z")
    m.add(moved, user_id="z")
    assert moved in texts(m.get_all(user_id="z")), why


def test_a_turn_kept_for_a_dropped_fact_is_stored_once_across_chunks(make: MakeClient) -> None:
    """Three chunks (a message longer than a chunk between two short ones), each dropping a fact: the last chunk's
    turn repeats the first's in capitals and is stored once, as the kept fact every chunk gives is."""
    turn = "I fly to Lisbon."
    calls: list[str] = []

    def extract(messages: list[dict[str, str]]) -> str:
        calls.append(messages[-1]["content"])
        return facts("User will fly on 3 July", "User flies to Lisbon")

    m = make(ScriptedGenerator(facts=extract))
    filler = "We talked about the weather, the harbour and the trains again today. " * 120
    said = [{"role": "user", "content": text} for text in (turn, filler, turn.upper())]
    stored = [t.casefold() for t in texts(m.add(said, user_id="u"))]
    assert len(calls) == 3
    assert stored.count(turn.casefold()) == 1 and stored.count("user flies to lisbon") == 1, stored
    assert len(stored) == len(set(stored))


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


def test_tool_results_are_neither_shown_to_extraction_nor_its_grounding(make: MakeClient) -> None:
    """Mem0 leaves tool results out of extraction. A fact whose name only a tool result holds is not grounded in
    what the user said: it is dropped and the user's turn is kept."""
    gen = ScriptedGenerator(facts=facts("User lives in Lisbon"))
    m = make(gen)
    turns = [
        {"role": "user", "content": "Will it rain today?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "Lisbon: rain from 3 pm"},
    ]
    assert texts(m.add(turns, user_id="u")) == ["Will it rain today?"]
    (extraction,) = [messages for title, messages in gen.calls if title == "ExtractedFacts"]
    assert "Lisbon" not in extraction[-1]["content"]


def test_assistant_turns_reach_extraction_only_when_configured(make: MakeClient, tmp_path: Path, db_url: str) -> None:
    """Mem0 2.x shows the extraction LLM the assistant's turns too (an agent's own facts); ours never could, whatever
    the model (a helper's find). ``llm.include_assistant`` shows them; off by default (the 135M model's choice)."""
    said = [
        {"role": "user", "content": "Hi, who are you?"},
        {"role": "assistant", "content": "I am Nova, a travel agent for Lisbon trips."},
    ]
    default = ScriptedGenerator(facts=facts("User asked who the agent is"))
    make(default).add(said, agent_id="nova")
    assert [messages[-1]["content"] for _, messages in default.calls] == ["user: Hi, who are you?"]
    assert make(default).add(said[1:], agent_id="nova")["results"] == []  # nothing shown: no call
    assert len(default.calls) == 1
    shown = ScriptedGenerator(facts=facts("Nova is a travel agent for Lisbon trips"))
    config = fake_config(tmp_path / "shown", db_url, llm=LLMConfig(include_assistant=True))
    added = make(shown, config=config).add(said, agent_id="nova")
    assert [r["memory"] for r in added["results"]] == ["Nova is a travel agent for Lisbon trips"]
    assert (
        shown.calls[0][1][-1]["content"]
        == "user: Hi, who are you?\nassistant: I am Nova, a travel agent for Lisbon trips."
    )
