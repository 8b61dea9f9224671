"""Pure pieces of the memory layer: reconcile parsing and planning, conversation chunking, grounding."""

from __future__ import annotations

import json
import unicodedata

import pytest

from inferscale.errors import ExtractionError
from inferscale.memory import Message
from inferscale.memory.chunking import chunk_messages, estimate_tokens, split_text
from inferscale.memory.reconcile import Decision, build_reconcile_messages, parse_decisions, plan


def test_reconcile_answers_parse_tolerantly() -> None:
    fenced = 'Here you go:\n```json\n{"memory": [{"id": 0, "text": "x", "event": "update"}]}\n```'
    (decision,) = parse_decisions(fenced)
    assert (decision.id, decision.event) == ("0", "UPDATE")
    truncated = '{"memory": [{"id": "new", "text": "A", "event": "ADD"}, {"id": "0", "te'
    assert [d.text for d in parse_decisions(truncated)] == ["A"]
    assert parse_decisions('[{"id": "1", "text": "", "event": "NONE"}]')[0].event == "NONE"
    with pytest.raises(ExtractionError):
        parse_decisions("no json here")


def test_plan_maps_short_ids_and_skips_the_rest() -> None:
    decisions = parse_decisions(
        '{"memory": ['
        '{"id": "0", "text": "Lives in Porto", "event": "UPDATE"},'
        '{"id": "9", "text": "x", "event": "DELETE"},'
        '{"id": "0", "text": "", "event": "DELETE"},'
        '{"id": "1", "text": "", "event": "DELETE"},'
        '{"id": "new", "text": "Has a cat", "event": "ADD"},'
        '{"id": "new", "text": "  ", "event": "ADD"},'
        '{"id": "2", "text": "", "event": "DELETE"},'
        '{"id": "new", "text": "Will eat walnuts on 3 July", "event": "ADD"},'
        '{"id": "1", "text": "?", "event": "MERGE"}]}'
    )
    shown = [("uuid-a", "Lives in Lisbon"), ("uuid-b", "No longer works at Acme"), ("uuid-c", "Allergic to walnuts")]
    result = plan(decisions, shown, ["Lives in Porto", "Works at Acme", "Has a cat"])
    assert result.updates == [("uuid-a", "Lives in Porto")]
    assert result.deletes == ["uuid-b"]
    assert result.adds == ["Has a cat", "Works at Acme"]  # the forgotten fact is added as extracted
    # id 9 unknown, second action on 0, empty ADD, unrelated DELETE of 2, invented ADD, unknown event
    assert len(result.skipped) == 6


def test_reconcile_schema_is_strict_and_its_example_follows_it() -> None:
    from inferscale.memory.reconcile import _EXAMPLE_ANSWER, decisions_json_schema

    schema = decisions_json_schema(16, 200)
    assert schema["title"] == "MemoryDecisions"
    assert schema["properties"]["memory"]["maxItems"] == 16
    entry = schema["$defs"][schema["properties"]["memory"]["items"]["$ref"].rsplit("/", 1)[-1]]
    for obj in (schema, entry):  # OpenAI strict mode: every key required, no other key allowed
        assert obj["additionalProperties"] is False
        assert obj["required"] == list(obj["properties"])
    assert entry["properties"]["event"]["enum"] == ["ADD", "UPDATE", "DELETE", "NONE"]
    for item in _EXAMPLE_ANSWER["memory"]:
        assert set(item) == set(entry["properties"])
    assert [d.event for d in parse_decisions(json.dumps(_EXAMPLE_ANSWER))] == ["UPDATE", "ADD", "NONE"]


def test_reconcile_prompt_shows_short_ids_only() -> None:
    messages = build_reconcile_messages(["Likes tea"], ["Likes coffee"])
    assert '"id": "0"' in messages[-1]["content"] and "Likes coffee" in messages[-1]["content"]


def test_chunking_respects_the_budget() -> None:
    assert estimate_tokens("abc") == 1 and estimate_tokens("林晓雨") == 3
    text = "word " * 1000
    pieces = split_text(text, 100)
    assert all(estimate_tokens(p) <= 100 for p in pieces)
    assert " ".join(pieces).split() == text.split()
    cjk = "林" * 500
    assert "".join(split_text(cjk, 100)) == cjk
    messages = [Message("user", "hello there " * 30), Message("assistant", "ok"), Message("user", "x " * 2000)]
    chunks = chunk_messages(messages, 200)
    assert len(chunks) > 2
    assert all(sum(estimate_tokens(m.content) + 4 for m in chunk) <= 200 for chunk in chunks)
    assert chunk_messages(messages[:2], 10_000) == [messages[:2]]


