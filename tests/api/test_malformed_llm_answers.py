"""A malformed LLM answer never loses the user's message (issue 15, item 6). For every class of malformed extraction
and reconcile answer, ``add(infer=True)`` returns normally and stores either the repaired facts or, when nothing
usable can be had even after one more call, the user's turns verbatim (extraction) or the facts as extracted
(reconcile); it logs a warning and writes nothing else. Every case runs on every client kind, on SQLite and on
PostgreSQL; the classes are those of :mod:`inferscale.memory.answers`."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import pytest
from client_adapter import ClientAdapter, MakeClient
from mem0_fakes import ScriptedGenerator, facts

from inferscale import MemoryConfig

S = "\ud83d"  # a lone high surrogate: half of an emoji, as models emit on mixed CJK/emoji input
CONVERSATION = [
    {"role": "user", "content": "I like green tea and dark coffee."},
    {"role": "assistant", "content": "Noted! Anything else?"},
    {"role": "user", "content": "My cat Miso is 4."},
]
USER_TURNS = ["I like green tea and dark coffee.", "My cat Miso is 4."]
TWO = ["Likes green tea", "Likes dark coffee"]
RepairedCase = tuple[str, str, list[str], str]

# (id, extraction answer, stored texts, a word of the warning)
EXTRACTION_REPAIRED: list[RepairedCase] = [
    ("surrogate-escape", '{"facts": ["Likes \\ud83dgreen tea", "Likes dark coffee"]}', TWO, "lone surrogate"),
    ("surrogate-char", facts(f"Likes green tea {S}", "Likes dark coffee"), TWO, "lone surrogate"),
    ("low-surrogate-escape", '{"facts": ["Likes green tea\\udc00"]}', ["Likes green tea"], "lone surrogate"),
    ("nul-escape", '{"facts": ["Has a cat named\\u0000 Miso"]}', ["Has a cat named Miso"], "NUL"),
    ("nul-char", '{"facts": ["Has a cat named\x00 Miso"]}', ["Has a cat named Miso"], "NUL"),
    ("control-char", '{"facts": ["Has a cat\x01named Miso"]}', ["Has a cat named Miso"], "control character"),
    ("not-a-string", '{"facts": [42, {"a": 1}, "Likes dark coffee"]}', ["Likes dark coffee"], "valid string"),
    ("empty-fact", '{"facts": ["", "   ", "Likes dark coffee"]}', ["Likes dark coffee"], "at least 1 character"),
    ("over-long", json.dumps({"facts": ["Likes tea " * 30, "Likes dark coffee"]}), ["Likes dark coffee"], "at most"),
]

# (id, extraction answer that holds nothing usable, given on both calls)
EXTRACTION_UNUSABLE: list[tuple[str, str]] = [
    ("prose", "I cannot help with that."),
    ("empty", ""),
    ("truncated-before-a-value", '{"fa'),
    ("wrong-shape-string", '{"facts": "Likes green tea"}'),
    ("wrong-key", '{"memories": 3}'),
    ("only-bad-items", '{"facts": [1, null, ""]}'),
    ("only-a-surrogate", '{"facts": ["\\ud83d"]}'),
    ("only-over-long", json.dumps({"facts": ["x" * 201]})),
    # a tester's finds: these were read as "nothing to remember", or their list as the facts, and lost the turns
    ("cut-inside-its-first-fact", '{"facts": ["Likes green te'),
    ("cut-after-the-bracket", '{"facts": ['),
    ("a-list-under-another-key", '{"items": ["Likes green tea"]}'),
    ("a-list-beside-a-wrong-shape", '{"facts": "none", "discarded": ["Likes green tea"]}'),
]


def texts(m: ClientAdapter, user_id: str = "u") -> list[str]:
    return [str(r["memory"]) for r in m.get_all(user_id=user_id)["results"]]


def warnings(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


@pytest.mark.parametrize(
    ("answer", "stored", "word"), [c[1:] for c in EXTRACTION_REPAIRED], ids=[c[0] for c in EXTRACTION_REPAIRED]
)
def test_a_repairable_extraction_answer_is_repaired(
    make: MakeClient,
    row_counts: Callable[[], tuple[int, int]],
    caplog: pytest.LogCaptureFixture,
    answer: str,
    stored: list[str],
    word: str,
) -> None:
    gen = ScriptedGenerator(facts=answer)
    m = make(gen)
    with caplog.at_level(logging.WARNING):
        results = m.add(CONVERSATION, user_id="u")["results"]
    assert [(r["memory"], r["event"]) for r in results] == [(text, "ADD") for text in stored]
    assert texts(m) == stored
    assert row_counts() == (len(stored), len(stored))
    assert "repaired the LLM answer" in warnings(caplog) and word in warnings(caplog)
    assert gen.titles() == ["ExtractedFacts"]  # a repair needs no second call


@pytest.mark.parametrize("answer", [c[1] for c in EXTRACTION_UNUSABLE], ids=[c[0] for c in EXTRACTION_UNUSABLE])
def test_an_unusable_extraction_answer_keeps_the_user_turns_verbatim(
    make: MakeClient, row_counts: Callable[[], tuple[int, int]], caplog: pytest.LogCaptureFixture, answer: str
) -> None:
    gen = ScriptedGenerator(facts=answer)
    m = make(gen)
    with caplog.at_level(logging.WARNING):
        results = m.add(CONVERSATION, user_id="u")["results"]
    assert [(r["memory"], r["event"]) for r in results] == [(text, "ADD") for text in USER_TURNS]
    assert texts(m) == USER_TURNS
    assert row_counts() == (2, 2)
    assert "asking once more" in warnings(caplog) and "storing 2 user turns verbatim" in warnings(caplog)
    assert gen.titles() == ["ExtractedFacts", "ExtractedFacts"]  # one retry, then the fallback


def test_an_unusable_extraction_answer_is_asked_for_once_more(
    make: MakeClient, row_counts: Callable[[], tuple[int, int]], caplog: pytest.LogCaptureFixture
) -> None:
    """The greedy default model would repeat itself on the same prompt, so the retry shows the unusable answer and
    names its problem; the second answer is used."""
    gen = ScriptedGenerator(facts=["Sure! The user likes tea.", facts("Likes green tea", "Has a cat named Miso")])
    m = make(gen)
    with caplog.at_level(logging.WARNING):
        m.add(CONVERSATION, user_id="u")
    assert texts(m) == ["Likes green tea", "Has a cat named Miso"]
    assert row_counts() == (2, 2)
    assert "asking once more" in warnings(caplog) and "verbatim" not in warnings(caplog)
    (_, first), (_, retry) = gen.calls
    assert retry[: len(first)] == first
    assert retry[len(first)] == {"role": "assistant", "content": "Sure! The user likes tea."}
    assert "could not be used" in retry[-1]["content"]


def test_a_lone_surrogate_in_the_retry_prompt_is_repaired_too(make: MakeClient) -> None:
    """The unusable answer is shown again to the LLM: a lone surrogate in it must not break the retry's request."""
    seen: list[str] = []

    def second(messages: list[dict[str, str]]) -> str:
        seen.append(messages[-2]["content"])
        return facts("Likes green tea")

    m = make(ScriptedGenerator(facts=[f"no facts {S} here", second]))
    m.add(CONVERSATION, user_id="u")
    assert texts(m) == ["Likes green tea"]
    assert seen == ["no facts  here"]


