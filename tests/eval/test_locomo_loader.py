"""Tests for the LoCoMo loader against the real ``locomo10.json`` (read from ../shared, never copied).

Every count asserted here was computed from the file and matches ``shared/data/locomo/FORMAT.md``.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest

from inferscale.errors import InvalidInputError
from inferscale.eval import (
    DATE_TIME_FORMAT,
    UNANSWERABLE,
    LocomoConversation,
    LocomoTurn,
    get_conversation,
    load_locomo,
    parse_evidence,
    turn_text,
)

LOCOMO_PATH = Path(__file__).resolve().parents[2].parent / "shared/data/locomo/locomo10.json"

SAMPLE_IDS = [
    "conv-26", "conv-30", "conv-41", "conv-42", "conv-43",
    "conv-44", "conv-47", "conv-48", "conv-49", "conv-50",
]  # fmt: skip
SESSIONS = {
    "conv-26": 19, "conv-30": 19, "conv-41": 32, "conv-42": 29, "conv-43": 29,
    "conv-44": 28, "conv-47": 31, "conv-48": 30, "conv-49": 25, "conv-50": 30,
}  # fmt: skip
TURNS = {
    "conv-26": 419, "conv-30": 369, "conv-41": 663, "conv-42": 629, "conv-43": 680,
    "conv-44": 675, "conv-47": 689, "conv-48": 681, "conv-49": 509, "conv-50": 568,
}  # fmt: skip
QA_TOTAL = {
    "conv-26": 199, "conv-30": 105, "conv-41": 193, "conv-42": 260, "conv-43": 242,
    "conv-44": 158, "conv-47": 190, "conv-48": 239, "conv-49": 196, "conv-50": 204,
}  # fmt: skip
QA_PER_CATEGORY = {1: 282, 2: 321, 3: 96, 4: 841, 5: 446}

SKIP_REASON = f"LoCoMo data not found at {LOCOMO_PATH} (CC BY-NC licence: it is kept out of the repo)"
needs_locomo = pytest.mark.skipif(not LOCOMO_PATH.is_file(), reason=SKIP_REASON)


@pytest.fixture(scope="module")
def convs() -> list[LocomoConversation]:
    """All ten conversations, loaded once."""
    if not LOCOMO_PATH.is_file():
        pytest.skip(SKIP_REASON)
    return load_locomo(LOCOMO_PATH)


@needs_locomo
def test_conversation_ids_and_speakers(convs: list[LocomoConversation]) -> None:
    """Ten conversations in file order, each with two distinct, non-empty speaker names."""
    assert [c.sample_id for c in convs] == SAMPLE_IDS
    for conv in convs:
        assert conv.speaker_a and conv.speaker_b and conv.speaker_a != conv.speaker_b


@needs_locomo
def test_session_and_turn_counts(convs: list[LocomoConversation]) -> None:
    """Sessions come from session_<N> keys (conv-26 has 19, not 35), sorted, without gaps."""
    assert {c.sample_id: len(c.sessions) for c in convs} == SESSIONS
    assert sum(len(c.sessions) for c in convs) == 272
    assert {c.sample_id: len(c.turns) for c in convs} == TURNS
    assert sum(len(c.turns) for c in convs) == 5882
    for conv in convs:
        assert [s.index for s in conv.sessions] == list(range(1, len(conv.sessions) + 1))
        dates = [s.date_time for s in conv.sessions]
        assert dates == sorted(dates)
        for session in conv.sessions:
            assert all(t.dia_id.startswith(f"D{session.index}:") for t in session.turns)
            assert all(t.speaker in {conv.speaker_a, conv.speaker_b} for t in session.turns)


@needs_locomo
def test_session_dates_match_file(convs: list[LocomoConversation]) -> None:
    """Session datetimes are the parsed session_<N>_date_time strings; conv-26's spare dates add none."""
    raw = {c["sample_id"]: c["conversation"] for c in json.loads(LOCOMO_PATH.read_text(encoding="utf-8"))}
    for conv in convs:
        for session in conv.sessions:
            text = raw[conv.sample_id][f"session_{session.index}_date_time"]
            assert session.date_time == datetime.strptime(text, DATE_TIME_FORMAT)
            assert session.turns[0].dia_id == f"D{session.index}:1"
    conv26_dates = [k for k in raw["conv-26"] if k.endswith("_date_time")]
    assert len(conv26_dates) == 35
    assert len(get_conversation(convs, "conv-26").sessions) == 19


@needs_locomo
def test_captions(convs: list[LocomoConversation]) -> None:
    """1,226 turns carry a BLIP caption, and turn_text keeps it."""
    captioned = [t for c in convs for t in c.turns if t.blip_caption is not None]
    assert len(captioned) == 1226
    turn = captioned[0]
    assert turn_text(turn) == f"{turn.speaker}: {turn.text} [shares {turn.blip_caption}]"


@needs_locomo
def test_qa_counts_and_answers(convs: list[LocomoConversation]) -> None:
    """QA totals per conversation and per category; every answer is a str."""
    assert {c.sample_id: len(c.qa) for c in convs} == QA_TOTAL
    qa = [q for c in convs for q in c.qa]
    assert len(qa) == 1986
    assert Counter(q.category for q in qa) == QA_PER_CATEGORY
    assert sum(1 for q in qa if q.category != 5) == 1540
    assert all(isinstance(q.answer, str) and q.answer for q in qa)
    adversarial = [q for q in qa if q.category == 5]
    assert all(q.adversarial_answer for q in adversarial)
    assert sum(1 for q in adversarial if q.answer == UNANSWERABLE) == 444
    assert sum(1 for q in adversarial if q.answer == "No") == 2
    assert all(q.adversarial_answer is None for q in qa if q.category != 5)


