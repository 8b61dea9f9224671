"""normalize_messages: every accepted input shape and every rejected one."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from inferscale.errors import InvalidInputError
from inferscale.memory import Message, normalize_messages


def test_string_becomes_one_user_message() -> None:
    assert normalize_messages("I love tea") == [Message(role="user", content="I love tea")]


def test_single_dict() -> None:
    assert normalize_messages({"role": "assistant", "content": "Hello"}) == [Message("assistant", "Hello")]


def test_list_of_dicts_keeps_order_roles_and_names() -> None:
    msgs = normalize_messages(
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "I'm Maya", "name": "maya"},
            {"role": "assistant", "content": "Hi Maya"},
        ]
    )
    assert [m.role for m in msgs] == ["system", "user", "assistant"]
    assert msgs[1] == Message("user", "I'm Maya", name="maya")
    assert msgs[2].name is None


def test_tuple_and_message_instances_are_accepted() -> None:
    given = (Message("user", "a"), {"role": "assistant", "content": "b"})
    assert normalize_messages(given) == [Message("user", "a"), Message("assistant", "b")]
    assert normalize_messages(Message("user", "c")) == [Message("user", "c")]  # type: ignore[arg-type]


def test_content_is_kept_verbatim() -> None:
    assert normalize_messages("  spaced  ")[0].content == "  spaced  "


def test_message_is_frozen_and_renders_as_chat_dict() -> None:
    msg = Message("user", "x", name="n")
    with pytest.raises(AttributeError):
        msg.content = "y"  # type: ignore[misc]
    assert msg.as_chat_dict() == {"role": "user", "content": "x", "name": "n"}
    assert Message("user", "x").as_chat_dict() == {"role": "user", "content": "x"}


@pytest.mark.parametrize(
    ("messages", "needle"),
    [
        ("", "empty string"),
        ("   \n", "empty string"),
        ([], "empty list"),
        (42, "int"),
        (None, "NoneType"),
        ({"content": "x"}, "'role'"),
        ({"role": "user"}, "'content'"),
        ({}, "'role', 'content'"),
        ({"role": "bot", "content": "x"}, "role 'bot'"),
        ({"role": "user", "content": ["x"]}, "content[0] is 'x'"),
        ({"role": "user", "content": [{"type": "text", "text": 3}]}, "text part without a str 'text'"),
        ({"role": 3, "content": "x"}, "role 3"),
        ({"role": "bot", "content": None}, "role 'bot'"),
        # the bad-input fuzz's find: a role that is not hashable, with no content, raised TypeError
        ({"role": [], "content": None}, "role []"),
        ({"role": {"r": 1}, "content": None}, "role {'r': 1}"),
        ({"role": "user", "content": 5}, "content of type int"),
        ({"role": "user", "content": " \t"}, "empty content"),
        ({"role": "user", "content": "x", "name": ""}, "name ''"),
        ({"role": "user", "content": "x", "name": 7}, "name 7"),
        ([{"role": "user", "content": "ok"}, "plain string"], "messages[1] is a str"),
        ([{"role": "user", "content": "ok"}, {"role": "bot", "content": "x"}], "messages[1] has role 'bot'"),
        ([{"role": "user", "content": ""}], "messages[0] has empty content"),
        ([{"role": "user"}], "messages[0] lacks 'content'"),
    ],
)
def test_bad_input_names_the_value_and_the_expected_shape(messages: Any, needle: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        normalize_messages(messages)
    text = str(info.value)
    assert needle in text
    assert "expected" in text


def test_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="expected"):
        normalize_messages([{"role": "user", "content": ""}])


def test_an_agents_turns_are_taken_as_mem0_takes_them() -> None:
    """Mem0 skips an assistant turn that only calls tools, keeps tool results and joins text parts; the whole
    conversation was refused."""
    messages = normalize_messages(
        [
            {"role": "user", "content": "Weather in Porto?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
            {"role": "assistant", "function_call": {"name": "weather"}},
            {"role": "tool", "tool_call_id": "c1", "content": "Sunny"},
            {"role": "user", "content": [{"type": "text", "text": "I am"}, {"type": "image_url", "image_url": {}}]},
            {"role": "user", "content": [{"type": "image_url", "image_url": {}}]},
        ]
    )
    assert messages == [Message("user", "Weather in Porto?"), Message("tool", "Sunny"), Message("user", "I am")]
    assert normalize_messages({"role": "assistant", "content": "", "tool_calls": [{"id": "c2"}]}) == []


def test_a_message_without_content_is_skipped_and_a_developer_message_is_a_system_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Mem0 2.2.1 skips a message whose content is None, and OpenAI's newer models send their system instructions
    as ``developer`` messages; both made add() refuse the whole conversation."""
    with caplog.at_level(logging.WARNING, logger="inferscale.memory.messages"):
        messages = normalize_messages(
            [
                {"role": "developer", "content": "Answer briefly."},
                {"role": "user", "content": None},
                {"role": "user", "content": "I moved to Porto."},
                {"role": "assistant", "content": None, "refusal": "I can't help with that."},
            ]
        )
    assert messages == [Message("system", "Answer briefly."), Message("user", "I moved to Porto.")]
    assert [r.getMessage() for r in caplog.records] == [
        "messages[1] (user) has no content (None); it is skipped",
        "messages[3] (assistant) has no content (None); it is skipped",
    ]
    assert normalize_messages({"role": "user", "content": None}) == []
