"""Checks the bundled demo conversation (``inferscale/data/demo_conversation.json``) is well formed."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path
from typing import Any

import pytest

DEMO_PATH = Path(__file__).resolve().parents[2] / "inferscale" / "data" / "demo_conversation.json"


@pytest.fixture(scope="module")
def demo() -> dict[str, Any]:
    """The parsed demo conversation."""
    data: dict[str, Any] = json.loads(DEMO_PATH.read_text(encoding="utf-8"))
    return data


def _user_messages(demo: dict[str, Any]) -> list[str]:
    """Contents of every user turn, in order."""
    return [m["content"] for s in demo["sessions"] for m in s["messages"] if m["role"] == "user"]


def test_schema(demo: dict[str, Any]) -> None:
    """Top-level keys, ISO session dates in order, and roles/contents of every message."""
    assert demo["user_id"] == "maya"
    assert len(demo["sessions"]) >= 3
    dates = [date.fromisoformat(s["date"]) for s in demo["sessions"]]
    assert dates == sorted(dates)
    for session in demo["sessions"]:
        assert 4 <= len(session["messages"]) <= 8
        for message in session["messages"]:
            assert message["role"] in {"user", "assistant"}
            assert isinstance(message["content"], str) and message["content"].strip()
    total = sum(len(s["messages"]) for s in demo["sessions"])
    assert 16 <= total <= 24


def test_questions(demo: dict[str, Any]) -> None:
    """Exactly five questions, each with a short expected answer and a note."""
    questions = demo["questions"]
    assert len(questions) == 5
    for item in questions:
        assert set(item) == {"question", "expected", "note"}
        assert all(isinstance(item[key], str) and item[key].strip() for key in item)


def test_expected_answers_appear_in_user_turns(demo: dict[str, Any]) -> None:
    """Every expected answer is stated (case-insensitively) by the user somewhere."""
    user_text = [text.lower() for text in _user_messages(demo)]
    for item in demo["questions"]:
        expected = item["expected"].lower()
        assert any(expected in text for text in user_text), item


def test_changed_fact_expects_new_value(demo: dict[str, Any]) -> None:
    """The changed-fact question (city) expects the value stated last, not the earlier one."""
    question = next(q for q in demo["questions"] if "live" in q["question"].lower())
    user_text = [text.lower() for text in _user_messages(demo)]
    mentions = [i for i, text in enumerate(user_text) if question["expected"].lower() in text]
    earlier = [i for i, text in enumerate(user_text) if "lisbon" in text]
    assert question["expected"] == "Porto"
    assert earlier and min(earlier) < min(mentions)