# ---- reconcile ------------------------------------------------------------------------------------------------

OLD = "Likes tea"
NEW = "Likes green tea"


def _update(text: str) -> str:
    return json.dumps({"memory": [{"id": "0", "text": text, "event": "UPDATE", "old_memory": OLD}]}, ensure_ascii=False)


# (id, reconcile answer, stored texts, a word of the warning)
RECONCILE_REPAIRED: list[RepairedCase] = [
    ("surrogate-escape", _update("Likes green tea\\ud83d").replace("\\\\", "\\"), [NEW], "lone surrogate"),
    ("surrogate-char", _update(f"Likes green {S}tea"), [NEW], "lone surrogate"),
    ("nul-escape", _update("Likes green tea\\u0000").replace("\\\\", "\\"), [NEW], "NUL"),
    ("not-a-decision", '{"memory": [7, ' + _update(NEW)[len('{"memory": [') :], [NEW], "not a decision"),
    ("unknown-id", '{"memory": [{"id": "9", "text": "Likes green tea", "event": "UPDATE"}]}', [OLD, NEW], "'9'"),
    ("invalid-event", '{"memory": [{"id": "0", "text": "Likes green tea", "event": "MERGE"}]}', [OLD, NEW], "MERGE"),
    # a tester's finds: a null event read as NONE (the fact, which OLD nearly holds, was lost); an UPDATE text past
    # the schema's 200 characters stored (or, longer, failing the whole add)
    ("null-event", '{"memory": [{"id": "0", "text": "Likes green tea", "event": null}]}', [OLD, NEW], "event ''"),
    ("over-long-update", _update("Likes green tea " * 13), [OLD, NEW], "over max_text_chars (200)"),
]

# (id, reconcile answer that holds nothing usable, given on both calls)
RECONCILE_UNUSABLE: list[tuple[str, str]] = [
    ("prose", "I cannot help with that."),
    ("empty", ""),
    ("wrong-shape", '{"memory": "UPDATE"}'),
    ("only-bad-entries", '{"memory": [1, "x"]}'),
    ("cut-after-the-bracket", '{"memory": ['),
    ("a-list-under-another-key", '{"decisions": [' + _update(NEW)[len('{"memory": [') :]),
]


def _stored_old(make: MakeClient, decisions: str | list[str]) -> tuple[ClientAdapter, ScriptedGenerator, str]:
    gen = ScriptedGenerator(facts=facts(NEW), decisions=decisions)
    m = make(gen)
    old_id = str(m.add(OLD, user_id="u", infer=False)["results"][0]["id"])
    return m, gen, old_id