@needs_locomo
def test_int_answers_become_str(convs: list[LocomoConversation]) -> None:
    """The six integer answers in the file are converted with str()."""
    raw = json.loads(LOCOMO_PATH.read_text(encoding="utf-8"))
    int_answers = [
        (c["sample_id"], i, q["answer"]) for c in raw for i, q in enumerate(c["qa"]) if isinstance(q.get("answer"), int)
    ]
    assert len(int_answers) == 6
    by_id = {c.sample_id: c for c in convs}
    for sample_id, index, value in int_answers:
        assert by_id[sample_id].qa[index].answer == str(value)


@needs_locomo
def test_evidence_is_normalised(convs: list[LocomoConversation]) -> None:
    """Evidence ids are all well formed; 4 category-3 items have none."""
    qa = [q for c in convs for q in c.qa]
    ids = [e for q in qa for e in q.evidence]
    assert all(e.startswith("D") and e[1:].replace(":", "", 1).isdigit() for e in ids)
    assert not any(":0" in e for e in ids)
    empty = [q for q in qa if not q.evidence]
    assert len(empty) == 4
    assert {q.category for q in empty} == {3}


@needs_locomo
def test_get_conversation_unknown_id(convs: list[LocomoConversation]) -> None:
    """An unknown id raises InvalidInputError listing the ids that exist."""
    with pytest.raises(InvalidInputError, match="conv-99") as info:
        get_conversation(convs, "conv-99")
    assert "conv-26" in str(info.value) and "conv-50" in str(info.value)


def test_records_are_frozen() -> None:
    """The loader's records are immutable."""
    turn = LocomoTurn(speaker="A", dia_id="D1:1", text="hi", blip_caption=None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        turn.text = "bye"  # type: ignore[misc]
    assert turn_text(turn) == "A: hi"


def test_parse_evidence_quirks() -> None:
    """Multi-id strings are split, padding stripped, and junk dropped (synthetic ids, not from the file)."""
    assert parse_evidence(["D8:6; D9:17", "D3:1 D4:4", "D:11:26", "D", "D30:05", "D2:7"]) == [
        "D8:6", "D9:17", "D3:1", "D4:4", "D11:26", "D30:5", "D2:7",
    ]  # fmt: skip


def test_missing_path_names_it(tmp_path: Path) -> None:
    """A path that does not exist raises InvalidInputError naming the path."""
    missing = tmp_path / "nope.json"
    with pytest.raises(InvalidInputError, match=r"nope\.json"):
        load_locomo(missing)


def test_bad_json_and_bad_shape(tmp_path: Path) -> None:
    """Invalid JSON and a wrong shape both raise InvalidInputError naming the file."""
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(InvalidInputError, match=r"bad\.json"):
        load_locomo(bad)
    bad.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")  # raised the parser's bare RecursionError
    with pytest.raises(InvalidInputError, match=r"bad\.json'?: it nests deeper"):
        load_locomo(bad)
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps([{"sample_id": "x", "conversation": {"session_1": []}}]), encoding="utf-8")
    with pytest.raises(InvalidInputError, match=r"'x'.*wrong\.json"):
        load_locomo(wrong)
    empty = tmp_path / "empty.json"  # `eval locomo` answered 0 questions from it and exited 0 (a new user's find)
    empty.write_text("[]", encoding="utf-8")
    with pytest.raises(InvalidInputError, match=r"empty\.json' must hold a JSON list of conversations, got an empty"):
        load_locomo(empty)


def test_sessions_sorted_and_date_only_keys_ignored(tmp_path: Path) -> None:
    """Synthetic file: sessions out of key order are sorted by N; a date key without turns adds no session."""
    conv = {
        "speaker_a": "Ann",
        "speaker_b": "Bob",
        "session_2": [{"speaker": "Bob", "dia_id": "D2:1", "text": "later"}],
        "session_2_date_time": "9:00 am on 3 January, 2024",
        "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": "look", "blip_caption": "a photo of a cat"}],
        "session_1_date_time": "10:05 pm on 1 January, 2024",
        "session_3_date_time": "9:00 am on 9 January, 2024",
    }
    qa = [
        {"question": "Year?", "answer": 2024, "evidence": ["D1:1"], "category": 2},
        {"question": "Trap?", "adversarial_answer": "yes", "evidence": [], "category": 5},
    ]
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps([{"sample_id": "t-1", "conversation": conv, "qa": qa}]), encoding="utf-8")
    (loaded,) = load_locomo(str(path))
    assert [s.index for s in loaded.sessions] == [1, 2]
    assert loaded.sessions[0].date_time == datetime(2024, 1, 1, 22, 5)
    assert turn_text(loaded.sessions[0].turns[0]) == "Ann: look [shares a photo of a cat]"
    assert [q.answer for q in loaded.qa] == ["2024", UNANSWERABLE]
    assert loaded.qa[1].adversarial_answer == "yes"