def test_none_must_name_a_memory_that_holds_the_fact() -> None:
    shown = [("uuid-a", "Works at Acme as a nurse"), ("uuid-b", "林晓雨在青木科技工作")]
    answer = parse_decisions(
        '{"memory": ['
        '{"id": "0", "text": "Works at Acme", "event": "NONE"},'
        '{"id": "1", "text": "林晓雨在青木科技工作", "event": "NONE"},'
        '{"id": "7", "text": "Has a cat named Miso", "event": "NONE"},'
        '{"id": "0", "text": "Runs every Sunday", "event": "NONE"}]}'
    )
    result = plan(answer, shown, ["Works at Acme", "林晓雨在青木科技工作", "Has a cat named Miso", "Runs every Sunday"])
    assert result.adds == ["Has a cat named Miso", "Runs every Sunday"]
    assert result.updates == [] and result.deletes == []


def test_a_fact_the_answer_forgets_is_added() -> None:
    from mem0_fakes import ScriptedGenerator

    from inferscale.memory.reconcile import Reconciler

    shown = [("uuid-a", "Likes tea")]
    forgetful = Reconciler(ScriptedGenerator(decisions='{"memory": []}'))
    assert forgetful.decide(shown, ["Has a cat named Miso"]).adds == ["Has a cat named Miso"]
    confirmed = Reconciler(
        ScriptedGenerator(decisions='{"memory": [{"id": "0", "text": "Likes tea", "event": "NONE"}]}')
    )
    assert confirmed.decide(shown, ["Likes tea"]).adds == []


@pytest.mark.parametrize(
    ("fact", "conversation", "grounded"),
    [
        ("User will fly to Rome on 3 July", "我叫林晓雨，在青木科技做产品经理。", False),  # seen from SmolLM2-135M
        ("User hates flying", "我叫林晓雨，在青木科技做产品经理。", False),
        ("林晓雨在青木科技做产品经理", "我叫林晓雨，在青木科技做产品经理。", True),
        ("User will eat walnuts on 3 July", "I'm allergic to walnuts.", False),
        ("User has a nut allergy", "I'm allergic to walnuts.", True),
        ("Owns a red bicycle", "I ride my red bike to work", True),
        ("User was born on June 14", "My partner Daniel was born on june 14.", True),
        ("Lives in Lisbon", "I live in Porto", False),
        # a worked example of the extraction prompt, copied (seen from SmolLM2-135M): no name or number to catch
        ("User hates flying", "Hi, my name is Maya and I live in Porto.", False),
        ("Maya hates flying", "Hi, my name is Maya and I live in Porto.", False),
        ("User hates flying", "I hate flying so much.", True),
        ("Ingrid loves hiking", "My wife Ingrid loves to hike.", True),
        # conversations that do say an example's fact: kept (a first version of the check dropped each of them)
        ("User's name is Tom", "My name is Tom.", True),
        ("User's name is Tom", "Hi, I'm Tom.", True),
        ("User will fly to Rome on 3 July", "I'm flying to Rome on 3 July.", True),
        ("Tom is a teacher from Oslo", "I'm Tom and I teach in Oslo.", True),
        # copied in another Unicode form (a tester's find: each was dropped as invented)
        ("User is Jos\u00e9 from Porto", "Hi, I am Jose\u0301 from Porto.", True),  # NFC fact, NFD conversation
        ("User is Jose\u0301 from Porto", "Hi, I am Jos\u00e9 from Porto.", True),  # and the other way round
        ("User PIN is 1234", "My PIN is \uff11\uff12\uff13\uff14", True),  # full-width digits
        ("\uff80\uff8f", "\uff80\uff8f\u3067\u3059", True),  # half-width katakana
        ("喜欢\U00020000", "我喜欢\U00020000。", True),  # an ideograph beyond the BMP
        ("User PIN is 1235", "My PIN is \uff11\uff12\uff13\uff14", False),
    ],
)
def test_grounding_catches_invented_names_numbers_and_language(fact: str, conversation: str, grounded: bool) -> None:
    from inferscale.memory import ungrounded_reason

    assert (ungrounded_reason(fact, conversation) is None) is grounded