@pytest.mark.parametrize(
    ("answer", "stored", "word"), [c[1:] for c in RECONCILE_REPAIRED], ids=[c[0] for c in RECONCILE_REPAIRED]
)
def test_a_repairable_reconcile_answer_is_repaired(
    make: MakeClient,
    row_counts: Callable[[], tuple[int, int]],
    caplog: pytest.LogCaptureFixture,
    answer: str,
    stored: list[str],
    word: str,
) -> None:
    m, gen, old_id = _stored_old(make, answer)
    with caplog.at_level(logging.WARNING):
        results = m.add("I like green tea now", user_id="u")["results"]
    assert texts(m) == stored
    if stored == [NEW]:  # the UPDATE, repaired, applies to the stored memory
        assert [(r["id"], r["event"], r["memory"]) for r in results] == [(old_id, "UPDATE", NEW)]
        assert [h["event"] for h in m.history(old_id)] == ["ADD", "UPDATE"]
        assert row_counts() == (1, 2)
    else:  # the decision is skipped and the fact it does not account for is added
        assert [(r["event"], r["memory"]) for r in results] == [("ADD", NEW)]
        assert row_counts() == (2, 2)
    assert word in warnings(caplog)
    assert gen.titles() == ["ExtractedFacts", "MemoryDecisions"]


@pytest.mark.parametrize("answer", [c[1] for c in RECONCILE_UNUSABLE], ids=[c[0] for c in RECONCILE_UNUSABLE])
def test_an_unusable_reconcile_answer_adds_the_facts_as_extracted(
    make: MakeClient, row_counts: Callable[[], tuple[int, int]], caplog: pytest.LogCaptureFixture, answer: str
) -> None:
    m, gen, old_id = _stored_old(make, answer)
    with caplog.at_level(logging.WARNING):
        results = m.add("I like green tea now", user_id="u")["results"]
    assert [(r["event"], r["memory"]) for r in results] == [("ADD", NEW)]
    assert texts(m) == [OLD, NEW]
    assert row_counts() == (2, 2)
    assert [h["event"] for h in m.history(old_id)] == ["ADD"]
    assert "asking once more" in warnings(caplog) and "adding the 1 new facts as extracted" in warnings(caplog)
    assert gen.titles() == ["ExtractedFacts", "MemoryDecisions", "MemoryDecisions"]


def test_an_unusable_reconcile_answer_is_asked_for_once_more(
    make: MakeClient, row_counts: Callable[[], tuple[int, int]]
) -> None:
    m, gen, old_id = _stored_old(make, ["I cannot help with that.", _update(NEW)])
    results = m.add("I like green tea now", user_id="u")["results"]
    assert [(r["id"], r["event"], r["memory"]) for r in results] == [(old_id, "UPDATE", NEW)]
    assert texts(m) == [NEW]
    assert row_counts() == (1, 2)
    assert gen.titles() == ["ExtractedFacts", "MemoryDecisions", "MemoryDecisions"]


def test_a_bracket_in_prose_before_the_json_does_not_hide_it(
    make: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    """A tester's find: ``[2]`` was read as the answer's list, its one fact (a number) unusable, and the facts after
    it never read; the turns were stored verbatim after a second call. Now the next value is tried."""
    gen = ScriptedGenerator(facts=f"I found [2] facts: {facts(*TWO)}")
    m = make(gen)
    with caplog.at_level(logging.WARNING, logger="inferscale.memory"):
        m.add(CONVERSATION, user_id="u")
    assert texts(m) == TWO
    assert gen.titles() == ["ExtractedFacts"]
    assert not [r for r in caplog.records if r.name.startswith("inferscale.memory")]  # nothing repaired or dropped


def test_reconcile_stores_a_text_the_answer_gives_twice_once(
    make: MakeClient, row_counts: Callable[[], tuple[int, int]]
) -> None:
    """A tester's find: two ADDs of one text (differing in case) left it twice in the scope."""
    gen = ScriptedGenerator(
        facts=facts("Likes black tea"),
        decisions=json.dumps(
            {
                "memory": [
                    {"id": "new", "text": "Likes black tea", "event": "ADD", "old_memory": None},
                    {"id": "new", "text": "likes BLACK tea", "event": "ADD", "old_memory": None},
                ]
            }
        ),
    )
    m = make(gen)
    m.add(OLD, user_id="u", infer=False)
    m.add("I like black tea", user_id="u")
    assert sorted(texts(m)) == ["Likes black tea", OLD]
    assert row_counts() == (2, 2)


def test_an_over_long_user_turn_kept_verbatim_is_cut_into_memories_of_at_most_max_memory_chars(
    make: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The fallback stores facts, not documents: the limit ``add(infer=False)`` holds to holds here too."""
    words = [f"word{i}" for i in range(1500)]  # 10,390 characters with the spaces
    m = make(ScriptedGenerator(facts="I cannot help with that."))
    with caplog.at_level(logging.WARNING):
        m.add(" ".join(words), user_id="u")
    stored = texts(m)
    limit = MemoryConfig().max_memory_chars
    assert len(stored) > 1 and all(0 < len(text) <= limit for text in stored)
    assert " ".join(stored).split() == words  # cut at spaces, nothing lost or reordered
    assert "verbatim" in warnings(caplog)