def test_an_update_copied_in_another_unicode_form_is_grounded() -> None:
    """As the facts' check: an UPDATE whose text writes the new fact's name in NFD was skipped as ungrounded."""
    nfd = "Lives in Malmo\u0308 with Bjo\u0308rn and So\u0308ren"
    fact = unicodedata.normalize("NFC", nfd)
    decided = plan([Decision(id="0", text=nfd, event="UPDATE")], [("m1", "Lives in Oslo")], [fact])
    assert decided.updates == [("m1", nfd)] and decided.skipped == []


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("ㅋㅋㅋ 좋아", {"ᄏ", "좋", "아"}),  # compatibility jamo, which NFKC makes conjoining ones (a review's find)
        ("ㇰㇱ ㄅㄆ", {"ㇰ", "ㇱ", "ㄅ", "ㄆ"}),  # katakana extensions, Bopomofo
        ("喜欢\U00020000 ok", {"喜", "欢", "\U00020000", "ok"}),  # an ideograph beyond the BMP (extension B)
    ],
)
def test_cjk_words_are_compared_character_by_character(text: str, tokens: set[str]) -> None:
    from inferscale.memory.reconcile import _tokens

    assert _tokens(text) == tokens


def test_reconcile_answers_are_repaired_or_fall_back_to_adding_the_facts() -> None:
    from inferscale.memory.reconcile import Reconciler, read_decisions

    reading = read_decisions('{"memory": [{"id": "0", "text": "Lives in \\ud83dPorto", "event": "UPDATE"}, 5]}')
    assert [(d.id, d.text, d.event) for d in reading.value or []] == [("0", "Lives in Porto", "UPDATE")]
    assert len(reading.repairs) == 2  # the surrogate and the entry that is not a decision
    assert read_decisions('{"memory": [5, "x"]}').value is None
    assert read_decisions('{"memory": []}').value == []

    class Garbage:
        calls = 0

        def generate_json(self, messages: list[dict[str, str]], schema: dict[str, object], budget: int) -> str:
            self.calls += 1
            return '{"memory": "no"}'

    generator = Garbage()
    decided = Reconciler(generator).decide([("m1", "Lives in Lisbon")], ["Lives in Porto", "Has a cat"])
    assert (decided.adds, decided.updates, decided.deletes) == (["Lives in Porto", "Has a cat"], [], [])
    assert generator.calls == 2  # asked once more before falling back


def _decisions(*items: dict[str, object]) -> list[Decision]:
    return [Decision.model_validate(item) for item in items]


TEA = [("m0", "Likes tea")]


@pytest.mark.parametrize(
    "decisions",
    [
        _decisions({"event": "ADD", "text": "Likes tea"}, {"id": "0", "event": "DELETE"}),
        _decisions({"id": "0", "event": "DELETE"}, {"event": "ADD", "text": "Likes tea"}),
        _decisions({"id": "0", "event": "NONE"}, {"id": "0", "event": "DELETE"}),
    ],
    ids=["add-then-delete", "delete-then-add", "none-then-delete"],
)
def test_a_fact_whose_memory_the_answer_deletes_is_kept(decisions: list[Decision]) -> None:
    """A review's find: an ADD repeating a stored text counted as that memory's NONE, and the DELETE of the memory
    that followed was applied, so the fact was lost (a small model's "delete it, add it again"). The same held for
    a NONE on a memory the answer then deletes."""
    result = plan(decisions, TEA, ["Likes tea"])
    assert (result.adds, result.deletes, result.confirmed) == (["Likes tea"], ["m0"], [])


def test_a_text_the_answer_gives_twice_is_stored_once() -> None:
    decisions = _decisions(
        {"event": "ADD", "text": "Likes black tea"},
        {"event": "ADD", "text": "likes BLACK tea"},
        {"id": "0", "event": "UPDATE", "text": "Likes black tea"},
    )
    result = plan(decisions, TEA, ["Likes black tea"])
    assert (result.adds, result.updates) == ([], [("m0", "Likes black tea")])  # the memory it refines, once


def test_a_wrapped_reconcile_answer_is_read() -> None:
    wrapped = '{"result": {"memory": [{"id": "0", "text": "", "event": "NONE"}]}}'
    assert [(d.id, d.event) for d in parse_decisions(wrapped)] == [("0", "NONE")]
